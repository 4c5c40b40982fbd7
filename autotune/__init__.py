"""autotune: hardware-aware, autotuning allreduce for data-parallel deep learning.

    import autotune
    autotune.init()
    out = autotune.allreduce(grad, name="fc1.weight", algorithm="oktopk", density=0.01)
"""
from importlib.metadata import PackageNotFoundError, version as _version

from .dispatch import (algorithm_instance, allreduce, communicator, decisions, forget, init,
                       print_decisions, resolve, synchronize)

try:
    __version__ = _version("autotune-collectives")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+src"

__all__ = ["__version__", "algorithm_instance", "allreduce", "communicator", "decisions",
           "forget", "init", "print_decisions", "resolve", "synchronize"]

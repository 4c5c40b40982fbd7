"""Input checks whose verdict stays on the device (``kernels/cuda/checks.cu``,
cupy only): a flag set by a kernel, read back by the caller when it chooses
(``collectives._validate.DeviceFlags``), never per call."""
from __future__ import annotations

import numpy as np

from ._cuda_build import kernel, on_input_device

_THREADS = 256
_MAX_BLOCKS = 1024  # enough to fill the largest GPUs; the grid strides beyond


@on_input_device
def flag_nonfinite(x, bit: int, mask, stream=None) -> None:
    """Set ``bit`` in the device word ``mask`` (uint64, on x's device) if the
    C-contiguous float32 / float64 array ``x`` holds NaN or Inf; enqueued on
    ``stream`` (default: the current stream), nothing read back."""
    n = x.size
    name = "flag_nonfinite_f32" if x.dtype == np.float32 else "flag_nonfinite_f64"
    kernel(name)((min(-(-n // (4 * _THREADS)), _MAX_BLOCKS),), (_THREADS,),
                 (x, np.int64(n), np.uint64(bit), mask), stream=stream)

"""Array-module dispatch: numpy for host arrays, cupy for device arrays.

cupy is imported only when a cupy array is actually seen, so a CPU-only
machine never imports it.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys

import numpy as np

_STREAM_ORDERED = contextvars.ContextVar("kernels_stream_ordered", default=False)


def array_module(x):
    """Return the array module (numpy or cupy) that owns ``x``."""
    if type(x).__module__.startswith("cupy"):
        return sys.modules["cupy"]
    return np


def is_device_array(x) -> bool:
    return type(x).__module__.startswith("cupy")


def index_dtype(n: int):
    """int32 indices unless the index space needs 64 bits (DESIGN.md)."""
    return np.int32 if n < 2**31 else np.int64


def cuda_kernels(x):
    """The hand-written CUDA kernels (``kernels._cuda``) when ``x`` is a cupy
    array, else None.  Importing them imports cupy, so this is the one place
    that decides when that happens."""
    if not is_device_array(x):
        return None
    from . import _cuda

    return _cuda


@contextlib.contextmanager
def stream_ordered():
    """Inside the block (this thread), exact top-k (``topk_select``,
    ``cap_selection``) never waits for the device: where it would read a
    candidate count back to the host (a stream synchronize), it reads its
    input twice more instead.  Threshold selection, Gaussiank's statistics and
    ``kth_magnitude`` still read back.  For callers that enqueue work behind
    other work they must not wait for, such as the DDP hook during the
    backward pass.  Results are the same."""
    token = _STREAM_ORDERED.set(True)
    try:
        yield
    finally:
        _STREAM_ORDERED.reset(token)


def is_stream_ordered() -> bool:
    return _STREAM_ORDERED.get()


def flag_nonfinite(x, bit: int, mask, stream=None) -> None:
    """Device arrays only: set ``bit`` in the one-word uint64 device array
    ``mask`` if the C-contiguous float32 / float64 ``x`` holds NaN or Inf, on
    ``stream`` (default: the current one), with no read-back
    (``kernels/cuda/checks.cu``)."""
    cuda_kernels(x).flag_nonfinite(x, bit, mask, stream)


def fast_float32(x):
    """``kernels._cuda`` when its float32 fast paths take ``x``, else None."""
    cu = cuda_kernels(x)
    if cu is None or x.dtype != np.float32 or not 0 < x.size < 2**31:
        return None
    return cu


def weak_threshold(x, threshold):
    """The threshold as NumPy compares it with ``x`` (NEP 50): a Python
    float / int is rounded to ``x``'s float dtype first.  Done explicitly so
    numpy and cupy agree whatever their promotion rules."""
    if isinstance(threshold, (int, float)) and not isinstance(threshold, bool) \
            and np.dtype(x.dtype).kind == "f":
        with np.errstate(over="ignore"):
            return np.dtype(x.dtype).type(threshold)
    return threshold

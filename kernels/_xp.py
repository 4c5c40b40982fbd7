"""Array-module dispatch: numpy for host arrays, cupy for device arrays.

cupy is imported only when a cupy array is actually seen, so a CPU-only
machine never imports it.
"""
from __future__ import annotations

import sys

import numpy as np


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

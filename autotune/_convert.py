"""Inputs in, outputs out: numpy, cupy and anything with ``__dlpack__`` (torch).

Tensors are viewed, not copied: a torch CPU tensor becomes a numpy view via
DLPack, a torch CUDA tensor a cupy view; the result is handed back as the
input's type on the input's device.
"""
from __future__ import annotations

import numpy as np


class Adapter:
    """Remembers how to give an array back in the caller's type and shape."""

    __slots__ = ("kind", "shape", "torch_dtype")

    def __init__(self, kind: str, shape, torch_dtype=None):
        self.kind = kind
        self.shape = tuple(shape)
        self.torch_dtype = torch_dtype

    def back(self, out):
        out = out.reshape(self.shape)
        if self.kind == "torch":
            import torch

            return torch.from_dlpack(out)
        return out


def as_array(x):
    """Return (array, Adapter): a numpy/cupy view of ``x`` and the way back."""
    mod = type(x).__module__
    if isinstance(x, np.ndarray):
        return x, Adapter("numpy", x.shape)
    if mod.startswith("cupy"):
        return x, Adapter("cupy", x.shape)
    if mod.startswith("torch"):
        if x.requires_grad:
            x = x.detach()
        if not x.is_contiguous():
            # keep the non-contiguity visible to validation rather than copying
            arr = x.numpy() if x.device.type == "cpu" else _cupy_from_dlpack(x)
            return arr, Adapter("torch", x.shape)
        if x.device.type == "cpu":
            return np.from_dlpack(x), Adapter("torch", x.shape)
        return _cupy_from_dlpack(x), Adapter("torch", x.shape)
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x), Adapter("numpy", getattr(x, "shape", ()))
    raise TypeError(f"allreduce: unsupported input type {type(x).__name__}; "
                    "pass a numpy array, a cupy array or a DLPack tensor (torch)")


def _cupy_from_dlpack(x):
    import cupy

    return cupy.from_dlpack(x)

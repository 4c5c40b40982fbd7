"""Inputs in, outputs out: numpy, cupy and anything with ``__dlpack__`` (torch).

Tensors are viewed, not copied: a torch CPU tensor becomes a numpy view via
DLPack, a torch CUDA tensor a cupy view; the result is handed back as the
input's type on the input's device.

Half-precision floats (float16; torch's bfloat16, which numpy and cupy do not
have) are the exception: they are widened to a float32 copy on their device,
reduced (and, by the sparse algorithms, kept in residuals) in float32, and the
result is rounded back to the input's dtype.  Accumulating error feedback in
half precision would lose the small values it exists to keep.
"""
from __future__ import annotations

import numpy as np


#: widened to float32 for the reduction (numpy / cupy dtype names and torch's)
HALF_DTYPES = ("float16", "bfloat16")


class Adapter:
    """Remembers how to give an array back in the caller's type and shape.

    ``source`` is the input's dtype name when it was widened (a half type),
    else None; ``contiguous`` then says whether the input itself was
    C-contiguous (a widened copy always is, so validation asks the adapter),
    and is None otherwise (validation looks at the array, a view of the input).
    """

    __slots__ = ("kind", "shape", "source", "contiguous", "_cast")

    def __init__(self, kind: str, shape, source: str | None = None, cast=None,
                 contiguous: bool | None = None):
        self.kind = kind
        self.shape = tuple(shape)
        self.source = source
        self.contiguous = contiguous
        self._cast = cast

    def back(self, out):
        out = out.reshape(self.shape)
        if self.kind == "torch":
            import torch

            out = torch.from_dlpack(out)
            return out if self._cast is None else out.to(self._cast)
        return out if self._cast is None else out.astype(self._cast)


def as_array(x):
    """Return (array, Adapter): a numpy/cupy view of ``x`` and the way back."""
    mod = type(x).__module__
    if isinstance(x, np.ndarray) or mod.startswith("cupy"):
        kind = "numpy" if isinstance(x, np.ndarray) else "cupy"
        if x.dtype.itemsize == 2 and x.dtype.name in HALF_DTYPES:
            return (x.astype(np.float32, order="C"),
                    Adapter(kind, x.shape, x.dtype.name, x.dtype, bool(x.flags.c_contiguous)))
        return x, Adapter(kind, x.shape)
    if mod.startswith("torch"):
        if x.requires_grad:
            x = x.detach()
        half = str(x.dtype).removeprefix("torch.")
        if half in HALF_DTYPES:
            import torch

            wide = x.to(torch.float32, memory_format=torch.contiguous_format)
            arr = np.from_dlpack(wide) if x.device.type == "cpu" else _cupy_from_dlpack(wide)
            return arr, Adapter("torch", x.shape, half, x.dtype, x.is_contiguous())
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

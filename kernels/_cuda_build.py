"""Compiling and launching the CUDA sources of ``kernels/cuda/`` (cupy only).

Each ``.cu`` file is compiled once per process and device with
``cupy.RawModule`` (NVRTC; cupy keeps the binary in its disk cache).  The
shared header ``common.cuh`` is found through ``-I``; cupy's cache key covers
the source text and the options but not included files, so the options carry
a digest of the headers: editing one recompiles every source.

Also here: the per-stream device workspaces and pinned read-back buffers the
launches share, the input preparation (flat, contiguous, 16-byte aligned
float32) and the float32 magnitude keys the selection kernels compare.
"""
from __future__ import annotations

import functools
import hashlib
import math
from pathlib import Path

import cupy as cp
import numpy as np

#: the CUDA sources, beside this module
SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
#: which source defines each kernel
KERNEL_SOURCES = {
    "select.cu": ("sel_thr8", "sel_topk8", "sel_topkx8", "sel_local8", "sel_stitch8"),
    "radix.cu": ("tk_hist", "tk_hist_add", "tk_find", "tk_small"),
    "gaussian.cu": ("gs_partial", "gs_finish", "gs_count1", "gs_count4", "gs_count16"),
    "sparse.cu": ("seg_sum_f32", "seg_sum_f64", "seg_scatter_add_i32", "seg_scatter_add_i64",
                  "zero_at_i32", "zero_at_i64", "add_into_f32"),
    "checks.cu": ("flag_nonfinite_f32", "flag_nonfinite_f64"),
}
_SOURCE_OF = {k: src for src, names in KERNEL_SOURCES.items() for k in names}

NOKEY = 0xFFFFFFFF      # a key no float32 magnitude has (keys are < 2**31)
NULL = np.uint64(0)     # a null pointer argument

#: compiled modules, per (device, source file)
_MODULES: dict[tuple[int, str], object] = {}
_FUNCS: dict[tuple[int, str], object] = {}
_SM_COUNT: dict[int, int] = {}


@functools.lru_cache(maxsize=None)
def _options() -> tuple[str, ...]:
    headers = hashlib.sha256()
    for h in sorted(SOURCE_DIR.glob("*.cuh")):
        headers.update(h.name.encode() + b"\0" + h.read_bytes())
    return ("--std=c++14", f"-I{SOURCE_DIR}", f"-DKERNELS_HEADERS_{headers.hexdigest()[:16]}")


def _module(source: str):
    key = (cp.cuda.runtime.getDevice(), source)
    mod = _MODULES.get(key)
    if mod is None:
        code = (SOURCE_DIR / source).read_text()
        mod = _MODULES[key] = cp.RawModule(code=code, options=_options())
    return mod


def kernel(name: str):
    """The compiled kernel ``name`` on the current device."""
    key = (cp.cuda.runtime.getDevice(), name)
    fn = _FUNCS.get(key)
    if fn is None:
        fn = _FUNCS[key] = _module(_SOURCE_OF[name]).get_function(name)
    return fn


def sm_count() -> int:
    dev = cp.cuda.runtime.getDevice()
    n = _SM_COUNT.get(dev)
    if n is None:
        n = _SM_COUNT[dev] = cp.cuda.Device(dev).attributes["MultiProcessorCount"]
    return n


def warm_up():
    """Compile (or load from cupy's disk cache) every kernel on the current device."""
    for name in _SOURCE_OF:
        kernel(name)


def on_input_device(fn):
    """Run ``fn`` with its first argument's device current (launches go there)."""
    @functools.wraps(fn)
    def wrapper(a, *args, **kw):
        with a.device:
            return fn(a, *args, **kw)
    return wrapper


# --------------------------------------------------------------------------
# Workspaces and read-backs
# --------------------------------------------------------------------------

class Workspace:
    """Device scratch zeroed per launch with one memset, and a pinned host
    buffer for read-backs, cached per (device, stream, purpose)."""

    __slots__ = ("buf", "words", "host")

    def __init__(self, words):
        self.words = words
        self.buf = cp.empty(words, dtype=cp.uint64)
        self.host = np.frombuffer(cp.cuda.alloc_pinned_memory(64), dtype=np.uint64, count=8)


_WS: dict[tuple[int, int, str], Workspace] = {}


def workspace(words: int, stream, purpose: str) -> Workspace:
    """At least ``words`` uint64 of scratch for ``purpose`` on ``stream``."""
    key = (cp.cuda.runtime.getDevice(), stream.ptr, purpose)
    ws = _WS.get(key)
    if ws is None or ws.words < words:
        ws = _WS[key] = Workspace(max(words, 2 * (ws.words if ws else 0), 1024))
    return ws


def read_back(ws: Workspace, dev_ptr: int, nbytes: int, stream):
    """Copy nbytes (<= 64) from the device to ws.host and wait for them."""
    cp.cuda.runtime.memcpyAsync(ws.host.ctypes.data, dev_ptr, nbytes,
                                cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
    stream.synchronize()
    return ws.host


# --------------------------------------------------------------------------
# Eligibility and threshold keys
# --------------------------------------------------------------------------

def aligned(a) -> bool:
    return a.data.ptr % 16 == 0


@on_input_device
def prepare(x):
    """A flat float32 array the kernels can read, copying only when needed."""
    x = x.reshape(-1) if x.flags.c_contiguous else cp.ascontiguousarray(x).reshape(-1)
    if not aligned(x):
        x = x.copy()
    return x


def threshold_key(threshold) -> int:
    """The 31-bit key k with ``|x| >= threshold  <=>  key(x) >= k`` for float32 x.

    Matches NumPy's comparison of a float32 array with the threshold: a
    Python float / int (weak scalar, NEP 50) is rounded to float32 first; a
    float64 NumPy scalar or 0-d array compares in float64, which for float32
    x is the same as comparing with the smallest float32 >= threshold.
    NaN selects nothing; a threshold <= 0 selects everything.
    """
    strong64 = (isinstance(threshold, (np.floating, np.ndarray, cp.ndarray))
                and np.dtype(threshold.dtype).itemsize > 4)
    t = float(threshold)
    if math.isnan(t):
        return NOKEY
    if abs(t) < 3e38:
        f = np.float32(t)
    else:
        with np.errstate(over="ignore"):  # rounds to +-inf (or to +-max) as numpy does
            f = np.float32(t)
    if strong64 and float(f) < t:
        f = np.nextafter(f, np.float32(np.inf))
    if f <= 0:
        return 0
    return int(f.view(np.uint32))


def key_to_float(key: int) -> float:
    return float(np.array(key, dtype=np.uint32).view(np.float32))

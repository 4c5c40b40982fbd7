"""Hand-written CUDA for the hot selection and sparse kernels (cupy only).

Imported lazily, the first time a cupy array reaches a kernel
(``_xp.cuda_kernels``): importing this module imports cupy.  Every function
here takes cupy arrays on one device and returns cupy arrays on that device;
the numpy-facing API in ``_select`` / ``_sparse`` decides when to call in here
(float32, contiguous, 16-byte aligned, fewer than 2**31 elements) and falls
back to the generic array-module code otherwise.  Results equal the numpy
path's: the same int32 indices and bitwise-equal values.

The CUDA sources live in ``kernels/cuda/`` (one concern per file, shared
device functions in ``common.cuh``) and are compiled once per process and
device (``_cuda_build``).  What runs where:

- threshold selection, index-ordered output, one pass with a decoupled
  look-back or two launches from n = 2^24: ``_cuda_select`` (``select.cu``);
- exact top-k and the k-th magnitude by radix select, small arrays in one
  block: ``_cuda_topk`` (``radix.cu``, and ``select.cu``'s tie-aware select);
- Gaussiank's float64 mean / std and threshold counts in a fixed order:
  ``_cuda_gauss`` (``gaussian.cu``);
- ``coo_sum``'s segmented sums and ``scatter_add`` in NumPy's order:
  ``_cuda_sparse`` (``sparse.cu``);
- NaN/Inf in an input, flagged on the device: ``_cuda_checks`` (``checks.cu``).

Measurements behind each choice: docs/BENCHMARKS.md, "GPU kernels" and its
subsections.
"""
from ._cuda_build import key_to_float, prepare, threshold_key, warm_up
from ._cuda_checks import flag_nonfinite
from ._cuda_gauss import count_at_least, count_at_least_many, mean_std
from ._cuda_select import threshold_select
from ._cuda_sparse import add_into, scatter_add_sorted, segment_sums, zero_at
from ._cuda_topk import cap_select, key_histogram, kth_key, kth_magnitude, topk_select

__all__ = [
    "add_into",
    "cap_select",
    "count_at_least",
    "count_at_least_many",
    "flag_nonfinite",
    "key_histogram",
    "key_to_float",
    "kth_key",
    "kth_magnitude",
    "mean_std",
    "prepare",
    "scatter_add_sorted",
    "segment_sums",
    "threshold_key",
    "threshold_select",
    "topk_select",
    "warm_up",
    "zero_at",
]

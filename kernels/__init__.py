"""Local computation: selection and sparse arithmetic on numpy or cupy arrays.

Pure functions; the array module comes from the input.  No communication here.
On cupy float32 arrays the hot paths (threshold selection, exact top-k,
Gaussiank's statistics, COO sum, scatter-add) run hand-written CUDA from
``kernels._cuda``, which is imported (and cupy with it) only when a cupy
array arrives; results equal the numpy path's (same indices, equal values).
"""
from ._select import (
    cap_selection,
    gaussian_select,
    gaussian_threshold,
    k_from_density,
    key_histogram,
    kth_magnitude,
    threshold_select,
    topk_indices,
    topk_select,
)
from ._sparse import (
    add_into,
    coo_sum,
    decode_indices,
    encode_indices,
    region_bounds,
    scatter_add,
    split_by_bounds,
    to_dense,
    zero_at,
)
from ._xp import array_module, flag_nonfinite, index_dtype, is_device_array, stream_ordered

__all__ = [
    "add_into",
    "array_module",
    "cap_selection",
    "coo_sum",
    "decode_indices",
    "encode_indices",
    "flag_nonfinite",
    "gaussian_select",
    "gaussian_threshold",
    "index_dtype",
    "is_device_array",
    "k_from_density",
    "key_histogram",
    "kth_magnitude",
    "region_bounds",
    "scatter_add",
    "split_by_bounds",
    "stream_ordered",
    "threshold_select",
    "to_dense",
    "topk_indices",
    "topk_select",
    "zero_at",
]

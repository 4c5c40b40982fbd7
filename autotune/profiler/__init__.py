"""``autotune profile``: measure this machine and write its profile.

Run under MPI (``mpiexec -n 4 autotune profile --quick`` or
``autotune profile --np 4 --quick``); every rank measures, rank 0 shows the
progress and writes the file.  Four parts, in this order:

1. **alpha/beta** of point-to-point (sendrecv, all rank pairs at once) and of
   the native collectives the algorithms use (allgather, allgatherv,
   alltoallv, allreduce, bcast), OSU-style over powers of two (the full plan
   also samples between them, :func:`primitive_sizes`): a warm-up call, then timed
   repeats each started after a barrier; small messages are timed in batches
   so the barrier's exit skew does not dominate; the repeats of all sizes
   are interleaved so a busy host's changing load hits every size alike.
   Each primitive is fitted to its model shape (autotune.profile: e.g.
   allreduce ``2a*ceil(log2 P) + 2b*m*(P-1)/P``) on the medians of repeats,
   minimising relative errors so the microsecond-scale small sizes count as
   much as the large ones (:func:`fit_linear`: plain, bisquare-reweighted or
   least-median, whichever predicts left-out sizes best).  Every third size
   is held out of the fit and the median relative error of the prediction
   on those sizes is recorded.
   On one CPU host the medium's **burst** comes next (:func:`measure_burst`):
   a shaped link's token bucket, which the algorithm runs then refill
   before each timed call; measured again, then warned about, while a busy
   host makes the exchange CPU-bound (:func:`burst_disturbed`).
2. **algorithm runs**: every registered algorithm (``collectives.ALGORITHMS``,
   iterated, so new ones are picked up) on heavy-tailed gradient-like data,
   on a grid of n and density, at P and at smaller process counts
   (sub-communicators of 2, 4, ... ranks; the ranks left out sleep).  Warm-up
   calls first so error feedback and reused thresholds are in steady state.
   Raw times per repeat, bytes sent (max over ranks) and the per-phase split
   are kept: the training data of the learned selector.
3. **local compute** on rank 0 alone (the others sleep): exact top-k,
   threshold selection, COO reduction and scatter-add, fitted as
   ``t = c0 + c1*n``.
4. **xi** (Li & Hoefler, PPoPP'22, Assumption 1), see :func:`assumption1_gap`,
   on real gradients: from a short data-parallel training run of a small MLP
   on scikit-learn's ``load_digits`` (each rank its shard), or from gradient
   snapshots given with ``--gradients DIR``.
"""
from __future__ import annotations

from .common import ProfilerError
from .driver import PLANS, _Progress, fingerprint, main, refit_main, run_profile
from .fits import (MAX_SEGMENTS, MIN_SIZES_PER_SEGMENT, _segmentation_loo, choose_segments,
                   fit_compute, fit_linear, fit_primitive, fit_segments, heldout_mask,
                   refit_profile)
from .measure import (algorithm_sizes, burst_disturbed, count_algorithm_steps, gradient_like,
                      idle_gap, measure_algorithms, measure_burst, measure_compute,
                      measure_primitives, primitive_sizes, process_counts)
from .xi import _XiTracker, assumption1_gap, load_gradient_dir, xi_from_files, xi_from_training

__all__ = ["PLANS", "ProfilerError", "assumption1_gap", "choose_segments", "fit_linear",
           "fit_primitive", "main", "refit_profile", "run_profile"]

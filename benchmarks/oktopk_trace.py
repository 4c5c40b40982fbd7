"""Record what Ok-Topk did on every call of a training run (a diagnostic).

    mpiexec -n 8 python -m benchmarks.oktopk_trace --trace out/trace \
        examples/lstm_lm.py --algorithm oktopk --density 0.001 --seed 0 \
        --warmup-steps 300 --density-warmup 600
    python -m benchmarks.oktopk_trace --summary out/trace --skip 600

Runs the given script in this process (``runpy``) with an observer
(``collectives.observe``) that keeps, for every Ok-Topk call, the call's
``last_stats`` plus the norms of the accumulated input (residual + x), the
output and the residual after the call; at exit each rank writes
``<trace>.r<rank>.json``.  ``--summary`` prints, from those files, the
per-call means over the calls after ``--skip`` (e.g. the warm-up): local
count m/k, global candidates/k, entries delivered G/k, how often the counts
fell below the band's 2k/3, and the delivered norm over the input's.
Behind docs/BENCHMARKS.md, "Twelve seeds at density 0.1%".

What it reads: from ``OkTopk.last_stats`` the keys ``iteration`` (the
tensor's call number), ``G`` (entries in the global result),
``global_candidates`` (reduced entries at or above the global threshold, all
regions), ``own`` (this rank's selections in its own region) and ``wanted``
(the entries it meant to send to the other regions' owners, before their
caps); from the tensor's ``SparseState`` (``algorithm.
state(name)``) ``k``, ``selected_local`` (m) and ``residual``.  The input's
norm needs the residual before the call: the observer keeps a host copy of
each tensor's residual from its previous call.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import runpy
import sys


def _install(prefix: str):
    """Observe every Ok-Topk call of this process; write the log at exit.
    Returns the observation handle."""
    import numpy as np

    import collectives

    log: list = []
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", 0)))
    before: dict = {}   # (id(algorithm), name) -> host residual after the previous call

    def host(a):
        return np.asarray(a.get() if hasattr(a, "get") else a)

    def record(call):
        if not isinstance(call.algorithm, collectives.OkTopk):
            return
        st = call.algorithm.state(call.name)
        key = (id(call.algorithm), call.name)
        prev = before.get(key)
        acc_in = host(call.x).astype(np.float64)
        if prev is not None:
            acc_in += prev
        residual = host(st.residual)
        before[key] = residual.astype(np.float64)
        s = call.stats
        log.append({"name": call.name, "it": s["iteration"], "k": st.k,
                    "m": st.selected_local, "G": s["G"],
                    "candidates": s["global_candidates"], "own": s["own"],
                    "wanted": s["wanted"], "norm_in": float(np.linalg.norm(acc_in)),
                    "norm_out": float(np.linalg.norm(host(call.out))),
                    "norm_residual": float(np.linalg.norm(residual))})

    handle = collectives.observe(record)

    def dump():
        with open(f"{prefix}.r{rank}.json", "w") as f:
            json.dump(log, f)

    atexit.register(dump)
    return handle


def summary(prefix: str, skip: int) -> str:
    import numpy as np

    with open(f"{prefix}.r0.json") as f:
        calls = json.load(f)[skip:]
    if not calls:
        return f"{prefix}: no calls after {skip}"
    k = np.array([c["k"] for c in calls], float)
    col = {key: np.array([c[key] for c in calls], float) for key in ("m", "candidates", "G")}
    ratio = np.array([c["norm_out"] / max(c["norm_in"], 1e-30) for c in calls])
    return (f"{prefix} (rank 0, {len(calls)} calls, mean k {k.mean():.1f}): "
            f"m/k {np.mean(col['m'] / k):.3f}, candidates/k {np.mean(col['candidates'] / k):.2f}, "
            f"G/k {np.mean(col['G'] / k):.3f}, m < 2k/3 in {np.mean(col['m'] < 2 * k / 3):.0%}, "
            f"candidates < 2k/3 in {np.mean(col['candidates'] < 2 * k / 3):.0%} of calls, "
            f"|out|/|acc| {ratio.mean():.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.oktopk_trace", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", help="write <TRACE>.r<rank>.json; the script and its "
                                    "arguments follow")
    ap.add_argument("--summary", help="summarize <SUMMARY>.r0.json instead")
    ap.add_argument("--skip", type=int, default=0, help="calls left out of the summary")
    argv = sys.argv[1:]
    cut = next((i for i, a in enumerate(argv) if a.endswith(".py")), len(argv))
    args, rest = ap.parse_args(argv[:cut]), argv[cut:]
    if args.summary:
        print(summary(args.summary, args.skip))
        return
    if not args.trace or not rest:
        ap.error("--trace PREFIX SCRIPT [ARGS...] (or --summary PREFIX)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(rest[0])))
    _install(args.trace)
    sys.argv = rest
    runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main()

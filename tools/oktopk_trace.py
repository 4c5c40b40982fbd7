"""Record what Ok-Topk did on every call of a training run (a diagnostic).

    mpiexec -n 8 python tools/oktopk_trace.py --trace out/trace \
        examples/lstm_lm.py --algorithm oktopk --density 0.001 --seed 0 \
        --warmup-steps 300 --density-warmup 600
    python tools/oktopk_trace.py --summary out/trace --skip 600

Runs the given script under this process (``runpy``) with ``OkTopk``'s
exchange wrapped, so every call's ``last_stats`` plus the norms of the
accumulated input, the output and the residual are kept; at exit each rank
writes ``<trace>.r<rank>.json``.  ``--summary`` prints, from those files,
the per-call means over the calls after ``--skip`` (e.g. the warm-up):
local count m/k, global candidates/k, entries delivered G/k, how often the
counts fell below the band's 2k/3, and the delivered norm over the input's.
Not part of the library: it patches a private method.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import runpy
import sys


def _install(prefix: str) -> None:
    import numpy as np

    from collectives import _oktopk

    log: list = []
    exchange = _oktopk.OkTopk._exchange

    def host(a):
        return a.get() if hasattr(a, "get") else a

    def traced(self, acc, st):
        norm_in = float(np.linalg.norm(host(acc)))
        out = exchange(self, acc, st)
        s = self.last_stats
        log.append({"it": s["iteration"], "k": st.k, "m": st.selected_local, "G": s["G"],
                    "candidates": s["global_candidates"], "own": s["own"],
                    "wanted": s["wanted"], "norm_in": norm_in,
                    "norm_out": float(np.linalg.norm(host(out))),
                    "norm_residual": float(np.linalg.norm(host(acc)))})
        return out

    _oktopk.OkTopk._exchange = traced

    def dump():
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", 0)))
        with open(f"{prefix}.r{rank}.json", "w") as f:
            json.dump(log, f)

    atexit.register(dump)


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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

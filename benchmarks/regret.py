"""Selector regret on measurements held out of its training.

The selector is trained on a profile's runs (``--profile``); it is then asked
to choose at every (n, P, density) of separately measured ``autotune bench``
sweeps (``--measured``, the held-out data), and the measured time of its
choice is divided by the measured time of the fastest algorithm there.
Strategies compared side by side: the learned selector, the bare cost model,
always-dense (Rabenseifner) and always-oktopk.

    python -m benchmarks.regret --profile profiles/X.json --measured a.json b.json

``--sets DIR`` scores every off-profile data set in DIR (``benchmarks/offprofile_set.sh``'s
files) for one network and profile P, each against the goal (geomean <= 1.05, worst <= 1.3),
with profiles made by plan variants cut back to the ``--quick`` plan's samples and refitted:

    python -m benchmarks.regret --sets docs/data/offprofile --network slow --profile-P 4
"""
from __future__ import annotations

import argparse
import math
from collections import defaultdict
from statistics import geometric_mean

from autotune.profile import Profile
from autotune.selector import Selector

from . import json_files, load_json


def load_points(paths):
    """{(n, P, density): {algorithm: seconds}} from sweeps; a point several sweeps
    measured (repeated sweeps of one grid) gets the geometric mean of their medians."""
    seen = defaultdict(lambda: defaultdict(list))
    for p in paths:
        for r in load_json(p)["rows"]:
            if r.get("median_s"):
                seen[(r["n"], r["P"], r["density"])][r["algorithm"]].append(r["median_s"])
    return defaultdict(dict, {k: {a: geometric_mean(v) for a, v in by.items()}
                              for k, by in seen.items()})


def evaluate(profile: dict, points, *, exclude=(), other=None):
    """Regret of each strategy at each point.  ``other``: points of another sweep
    of the same grid; its fastest algorithm at a point, scored with this sweep's
    times, is the noise floor (what a perfect selector trained on one measurement
    scores on another), reported as the strategy "other sweep's best"."""
    learned = Selector(profile)
    bare = Selector(profile, learn=False)
    regrets = {s: [] for s in ("learned selector", "cost model", "always dense", "always oktopk",
                               "other sweep's best")}
    rows = []
    for (n, P, d), times in sorted(points.items()):
        cands = [a for a in times if a in learned.algorithms and a not in exclude]
        if not cands:
            continue
        best = min(cands, key=times.get)
        picks = {
            "learned selector": learned.choose(n, P, d, candidates=cands).algorithm,
            "cost model": bare.choose(n, P, d, candidates=cands).algorithm,
            "always dense": "dense", "always oktopk": "oktopk",
        }
        theirs = (other or {}).get((n, P, d), {})
        theirs = [a for a in cands if a in theirs]
        if theirs:
            picks["other sweep's best"] = min(theirs, key=other[(n, P, d)].get)
        row = {"n": n, "P": P, "density": d, "best": best, "best_s": times[best]}
        for s, a in picks.items():
            if a not in times:
                continue
            r = times[a] / times[best]
            regrets[s].append(r)
            row[s] = (a, r)
        rows.append(row)
    summary = {s: (geometric_mean(v), max(v), len(v)) for s, v in regrets.items() if v}
    return rows, summary


def markdown(rows, summary) -> str:
    out = ["| strategy | geomean regret | worst regret | points |", "|---|---|---|---|"]
    for s, (g, w, k) in summary.items():
        out.append(f"| {s} | {g:.3f} | {w:.2f} | {k} |")
    out += ["", "| P | n | density | best (measured) | learned pick (regret) | cost-model pick (regret) |",
            "|---|---|---|---|---|---|"]
    for r in rows:
        lp = r.get("learned selector", ("-", float("nan")))
        cp = r.get("cost model", ("-", float("nan")))
        out.append(f"| {r['P']} | 2^{int(math.log2(r['n']))} | {r['density']} | {r['best']} | "
                   f"{lp[0]} ({lp[1]:.2f}) | {cp[0]} ({cp[1]:.2f}) |")
    return "\n".join(out)


# -- every off-profile data set of a directory ---------------------------------------
GOAL = (1.05, 1.3)  # issue #23: geomean, worst regret per set
_SWEEP_TAG = {"shm": "shm", "slow": "slowgap"}  # the sweeps' file tag per network


def as_quick(data: dict) -> dict:
    """A profile cut back to the ``--quick`` plan's samples (runs at its algorithm
    sizes, primitive samples at its message sizes, kernels at its compute sizes) and
    refitted: profiles made by plan variants are scored as the plan users run would
    have made them."""
    import copy

    from autotune.profiler.driver import PLANS
    from autotune.profiler.fits import refit_profile
    from autotune.profiler.measure import compute_elems, compute_sizes

    plan = PLANS["quick"]
    sizes = {1 << e for e in plan["algo_log2n"]}
    nbytes = {1 << e for e in plan["log2_bytes"]}
    elems = {compute_elems(e) for e in compute_sizes(plan, data["compute"].get("device", "cpu"))}
    runs = [r for r in data["runs"] if r["n"] in sizes]
    extra = [rec for rec in data["primitives"].values()
             if any(x["bytes"] not in nbytes for x in rec.get("samples") or [])]
    timed = data["compute"].get("samples") or []
    kernels = [s for s in timed if s["n"] in elems]
    if len(runs) == len(data["runs"]) and not extra and len(kernels) == len(timed):
        return data
    data = copy.deepcopy(data)
    data["runs"] = runs
    for rec in data["primitives"].values():
        rec["samples"] = [x for x in rec.get("samples") or [] if x["bytes"] in nbytes]
    data["compute"]["samples"] = kernels
    return refit_profile(Profile(data)).data


def score_sets(directory, network: str, profile_P: int):
    """[(set name, (geomean, worst, points), rows)] of every set in ``directory``
    with a profile at ``profile_P`` on ``network`` and sweeps of it."""
    from pathlib import Path

    d, tag = Path(directory), _SWEEP_TAG[network]
    out = []
    for prof_path in json_files(d, f"*_prof{profile_P}_{network}_p{profile_P}"):
        name = prof_path.name.split("_")[0]
        if prof_path.name.split(".")[0] != f"{name}_prof{profile_P}_{network}_p{profile_P}":
            continue  # a variant's profile of the set (``NAME_head_prof4_...``)
        sweeps = json_files(d, f"{name}[ab]_{tag}_p*")
        if not sweeps:
            continue
        rows, summary = evaluate(as_quick(Profile.load(prof_path).data), load_points(sweeps))
        out.append((name, summary["learned selector"], rows))
    return out


def sets_markdown(scored) -> str:
    """Each set's learned-selector regret, its cells above 1.15, and the count that met the goal."""
    out = ["| set | geomean / worst | points above 1.15: P, n, pick (best) regret |",
           "|---|---|---|"]
    met, every = 0, []
    for name, (g, w, _), rows in scored:
        ok = g <= GOAL[0] and w <= GOAL[1]
        met += ok
        every += [r["learned selector"][1] for r in rows if "learned selector" in r]
        bad = "; ".join(f"{r['P']}, {r['n']}, {r['learned selector'][0]} ({r['best']}) "
                        f"{r['learned selector'][1]:.2f}" for r in rows
                        if r.get("learned selector", ("", 0))[1] > 1.15)
        mark = "" if ok else "**"
        out.append(f"| {name} | {mark}{g:.3f} / {w:.2f}{mark} | {bad} |")
    if every:
        out += ["", f"met {met} of {len(scored)} sets; pooled over their points: geomean "
                    f"{geometric_mean(every):.4f}, worst {max(every):.2f} ({len(every)} points)"]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.regret", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile")
    ap.add_argument("--measured", nargs="+")
    ap.add_argument("--sets", metavar="DIR", help="score every off-profile data set in DIR "
                    "(with --network and --profile-P) instead of one --profile")
    ap.add_argument("--network", choices=sorted(_SWEEP_TAG), default="shm")
    ap.add_argument("--profile-P", type=int, default=4)
    ap.add_argument("--exclude", default="", help="algorithms to leave out (comma-separated)")
    ap.add_argument("--off-grid", action="store_true",
                    help="score only points whose (n, P, density) the profile never ran "
                         "(a separate measurement of a training configuration is not held out)")
    ap.add_argument("--noise-from", nargs="+", metavar="SWEEP",
                    help="another measurement of the same grid: its fastest algorithm at each "
                         "point, scored with --measured's times, gives the noise floor")
    ap.add_argument("--cv-baseline", metavar="NAME",
                    help="leave-one-size-out cross-validation on the --measured sweeps alone, "
                         "network terms fitted from the NAME (native) and dense rows, compute "
                         "costs from --profile (used for NCCL, which the profiler does not measure)")
    args = ap.parse_args(argv)
    if args.sets:
        print(sets_markdown(score_sets(args.sets, args.network, args.profile_P)))
        return 0
    if not (args.profile and args.measured):
        ap.error("--profile and --measured are required without --sets")
    prof = Profile.load(args.profile).data
    if args.cv_baseline:
        rows, summary = cross_validate(prof, args.measured, args.cv_baseline)
    else:
        points = load_points(args.measured)
        if args.off_grid:
            seen = {(r["n"], r["P"], r.get("density")) for r in prof.get("runs", [])}
            points = {key: v for key, v in points.items() if key not in seen}
        other = load_points(args.noise_from) if args.noise_from else None
        rows, summary = evaluate(prof, points, other=other,
                                 exclude=[a for a in args.exclude.split(",") if a])
    print(markdown(rows, summary))
    return 0


# -- leave-one-size-out cross-validation on bench sweeps alone ---------------------
def _fit(xs, ts):
    """Least squares t = a*x0 + b*x1 with relative-error weights, a, b >= 0."""
    import numpy as np

    X = np.asarray(xs, dtype=float)
    t = np.asarray(ts, dtype=float)
    w = 1.0 / t
    coef, *_ = np.linalg.lstsq(X * w[:, None], t * w, rcond=None)
    return [max(float(c), 0.0) for c in coef]


def profile_from_bench(base: dict, rows, baseline: str) -> dict:
    """A profile whose network terms are fitted from bench rows of the native
    allreduce (``baseline``) and of Rabenseifner (``dense``, p2p-based), and
    whose compute costs come from ``base`` (a profile measured on the same
    device); ``runs`` are the rows themselves.  For a backend the profiler did
    not measure primitives on (NCCL), this is the cost model's only input.
    """
    import copy

    lg = lambda P: math.ceil(math.log2(P))  # noqa: E731
    ar = [r for r in rows if r["algorithm"] == baseline]
    a, b = _fit([[2 * lg(r["P"]), 2 * 4 * r["n"] * (r["P"] - 1) / r["P"]] for r in ar],
                [r["median_s"] for r in ar])
    dn = [r for r in rows if r["algorithm"] == "dense" and r["P"] & (r["P"] - 1) == 0]
    pa, pb = _fit([[2 * lg(r["P"]), 2 * 4 * r["n"] * (r["P"] - 1) / r["P"]] for r in dn],
                  [r["median_s"] for r in dn])
    prof = copy.deepcopy(base)
    link = lambda al, be: {"alpha_s": al, "beta_s_per_byte": be}  # noqa: E731
    prof["primitives"] = {"p2p": link(pa, pb), "allreduce": link(a, b), "allgather": link(pa, pb),
                          "alltoallv": link(pa, pb), "bcast": link(pa, pb)}
    prof["runs"] = [dict(r, algorithm=("mpi" if r["algorithm"] == baseline else r["algorithm"]))
                    for r in rows]
    return prof


def cross_validate(base: dict, paths, baseline: str = "nccl"):
    """Leave one n out: fit on the other sizes, choose at the held-out size."""
    rows = [r for p in paths for r in load_json(p)["rows"]]
    sizes = sorted({r["n"] for r in rows})
    all_rows, regrets = [], defaultdict(list)
    for n in sizes:
        train = [r for r in rows if r["n"] != n]
        test = [r for r in rows if r["n"] == n]
        prof = profile_from_bench(base, train, baseline)
        pts = defaultdict(dict)
        for r in test:
            a = "mpi" if r["algorithm"] == baseline else r["algorithm"]
            pts[(r["n"], r["P"], r["density"])][a] = r["median_s"]
        got, _ = evaluate(prof, pts)
        for row in got:  # report the native algorithm under its own name
            for key, val in list(row.items()):
                if val == "mpi":
                    row[key] = baseline
                elif isinstance(val, tuple) and val[0] == "mpi":
                    row[key] = (baseline, val[1])
            for s in ("learned selector", "cost model", "always dense", "always oktopk"):
                if s in row:
                    regrets[s].append(row[s][1])
        all_rows += got
    summary = {s: (geometric_mean(v), max(v), len(v)) for s, v in regrets.items()}
    return all_rows, summary


if __name__ == "__main__":
    raise SystemExit(main())

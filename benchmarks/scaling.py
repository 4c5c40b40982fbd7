"""Scaling study: weak scaling measured at P = 2..32, the cost model's error on
those points, and a projection to P = 256 with the Piz Daint profile.

Subcommands (outside MPI; ``measure`` launches the ranks itself):

    # weak scaling (n elements per rank, P grows), every MPI algorithm, raw rows
    python -m benchmarks.scaling measure --network plain --np 2,3,4,6,8,12,16,24,32 \\
        --log2n 20,22,24 --budget 240 --profile-np 4 --out scaling_plain.json
    # the same on the 1 Gbit/s namespace (root, `ip` and `tc` needed; exit 3 if unavailable)
    python -m benchmarks.scaling measure --network slow --setup-netns scalenet \\
        --log2n 18,20 --repeat 3 --warmup 1 --profile-np 2 --out scaling_slow.json
    # the cost model on every measured point (profile: --profile, else the embedded one)
    python -m benchmarks.scaling model scaling_plain.json scaling_slow.json --max-P 8
    # the model error's noise floor: sweeps of the same points scored against each other
    python -m benchmarks.scaling noise scaling8_plain.json scaling9_plain.json ... --max-P 8
    # Piz Daint projection for the paper's models, P = 16..256, with an error band
    python -m benchmarks.scaling project --band-from profile.json
    # PNGs (docs/img/scaling_*.png; the projection with its band) and the markdown tables
    python -m benchmarks.scaling plot scaling_plain.json scaling_slow.json --outdir docs/img \\
        --band-from profile.json
    python -m benchmarks.scaling report scaling_plain.json scaling_slow.json

``measure`` runs ``autotune bench``'s ``sweep`` once per P under ``mpiexec -n P``
(``--oversubscribe`` beyond the cores), optionally after ``autotune profile
--quick`` at ``--profile-np`` ranks (killed after ``--profile-share`` of the
budget), and writes ONE JSON file: the rows of every P, the profile, what was
skipped.  ``--budget`` bounds the sweep: a P whose estimate (the previous P's,
scaled by the ratio of P) does not fit is skipped, a launch still running at
the end is killed.

On ``--network slow`` every rank shares ONE rate-limited loopback, so the
time is roughly total bytes / 125 MB/s: a dense allreduce of 2^20 floats at
P = 32 moves 2n(P-1)*4 B = 260 MB, about 2 s per call.  Keep n small there.

``model``: each point's error with *Table 1* alone (the profile without its
runs), *fitted* (with them: weights, fixed costs, bandwidth law) and as the
*selector* predicts it (fitted, with the correction it learned from the runs,
fading beyond their process counts), and how often the selector's error band
covered the fitted prediction; then the profile's own runs scored as the
prediction at the points they share (``runs_as_prediction``: how far the
machine moved between profile and study).  The projection and its band:
benchmarks/projection.py.

No optuna or matplotlib needed to measure; plots are drawn where the JSON is read.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from autotune import costmodel
from autotune.launch import cores, mpiexec_argv, one_host_env
from autotune.profile import Profile
from collectives import ALGORITHMS

from . import load_json

# the projection lives in its own module; its names stay importable from here
from .projection import (ALGO_ORDER, DAINT, PAPER_MODELS, PAPER_REPORTED,  # noqa: F401
                         PROJECT_P, machine_at, project, projection_table)

DEFAULT_NP = "2,3,4,6,8,12,16,24,32"
DEFAULT_LOG2N = {"plain": "20,22,24", "slow": "18,20"}
SLOW_NETNS_QDISC = "tbf rate 1gbit burst 1mb latency 500ms"
SLOW_MPI_ENV = {"OMPI_MCA_btl": "tcp,self", "OMPI_MCA_btl_tcp_if_include": "lo",
                "OMPI_MCA_pml": "ob1"}

def _color(algo: str):
    import matplotlib.pyplot as plt

    i = ALGO_ORDER.index(algo) if algo in ALGO_ORDER else len(ALGO_ORDER)
    return plt.cm.tab10(i % 10)


# -- measure -----------------------------------------------------------------------
def _launch_argv(P: int, argv: list[str], *, mpiexec: str | None, netns: str | None) -> list[str]:
    """mpiexec -n P [--oversubscribe --bind-to none] argv (``autotune.launch``), with
    ``mpiexec`` instead of the launcher's own if given, inside ``netns`` if given."""
    cmd = mpiexec_argv(P, [])
    if mpiexec:
        cmd[0] = mpiexec
    if P > cores():
        cmd += ["--bind-to", "none"]
    cmd += argv
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    return cmd


def _portable(cmd: list[str], tmpdir: str | None = None) -> list[str]:
    """The argv as recorded: interpreter and launcher by name, temporary files
    as <tmp>/..., not by this machine's paths."""
    out = []
    for a in cmd:
        if tmpdir and a.startswith(tmpdir):
            out.append("<tmp>" + a[len(tmpdir):])
        elif a == sys.executable:
            out.append("python")
        elif os.sep in a and os.path.basename(a) in ("mpiexec", "mpirun"):
            out.append(os.path.basename(a))
        else:
            out.append(a)
    return out


def _run(cmd, env, timeout_s: float) -> tuple[int, float]:
    """Run ``cmd`` in its own process group; kill the group on timeout.  (rc, seconds)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        rc = p.wait(timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        rc = 124
    return rc, time.perf_counter() - t0


class NetnsUnavailable(RuntimeError):
    """The 1 Gbit/s namespace cannot be made here (not root, no ip/tc, not permitted)."""


def setup_netns(name: str) -> None:
    """Create namespace ``name`` with a 1 Gbit/s token bucket on its loopback
    (../shared/MACHINES.md's recipe).  Raises NetnsUnavailable with the reason."""
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise NetnsUnavailable(f"{' and '.join(missing)} not installed")
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise NetnsUnavailable("creating a network namespace needs root")
    steps = [["ip", "netns", "add", name],
             ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
             ["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root",
              *SLOW_NETNS_QDISC.split()]]
    for s in steps:
        r = subprocess.run(s, capture_output=True, text=True)
        if r.returncode:
            if s[2] != "add" or s[1] != "netns":
                teardown_netns(name)
            raise NetnsUnavailable(f"`{' '.join(s)}` failed: {r.stderr.strip() or r.returncode}")


def teardown_netns(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def measure(*, network: str, nps, sizes, density: float, repeat: int, warmup: int,
            budget_s: float, algorithms: str, out: str, profile_np: int | None = None,
            profile_max_bytes: str | None = None, profile_share: float = 0.4,
            mpiexec: str | None = None, netns: str | None = None) -> dict:
    """Launch one bench sweep per P and merge the rows into one result dict (written to ``out``)."""
    env = one_host_env({**os.environ, **(SLOW_MPI_ENV if network == "slow" else {})})
    t_start = time.perf_counter()
    result = {
        "study": "scaling", "network": network, "density": density, "sizes": list(sizes),
        "process_counts": list(nps), "repeat": repeat, "warmup": warmup, "budget_s": budget_s,
        "cores": cores(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_start": list(os.getloadavg()), "netns": netns,
        "timing": "autotune.bench.sweep: median of `repeat` calls after `warmup`, each after a "
                  "barrier, slowest rank; n elements (float32) per rank",
        "rows": [], "skipped": [], "launches": [], "profile": None,
    }

    def save():
        result["elapsed_s"] = time.perf_counter() - t_start
        result["loadavg_end"] = list(os.getloadavg())
        tmp = f"{out}.tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, out)

    with tempfile.TemporaryDirectory() as d:
        if profile_np:
            pout = os.path.join(d, "profile.json")
            argv = [sys.executable, "-m", "autotune.cli", "profile", "--quick", "--quiet",
                    "--network", "tcp-1gbit" if network == "slow" else "shm", "--out", pout]
            if profile_max_bytes:
                argv += ["--max-bytes", profile_max_bytes]
            cmd = _launch_argv(profile_np, argv, mpiexec=mpiexec, netns=netns)
            print(f"scaling: profile at P={profile_np}: {' '.join(_portable(cmd, d))}", flush=True)
            # at most profile_share of the budget, so that the sweep itself always gets time
            rc, el = _run(cmd, env, profile_share * budget_s)
            result["launches"].append({"what": "profile", "P": profile_np, "rc": rc,
                                       "seconds": el, "argv": _portable(cmd, d)})
            if rc == 0:
                with open(pout) as f:
                    result["profile"] = json.load(f)
            else:
                why = "over its share of the budget" if rc == 124 else f"exit status {rc}"
                print(f"scaling: profile failed ({why}); continuing without it", file=sys.stderr)
        last = None  # (P, seconds) of the last completed launch
        for P in nps:
            elapsed = time.perf_counter() - t_start
            left = budget_s - elapsed
            est = last[1] * P / last[0] if last else 0.0
            if left <= 0 or est > left:
                why = (f"budget: {elapsed:.0f} s of {budget_s:.0f} s used, P={P} estimated "
                       f"{est:.0f} s")
                result["skipped"].append({"P": P, "reason": why})
                print(f"scaling: skip P={P} ({why})", flush=True)
                continue
            rows_out = os.path.join(d, f"rows_P{P}.json")
            argv = [sys.executable, "-m", "benchmarks.scaling", "_rank",
                    "--log2n", ",".join(str(int(math.log2(n))) for n in sizes),
                    "--density", str(density), "--repeat", str(repeat), "--warmup", str(warmup),
                    "--json", rows_out]
            if algorithms:
                argv += ["--algorithms", algorithms]
            cmd = _launch_argv(P, argv, mpiexec=mpiexec, netns=netns)
            load0 = os.getloadavg()[0]
            rc, el = _run(cmd, env, left)
            result["launches"].append({"what": "sweep", "P": P, "rc": rc, "seconds": el,
                                       "loadavg_1min": [load0, os.getloadavg()[0]],
                                       "oversubscribed": P > cores(), "argv": _portable(cmd, d)})
            if rc == 0:
                with open(rows_out) as f:
                    result["rows"] += json.load(f)
                last = (P, el)
                print(f"scaling: P={P} done in {el:.1f} s", flush=True)
            else:
                why = "killed at the end of the budget" if rc == 124 else f"exit status {rc}"
                result["skipped"].append({"P": P, "reason": why})
                print(f"scaling: P={P} failed ({why})", file=sys.stderr, flush=True)
            save()
    save()
    return result


def rank_main(args) -> int:
    """Under MPI: one bench sweep at this P; rank 0 writes the rows."""
    import collectives
    from collectives import ALGORITHMS

    from autotune.bench import sweep

    comm = collectives.MPICommunicator()
    if args.algorithms:
        algos = [a for a in args.algorithms.split(",") if a]
    else:
        algos = [a for a, c in ALGORITHMS.items() if c.supports(comm)]
    unknown = [a for a in algos if a not in ALGORITHMS]
    if unknown:
        if comm.rank == 0:
            print(f"unknown algorithm(s) {unknown}; registered: {sorted(ALGORITHMS)}",
                  file=sys.stderr)
        return 2
    sizes = [1 << int(e) for e in args.log2n.split(",")]

    def progress(r):
        if comm.rank == 0:
            print(f"  P={r['P']} n=2^{int(math.log2(r['n']))} {r['algorithm']:10s} "
                  f"{1e3 * r['median_s']:10.2f} ms", flush=True)

    # sequential, as the stored P = 2..32 runs were measured (one algorithm's state at a time)
    rows = sweep(comm, sizes, algos, args.density, args.repeat, args.warmup, progress=progress,
                 order="sequential")
    if comm.rank == 0:
        with open(args.json, "w") as f:
            json.dump(rows, f)
    return 0


# -- model -------------------------------------------------------------------------
def load_results(path) -> dict:
    res = load_json(path)
    if res.get("study") != "scaling" or "rows" not in res:
        raise ValueError(f"{path}: not a scaling-study result (no study='scaling' / rows)")
    return res


def scored_rows(rows, max_P: int | None = None) -> list[dict]:
    """The measured rows a model can be scored on: registered algorithms, up to ``max_P``."""
    return [r for r in rows if r["algorithm"] in ALGORITHMS and not (max_P and int(r["P"]) > max_P)]


def model_errors(rows, prof: dict, *, max_P: int | None = None) -> list[dict]:
    """Per measured row (up to ``max_P``): the cost model's prediction with
    Table 1's terms alone and fitted to the profile's runs, the selector's own
    prediction (the fitted model with the correction it learned from the runs,
    ``Selector.predict``; the fitted model's where it has none), the relative
    errors |pred - measured| / measured, and whether the selector's error band
    covered the fitted model's prediction."""
    from autotune.selector import Selector

    Profile(prof)  # validates the schema: one clear ProfileError per problem
    sel = Selector(prof) if prof.get("runs") else None
    fitted = sel.machine if sel else machine_at(prof)  # one fit of the profile
    table1 = machine_at(prof, runs=False)
    out = []
    for r in scored_rows(rows, max_P):
        a, P = r["algorithm"], int(r["P"])
        meas = float(r["median_s"])
        p_fit = costmodel.predict(fitted, a, r["n"], P, r["density"])
        p_t1 = costmodel.predict(table1, a, r["n"], P, r["density"])
        known = sel is not None and a in sel.algorithms
        p_sel = sel.predict(a, r["n"], P, r["density"])[0] if known else p_fit
        band = sel.error(a, r["n"], P) if known else None
        out.append({"algorithm": a, "n": r["n"], "P": P, "density": r["density"],
                    "measured_s": meas, "pred_fitted_s": p_fit, "pred_table1_s": p_t1,
                    "pred_selector_s": p_sel,
                    "err_fitted": abs(p_fit - meas) / meas, "err_table1": abs(p_t1 - meas) / meas,
                    "err_selector": abs(p_sel - meas) / meas,
                    "covered": None if band is None else abs(math.log(p_fit / meas)) <= band})
    return out


def error_summary(errs) -> dict:
    """{algorithm or 'all': (median err fitted, median err Table 1, points, share of
    points inside the selector's error band or nan, median err of the selector's
    own prediction)}."""
    by = defaultdict(list)
    for e in errs:
        by[e["algorithm"]].append(e)
        by["all"].append(e)
    out = {}
    for a, v in by.items():
        cov = [e["covered"] for e in v if e["covered"] is not None]
        out[a] = (float(np.median([e["err_fitted"] for e in v])),
                  float(np.median([e["err_table1"] for e in v])), len(v),
                  float(np.mean(cov)) if cov else math.nan,
                  float(np.median([e["err_selector"] for e in v])))
    return out


def sweep_noise(results, *, max_P: int | None = None) -> list[float]:
    """The model error's noise floor: for every pair of sweeps, the median over
    the points both measured (up to ``max_P``) of |t_i - t_j| / t_j -- what a
    model that predicted one sweep exactly would score on the other."""
    sweeps = [{(r["algorithm"], int(r["n"]), int(r["P"])): float(r["median_s"])
               for r in scored_rows(res["rows"], max_P)} for res in results]
    out = []
    for i, a in enumerate(sweeps):
        for b in sweeps[i + 1:]:
            common = sorted(a.keys() & b.keys())
            if common:
                out.append(float(np.median([abs(a[k] - b[k]) / b[k] for k in common])))
    return out


def runs_as_prediction(rows, prof: dict, *, max_P: int | None = None) -> tuple[float, int] | None:
    """The profile's own runs scored as predictions: over the measured points (up
    to ``max_P``) that the profile also ran (same algorithm, n, P and density), the
    median |measured - profile's run| / profile's run and the number of such points
    (None without any).  A model that reproduced its profile's runs exactly would
    score that there: how far the machine moved between profile and study (a fit
    over many runs can score lower)."""
    ran = {(r["algorithm"], int(r["n"]), int(r["P"]), r.get("density")): float(r["median_s"])
           for r in prof.get("runs") or []}
    diffs = []
    for r in scored_rows(rows, max_P):
        t = ran.get((r["algorithm"], int(r["n"]), int(r["P"]), r.get("density")))
        if t is None and not ALGORITHMS[r["algorithm"]].lossy:  # a lossless run has no density
            t = ran.get((r["algorithm"], int(r["n"]), int(r["P"]), None))
        if t:
            diffs.append(abs(float(r["median_s"]) - t) / t)
    return (float(np.median(diffs)), len(diffs)) if diffs else None


def _profile_for(res: dict, override: dict | None) -> dict:
    prof = override if override is not None else res.get("profile")
    if prof is None:
        raise ValueError(f"the {res['network']} results carry no profile (measure ran without "
                         "--profile-np or it failed): pass --profile FILE")
    return prof


# -- tables ------------------------------------------------------------------------
def _algos(rows):
    present = {r["algorithm"] for r in rows}
    return [a for a in ALGO_ORDER if a in present] + sorted(present - set(ALGO_ORDER))


def measured_table(res: dict) -> str:
    rows = res["rows"]
    algos = _algos(rows)
    by = {(r["n"], r["P"], r["algorithm"]): r for r in rows}
    lines = [f"Network: {res['network']}, density {res['density']}, cells: median ms "
             f"(speedup over dense), {res['cores']} cores, started {res['started']}, "
             f"load {res['loadavg_start'][0]:.2f} -> {res.get('loadavg_end', [float('nan')])[0]:.2f}",
             "", "| n | P | " + " | ".join(algos) + " |", "|---|---|" + "---|" * len(algos)]
    for n in sorted({r["n"] for r in rows}):
        for P in sorted({r["P"] for r in rows if r["n"] == n}):
            d = by.get((n, P, "dense"))
            cells = []
            for a in algos:
                r = by.get((n, P, a))
                if r is None:
                    cells.append("")
                elif d:
                    cells.append(f"{1e3 * r['median_s']:.2f} ({d['median_s'] / r['median_s']:.2f}x)")
                else:
                    cells.append(f"{1e3 * r['median_s']:.2f}")
            lines.append(f"| 2^{int(math.log2(n))} | {P} | " + " | ".join(cells) + " |")
    for s in res.get("skipped", []):
        lines.append(f"\nSkipped P={s['P']}: {s['reason']}")
    return "\n".join(lines)


def error_table(summaries: dict) -> str:
    """summaries: {network: error_summary(...)}."""
    nets = list(summaries)
    algos = [a for a in ALGO_ORDER if any(a in s for s in summaries.values())] + ["all"]
    lines = ["Cost model median relative error |predicted - measured| / measured "
             "(fitted to the profile's runs / Table 1 terms alone / the selector's prediction, "
             "the fitted model with its learned correction; points; fitted inside the "
             "selector's error band)", "",
             "| algorithm | " + " | ".join(nets) + " |", "|---|" + "---|" * len(nets)]
    for a in algos:
        cells = []
        for net in nets:
            v = summaries[net].get(a)
            cov = "" if v is None or math.isnan(v[3]) else f", {100 * v[3]:.0f}% in band"
            cells.append("" if v is None else
                         f"{100 * v[0]:.0f}% / {100 * v[1]:.0f}% / {100 * v[4]:.0f}% ({v[2]}{cov})")
        name = "**all**" if a == "all" else a
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- plots -------------------------------------------------------------------------
def _pyplot():
    """matplotlib.pyplot on the headless backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(count: int, rows: int = 1):
    """A headless figure with ``rows`` x ``count`` panels: (figure, axes grid)."""
    return _pyplot().subplots(rows, count, figsize=(5 * count, 4.2 * rows), squeeze=False)


def _log_panel(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_measured(res: dict, outdir, prof: dict | None = None) -> Path:
    """Measured median time vs P, one panel per n, one line per algorithm;
    dashed: the cost model fitted to the profile's runs, when a profile is given."""
    rows = res["rows"]
    sizes = sorted({r["n"] for r in rows})
    algos = _algos(rows)
    fig, (axes,) = _panels(len(sizes))
    colors = {a: _color(a) for a in algos}
    M = machine_at(prof) if prof is not None else None
    for ax, n in zip(axes, sizes):
        for a in algos:
            pts = sorted((r["P"], r["median_s"]) for r in rows if r["n"] == n and r["algorithm"] == a)
            if not pts:
                continue
            P, t = zip(*pts)
            ax.plot(P, np.array(t) * 1e3, "o-", color=colors[a], label=a, ms=3)
            if M is not None and a in ALGORITHMS:
                pred = [costmodel.predict(M, a, n, p, res["density"]) for p in P]
                ax.plot(P, np.array(pred) * 1e3, "--", color=colors[a], lw=0.8)
        _log_panel(ax, "P (ranks)", "ms per call (median, slowest rank)",
                   f"n = 2^{int(math.log2(n))} per rank, {res['network']}")
    axes[0].legend(fontsize=7, ncol=2)
    if prof is not None:
        fig.text(0.01, 0.01, "dashed: cost model fitted to the profile's runs", fontsize=7)
    return _save(fig, Path(outdir) / f"scaling_measured_{res['network']}.png")


BAND_ALGOS = ("dense", "oktopk", "gtopk", "topka")  # drawn with their bands (the rest: clutter)


def plot_projection(proj, outdir) -> Path:
    """Predicted speedup over dense vs P, one panel per model; with bands
    (``project(band_from=...)``) a second row: predicted ms per allreduce of
    ``BAND_ALGOS`` with each prediction's band shaded."""
    models = list(dict.fromkeys(r["model"] for r in proj))
    algos = [a for a in proj[0]["pred_s"] if a != "dense"]
    banded = "band_s" in proj[0]
    fig, grid = _panels(len(models), 2 if banded else 1)
    for ax, m in zip(grid[0], models):
        rs = [r for r in proj if r["model"] == m]
        P = [r["P"] for r in rs]
        for a in algos:
            ax.plot(P, [r["speedup_vs_dense"][a] for r in rs], "o-", ms=3, label=a,
                    color=_color(a), lw=2.2 if a == "oktopk" else 1.0)
        for p, (lo, hi, _) in PAPER_REPORTED.get(m, {}).items():
            ax.vlines(p, lo, hi, color="k", lw=6, alpha=0.25,
                      label="paper: Ok-Topk training\nthroughput gain (all baselines)")
            ax.annotate(f"{lo:g}x-{hi:g}x", (p, hi), fontsize=7, ha="right", va="bottom")
        ax.axhline(1.0, color="k", lw=0.6)
        _log_panel(ax, "P (GPUs)", "predicted speedup over dense allreduce",
                   f"{m}: n={rs[0]['n'] / 1e6:.1f}M, density {100 * rs[0]['density']:g}%")
        if PAPER_REPORTED.get(m):
            ax.legend(fontsize=6, loc="lower left")
    grid[0][0].legend(fontsize=7, ncol=2)
    if banded:
        for ax, m in zip(grid[1], models):
            rs = [r for r in proj if r["model"] == m]
            P = [r["P"] for r in rs]
            for a in BAND_ALGOS:
                if a not in rs[0]["band_s"]:
                    continue
                ax.plot(P, [1e3 * r["pred_s"][a] for r in rs], "o-", ms=3, label=a,
                        color=_color(a), lw=2.2 if a == "oktopk" else 1.0)
                ax.fill_between(P, [1e3 * r["band_s"][a][0] for r in rs],
                                [1e3 * r["band_s"][a][1] for r in rs], color=_color(a),
                                alpha=0.15, lw=0)
            _log_panel(ax, "P (GPUs)", "predicted ms per allreduce (band shaded)",
                       f"{m}: predicted time and its error band")
        grid[1][0].legend(fontsize=7)
    fig.suptitle("Cost model with profiles/piz_daint.json (published figures, not measured)"
                 + ("; bands: a measured profile's held-out errors" if banded else ""),
                 fontsize=9)
    return _save(fig, Path(outdir) / "scaling_projected_piz_daint.png")


# -- CLI ---------------------------------------------------------------------------
def _load_profile_file(path) -> dict:
    return Profile.load(path).data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scaling",
                                 description=__doc__.splitlines()[0],
                                 epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("measure", help="weak-scaling sweep over P (launches mpiexec per P)")
    m.add_argument("--network", choices=["plain", "slow"], required=True,
                   help="label; slow = run inside the 1 Gbit/s namespace (MPI forced onto TCP)")
    m.add_argument("--np", default=DEFAULT_NP, help=f"process counts (default {DEFAULT_NP})")
    m.add_argument("--log2n", help="log2 of n per rank, comma-separated "
                                   f"(default plain {DEFAULT_LOG2N['plain']}, slow {DEFAULT_LOG2N['slow']})")
    m.add_argument("--density", type=float, default=0.01)
    m.add_argument("--repeat", type=int, default=5)
    m.add_argument("--warmup", type=int, default=2)
    m.add_argument("--budget", type=float, default=240.0, help="seconds for the whole sweep")
    m.add_argument("--algorithms", default="", help="comma-separated (default: all MPI ones)")
    m.add_argument("--profile-np", type=int, default=0,
                   help="first run `autotune profile --quick` at this P and embed it (0: no)")
    m.add_argument("--profile-max-bytes", help="largest message of that profile, e.g. 1M (on the "
                   "slow network keep it >= 4M: the 1 MB token-bucket burst hides the bandwidth "
                   "below that)")
    m.add_argument("--profile-share", type=float, default=0.4,
                   help="the profile is killed after this fraction of --budget (default 0.4)")
    m.add_argument("--mpiexec", help="launcher (default: the one beside python, else on PATH)")
    m.add_argument("--setup-netns", metavar="NAME",
                   help="with --network slow: create namespace NAME (1 Gbit/s tbf on lo), run "
                        "every launch inside it, delete it at the end; exit 3 if impossible")
    m.add_argument("--out", required=True, help="result JSON (rows of every P + profile)")

    r = sub.add_parser("_rank", help=argparse.SUPPRESS)
    r.add_argument("--log2n", required=True)
    r.add_argument("--density", type=float, required=True)
    r.add_argument("--repeat", type=int, required=True)
    r.add_argument("--warmup", type=int, required=True)
    r.add_argument("--algorithms", default="")
    r.add_argument("--json", required=True)

    for name, hlp in (("model", "cost-model error on every measured point"),
                      ("plot", "PNGs: measured time vs P, projected speedup vs P"),
                      ("report", "markdown tables: measured, model error, projection")):
        s = sub.add_parser(name, help=hlp)
        s.add_argument("results", nargs="*", help="measure's JSON files")
        s.add_argument("--profile", help="profile for the model (default: each file's own)")
        s.add_argument("--daint", default=DAINT, help="profile for the projection")
        if name == "plot":
            s.add_argument("--outdir", default=".")
            s.add_argument("--band-from", metavar="PROFILE",
                           help="draw the projection with this measured profile's error band")
        if name == "model":
            s.add_argument("--points", action="store_true", help="also print every point")
            s.add_argument("--max-P", type=int, help="only the points up to this P")
    q = sub.add_parser("noise", help="the model error's noise floor: sweeps against each other")
    q.add_argument("results", nargs="+", help="measure's JSON files (two or more)")
    q.add_argument("--max-P", type=int, help="only the points up to this P")
    p = sub.add_parser("project", help="Piz Daint projection of the paper's models, P=16..256")
    p.add_argument("--daint", default=DAINT, help="profile for the projection")
    p.add_argument("--json", help="also write the projection here")
    p.add_argument("--band-from", metavar="PROFILE",
                   help="a measured profile whose held-out errors give each prediction a band")

    args = ap.parse_args(argv)
    if args.cmd == "_rank":
        return rank_main(args)
    if args.cmd == "measure":
        nps = [int(v) for v in args.np.split(",") if v]
        sizes = [1 << int(e) for e in (args.log2n or DEFAULT_LOG2N[args.network]).split(",")]
        if args.setup_netns and args.network != "slow":
            ap.error("--setup-netns goes with --network slow")
        netns = None
        if args.setup_netns:
            try:
                setup_netns(args.setup_netns)
            except NetnsUnavailable as e:
                print(f"scaling: the 1 Gbit/s namespace is not available here: {e}; "
                      "slow-network sweep not run", file=sys.stderr)
                return 3
            netns = args.setup_netns
        try:
            res = measure(network=args.network, nps=nps, sizes=sizes, density=args.density,
                          repeat=args.repeat, warmup=args.warmup, budget_s=args.budget,
                          algorithms=args.algorithms, out=args.out, profile_np=args.profile_np,
                          profile_max_bytes=args.profile_max_bytes,
                          profile_share=args.profile_share, mpiexec=args.mpiexec,
                          netns=netns)
        finally:
            if netns:
                teardown_netns(netns)
        print(measured_table(res))
        return 0 if res["rows"] else 1

    results = [load_results(f) for f in getattr(args, "results", [])]
    if args.cmd == "noise":
        pairs = sweep_noise(results, max_P=args.max_P)
        if not pairs:
            ap.error("noise needs two or more sweeps with points in common")
        print(f"{len(pairs)} pairs of sweeps: median |t_i - t_j| / t_j {100 * np.median(pairs):.1f}% "
              f"(per pair {100 * min(pairs):.1f}-{100 * max(pairs):.1f}%)")
        return 0
    override = _load_profile_file(args.profile) if getattr(args, "profile", None) else None
    daint = _load_profile_file(args.daint)
    if args.cmd == "project":
        band = _load_profile_file(args.band_from) if args.band_from else None
        proj = project(daint, band_from=band)
        print(projection_table(proj))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(proj, f, indent=1)
        return 0
    if args.cmd == "model":
        summaries = {}
        for res in results:
            errs = model_errors(res["rows"], _profile_for(res, override), max_P=args.max_P)
            summaries[res["network"]] = error_summary(errs)
            if args.points:
                for e in errs:
                    print(f"{res['network']} P={e['P']} n=2^{int(math.log2(e['n']))} "
                          f"{e['algorithm']:10s} measured {1e3 * e['measured_s']:.2f} ms "
                          f"model {1e3 * e['pred_fitted_s']:.2f} / {1e3 * e['pred_table1_s']:.2f}"
                          f" / {1e3 * e['pred_selector_s']:.2f} ms")
        print(error_table(summaries))
        for res in results:
            ran = runs_as_prediction(res["rows"], _profile_for(res, override), max_P=args.max_P)
            if ran:
                print(f"{res['network']}: the profile's own runs as the prediction, at the {ran[1]} "
                      f"points they share: median error {100 * ran[0]:.1f}%")
        return 0
    if args.cmd == "plot":
        os.makedirs(args.outdir, exist_ok=True)
        for res in results:
            prof = override if override is not None else res.get("profile")
            print(plot_measured(res, args.outdir, prof))
        band = _load_profile_file(args.band_from) if args.band_from else None
        print(plot_projection(project(daint, band_from=band), args.outdir))
        return 0
    # report
    parts = []
    summaries = {}
    for res in results:
        parts.append(measured_table(res))
        prof = override if override is not None else res.get("profile")
        if prof is not None:
            summaries[res["network"]] = error_summary(model_errors(res["rows"], prof))
    if summaries:
        parts.append(error_table(summaries))
    parts.append(projection_table(project(daint)))
    print("\n\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())

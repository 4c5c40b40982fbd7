"""Convergence parity grid: every algorithm x density x P x seed, both examples.

    .venv/bin/python examples/convergence.py --out-dir out/convergence --md out/convergence/table.md

Launches ``examples/<model>.py`` on P ranks (``autotune.launch``) once per (model, P,
algorithm) with all densities and seeds of that cell in one launch (torch
and MPI start-up cost seconds per rank), each example with its default
recipe; writes one JSON of curves per launch into --out-dir (an existing
file is reused unless --force, so an interrupted grid resumes, and an
algorithm registered later is added by running the driver again) and the
table as markdown.  ``dense`` and ``auto`` do not depend on the density:
they run once per seed and fill both density columns.

Reported: the final epoch's test accuracy (digits CNN) and validation loss
and perplexity per character (LSTM), mean and sample standard deviation
over the seeds, the difference to dense, and the bytes each rank sent per
step (rank 0, last epoch's average, control messages included).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from autotune.launch import launch as launch_ranks  # noqa: E402

MODELS = {
    # name: (metric key, label, higher is better)
    "digits_cnn": ("test_acc", "test accuracy (%)", True),
    "lstm_lm": ("val_loss", "validation loss (nats/char)", False),
}
DENSITY_FREE = ("dense", "auto", "mpi")


def launch(model: str, P: int, algorithm: str, densities, seeds, out: Path, extra) -> float:
    argv = [str(HERE / f"{model}.py"), "--algorithm", algorithm,
            "--density", ",".join(str(d) for d in densities),
            "--seed", ",".join(str(s) for s in seeds), "--out", str(out), *extra]
    print("$ autotune launch -n", P, " ".join(argv), flush=True)
    t0 = time.perf_counter()
    rc = launch_ranks(P, argv)
    if rc:
        raise SystemExit(f"{model} at P={P} ({algorithm}) exited {rc}")
    return time.perf_counter() - t0


def mean_sd(xs):
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def collect(out_dir: Path):
    """{(model, P, algorithm, density): [final metrics per seed]} from every JSON."""
    cells: dict = {}
    meta: dict = {}
    for f in sorted(out_dir.glob("*.json")):
        d = json.loads(f.read_text())
        if "runs" not in d or d.get("example") not in MODELS:
            continue
        # the recipe shown is a sparse run's (dense and auto ignore the warm-up
        # options, and their files may come from an earlier grid)
        if d["example"] not in meta or (
                meta[d["example"]]["runs"][0]["algorithm"] in DENSITY_FREE
                and d["runs"][0]["algorithm"] not in DENSITY_FREE):
            meta[d["example"]] = d
        for r in d["runs"]:
            cells.setdefault((d["example"], d["P"], r["algorithm"], r["density"]), []).append(r)
    return cells, meta


def table(cells, meta, models, Ps, densities, algorithms) -> str:
    lines = []
    for model, (key, label, higher) in MODELS.items():
        if model not in models or not any(c[0] == model for c in cells):
            continue
        m = meta[model]
        cfg = m["config"]
        first = next(r for c, rs in cells.items() if c[0] == model for r in rs)
        lines += [f"### {model}: final {label}", "",
                  f"{first['params']} parameters, {cfg['epochs']} epochs x "
                  f"{m['steps_per_epoch']} steps, global batch {cfg['batch_size']}, "
                  f"lr {cfg['lr']}, {cfg['warmup_steps']} dense warm-up steps, "
                  + (f"then {cfg['density_warmup']} steps of density falling from 1/4, "
                     if cfg.get("density_warmup") else "")
                  + ("momentum correction, " if cfg.get("momentum_correction") else "")
                  + f"layout {cfg['layout']}; mean ± sd over seeds (n); "
                  f"Δ = difference of the means to dense"
                  + (" (percentage points)" if higher else " (relative)") + ".", ""]
        head = "| algorithm |" + "".join(f" P={P} d={d:g} |" for P in Ps for d in densities)
        lines += [head, "|---|" + "---|" * (len(Ps) * len(densities))]

        def value(r):
            v = r["final"][key]
            return 100 * v if higher else v

        def cell_runs(P, alg, d):
            for (mm, pp, aa, dd), rs in cells.items():
                if mm == model and pp == P and aa == alg and (alg in DENSITY_FREE or dd == d):
                    return rs
            return []

        def rows(cell):
            """One markdown row per algorithm; ``cell(alg, P, d, runs)`` -> cell text."""
            for alg in algorithms:
                row = f"| {alg} |"
                for P in Ps:
                    for d in densities:
                        rs = cell_runs(P, alg, d)
                        row += (cell(alg, P, d, rs) if rs else " —") + " |"
                lines.append(row)

        def metric_cell(alg, P, d, rs):
            mu, sd = mean_sd([value(r) for r in rs])
            txt = f" {mu:.2f} ± {sd:.2f} ({len(rs)})" if higher else \
                f" {mu:.4f} ± {sd:.4f} ({len(rs)})"
            base = cell_runs(P, "dense", d)
            if base and alg != "dense":
                b, _ = mean_sd([value(r) for r in base])
                txt += (f", Δ {mu - b:+.2f}" if higher
                        else f", Δ {100 * (mu - b) / b:+.2f}%")
            if not higher:
                txt += f", ppl {math.exp(mu):.3f}"
            return txt

        rows(metric_cell)
        lines += ["", f"Bytes sent per rank per step (rank 0; last epoch / whole run, warm-up "
                      f"included) and seconds per epoch ({model}, mean over seeds):", "",
                  "| algorithm |" + "".join(f" P={P} d={d:g} |" for P in Ps for d in densities),
                  "|---|" + "---|" * (len(Ps) * len(densities))]
        def cost_cell(alg, P, d, rs):
            per_step, whole = [], []
            for r in rs:
                c = r["curve"]
                prev = c[-2] if len(c) > 1 else {"bytes_sent": 0, "step": 0}
                per_step.append((c[-1]["bytes_sent"] - prev["bytes_sent"])
                                / max(1, c[-1]["step"] - prev["step"]))
                whole.append(c[-1]["bytes_sent"] / max(1, c[-1]["step"]))
            secs = [r["final"]["wall_s"] / len(r["curve"]) for r in rs]
            return (f" {sum(per_step) / len(per_step) / 1e3:.1f} / "
                    f"{sum(whole) / len(whole) / 1e3:.1f} kB, {sum(secs) / len(secs):.2f} s")

        rows(cost_cell)
        lines.append("")
    return "\n".join(lines)


def goals(cells, models, Ps, densities) -> str:
    """Ok-Topk versus dense: within 0.5 pp accuracy, within 2% loss."""
    out = []
    for model, (key, _, higher) in MODELS.items():
        if model not in models:
            continue
        for P in Ps:
            for d in densities:
                ok = cells.get((model, P, "oktopk", d))
                base = [r for (m, p, a, _), rs in cells.items()
                        if m == model and p == P and a == "dense" for r in rs]
                if not ok or not base:
                    continue
                mu = sum(r["final"][key] for r in ok) / len(ok)
                b = sum(r["final"][key] for r in base) / len(base)
                if higher:
                    gap = 100 * (b - mu)
                    out.append(f"- {model} P={P} d={d:g}: oktopk {100 * mu:.2f}% vs dense "
                               f"{100 * b:.2f}%: dense - oktopk = {gap:+.2f} pp -> "
                               f"{'met' if gap <= 0.5 else 'NOT met'} (goal <= 0.5 pp)")
                else:
                    rel = 100 * (mu - b) / b
                    out.append(f"- {model} P={P} d={d:g}: oktopk {mu:.4f} vs dense {b:.4f}: "
                               f"oktopk/dense - 1 = {rel:+.2f}% -> "
                               f"{'met' if rel <= 2 else 'NOT met'} (goal <= 2%)")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--P", default="4,8", help="process counts")
    ap.add_argument("--densities", default="0.01,0.001")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--algorithms", default="dense,oktopk,gtopk,topka,auto")
    ap.add_argument("--out-dir", default="out/convergence")
    ap.add_argument("--md", help="write the markdown table here (default: print only)")
    ap.add_argument("--force", action="store_true", help="rerun cells whose JSON exists")
    ap.add_argument("--table-only", action="store_true", help="launch nothing; tabulate")
    ap.add_argument("--extra", default="", help="extra arguments for every example run")
    args = ap.parse_args(argv)
    import collectives

    models = args.models.split(",")
    Ps = [int(p) for p in args.P.split(",")]
    densities = [float(d) for d in args.densities.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    algorithms = args.algorithms.split(",")
    missing = [a for a in algorithms if a != "auto" and a not in collectives.ALGORITHMS]
    if missing:
        print(f"not registered (skipped): {missing}", flush=True)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    log = []
    if not args.table_only:
        for model in models:
            for P in Ps:
                for alg in algorithms:
                    if alg in missing:
                        continue
                    out = out_dir / f"{model}_P{P}_{alg}.json"
                    if out.exists() and not args.force:
                        continue
                    dens = densities[:1] if alg in DENSITY_FREE else densities
                    secs = launch(model, P, alg, dens, seeds, out, args.extra.split())
                    log.append((model, P, alg, secs))
                    print(f"  {model} P={P} {alg}: {secs:.1f} s", flush=True)
    cells, meta = collect(out_dir)
    md = table(cells, meta, models, Ps, densities, [a for a in algorithms if a not in missing])
    g = goals(cells, models, Ps, densities)
    total = time.perf_counter() - t_start
    text = md + ("\nGoals (Ok-Topk vs dense):\n\n" + g + "\n" if g else "")
    if log:
        text += (f"\nWall time of the launches in this invocation: {total / 60:.1f} min "
                 f"({len(log)} launches).\n")
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

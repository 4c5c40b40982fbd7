"""Plot the training curves the examples write (JSON) as PNGs.

    python examples/plot_curves.py out/convergence/*.json --out-dir out/convergence/plots

One figure per (example, P): the test accuracy (digits CNN) or validation
loss (LSTM) against epochs and against training wall time, one line per
(algorithm, density): the mean over seeds, the band their min..max.
Needs matplotlib (``pip install matplotlib``).

``--tta`` also prints the time-to-accuracy table: per (algorithm, density),
the training wall time (mean over seeds) until the metric first reaches
dense's final value (mean over seeds), and the epoch; "not reached" when it
never does within the run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

METRIC = {"digits_cnn": ("test_acc", "test accuracy"),
          "lstm_lm": ("val_loss", "validation loss (nats/char)")}


def load(paths):
    """{(example, P): {(algorithm, density): [runs]}}; density-free algorithms once."""
    groups: dict = {}
    for p in paths:
        d = json.loads(Path(p).read_text())
        if "runs" not in d:
            continue
        g = groups.setdefault((d["example"], d["P"]), {})
        g.setdefault("_where", _where(d))
        for r in d["runs"]:
            dens = None if r["algorithm"] in ("dense", "auto", "mpi") else r["density"]
            runs = g.setdefault((r["algorithm"], dens), [])
            if dens is None and any(q["seed"] == r["seed"] for q in runs):
                continue  # a density-free run repeated for another density
            runs.append(r)
    return groups


def _where(d) -> str:
    """Where the runs trained, from the JSON (older files: CPU ranks over MPI)."""
    dev, backend = d.get("device", "cpu"), d.get("backend", "mpi")
    return "CPU ranks over MPI" if dev == "cpu" else f"{dev}, {backend.upper()}"


def _series(groups):
    for key, g in sorted(groups.items()):
        yield key, g["_where"], {k: v for k, v in g.items() if k != "_where"}


def time_to_target(groups) -> str:
    """Markdown: wall time to reach dense's final metric, per (example, P, algorithm, density)."""
    lines = ["| example | P | algorithm | density | target (dense final) | reached at epoch | "
             "wall s to target (mean over seeds) | seeds reaching |", "|---|---|---|---|---|---|---|---|"]
    for (example, P), where, series in _series(groups):
        key, _ = METRIC.get(example, ("train_loss", "train loss"))
        better = (lambda v, t: v >= t) if key == "test_acc" else (lambda v, t: v <= t)
        dense = series.get(("dense", None))
        if not dense:
            continue
        target = float(np.mean([r["final"][key] for r in dense]))
        for (alg, dens), runs in sorted(series.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            n = min(len(r["curve"]) for r in runs)
            y = np.array([[pt[key] for pt in r["curve"][:n]] for r in runs]).mean(0)
            t = np.array([[pt["wall_s"] for pt in r["curve"][:n]] for r in runs]).mean(0)
            hit = [i for i in range(n) if better(y[i], target)]
            each = sum(any(better(pt[key], target) for pt in r["curve"]) for r in runs)
            shown = f"{target:.4f}" if key != "test_acc" else f"{100 * target:.2f}%"
            if hit:
                i = hit[0]
                lines.append(f"| {example} | {P} | {alg} | {'' if dens is None else f'{dens:g}'} | "
                             f"{shown} | {i + 1} | {t[i]:.2f} | {each}/{len(runs)} |")
            else:
                lines.append(f"| {example} | {P} | {alg} | {'' if dens is None else f'{dens:g}'} | "
                             f"{shown} | not reached ({n} epochs, {t[-1]:.2f} s) | - | {each}/{len(runs)} |")
    return "\n".join(lines)


def plot(groups, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for (example, P), where, series in _series(groups):
        key, label = METRIC.get(example, ("train_loss", "train loss"))
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        algs = sorted({a for a, _ in series})
        colors = {a: f"C{i}" for i, a in enumerate(algs)}  # one colour per algorithm
        for (alg, dens), runs in sorted(series.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            n = min(len(r["curve"]) for r in runs)
            y = np.array([[pt[key] for pt in r["curve"][:n]] for r in runs])
            t = np.array([[pt["wall_s"] for pt in r["curve"][:n]] for r in runs]).mean(0)
            ep = np.arange(1, n + 1)
            name = alg if dens is None else f"{alg} d={dens:g}"
            style = ":" if alg == "auto" else "--" if dens is not None and dens < 0.01 else "-"
            for ax, x in ((axes[0], ep), (axes[1], t)):
                ax.plot(x, y.mean(0), style, color=colors[alg], label=f"{name} (n={len(runs)})")
                ax.fill_between(x, y.min(0), y.max(0), color=colors[alg], alpha=0.12)
        axes[0].set_xlabel("epoch")
        axes[1].set_xlabel("training wall time (s), mean over seeds")
        axes[0].set_ylabel(label)
        if key == "test_acc":
            lo = min(np.percentile([pt[key] for rs in series.values() for r in rs
                                    for pt in r["curve"]], 10), 0.9)
            axes[0].set_ylim(lo, 1.0)
        else:
            vals = [pt[key] for rs in series.values() for r in rs for pt in r["curve"]]
            axes[0].set_ylim(min(vals) * 0.98, np.percentile(vals, 90))
        for ax in axes:
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=7, loc="best")
        fig.suptitle(f"{example}, P={P} ({where})")
        fig.tight_layout()
        path = out_dir / f"{example}_P{P}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="JSON files written by the examples")
    ap.add_argument("--out-dir", default="out/plots")
    ap.add_argument("--tta", action="store_true", help="print the time-to-accuracy table")
    args = ap.parse_args(argv)
    groups = load(args.files)
    for p in plot(groups, Path(args.out_dir)):
        print(p)
    if args.tta:
        print(time_to_target(groups))
    return 0


if __name__ == "__main__":
    sys.exit(main())

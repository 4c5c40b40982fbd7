"""``autotune show`` and ``autotune plot``: a profile, readable.

``show`` prints the fingerprint, per primitive alpha (us), beta (as GB/s),
the fit's held-out error and the bus bandwidth as nccl-tests defines it, the
regime segments (size ranges with their own alpha and beta), the
selection and reduction cost per element (ns) with each kernel's size
regimes, xi, and the fastest algorithm per (n, P, density) among the
measured runs.  ``plot`` writes PNGs of the
fits (measured medians, the regime segments and the single line, log-log)
and of the measured
time of every algorithm versus n.  matplotlib is optional (``pip install
'autotune-collectives[plot]'``).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from .profile import COMPUTE_KERNELS, PRIMITIVES, Profile, model_terms, segment_at

__all__ = ["busbw", "fastest_table", "plot", "show_text", "summary_lines"]


def busbw(primitive: str, m: int, t: float, P: int) -> float:
    """Bus bandwidth (bytes/s) as nccl-tests defines it.

    algbw = S / t with S the operation's size in nccl-tests' terms, then
    busbw = algbw x factor: allreduce 2(P-1)/P; allgather(v) and alltoall(v)
    (P-1)/P with S the total over ranks (P*m); bcast and point-to-point 1.
    """
    if t <= 0:
        return float("nan")
    if primitive == "allreduce":
        return m / t * 2 * (P - 1) / P
    if primitive in ("allgather", "allgatherv", "alltoallv"):
        return m * P / t * (P - 1) / P
    return m / t


def _gbps(beta: float) -> str:
    return f"{1e-9 / beta:9.3f}" if beta > 0 else "      inf"


def _fmt_err(e) -> str:
    return f"{100 * e:5.1f}%" if e is not None else "   n/a"


def _us(v) -> str:
    return f"{1e6 * v:8.2f}" if v is not None else "     n/a"


def primitive_lines(prof: Profile) -> list[str]:
    P = prof.P
    how = (f"fitted at P={P}" if prof.measured
           else f"published figures, P={P}; each number's source is in the file, "
                "ESTIMATE = derived, not published")
    lines = [f"primitives ({how}; m = bytes as in the model; busbw at the largest "
             "measured size, nccl-tests definition):",
             f"  {'name':11s} {'alpha us':>9s} {'+-':>7s} {'beta GB/s':>9s} {'+-%':>5s} "
             f"{'link GB/s':>9s} {'held-out':>8s} {'line h-o':>8s} {'busbw GB/s':>10s}  model"]
    for name in PRIMITIVES:
        rec = prof.primitives.get(name)
        if rec is None:
            continue
        b, eb = rec["beta_s_per_byte"], rec.get("beta_stderr")
        rel_b = f"{100 * eb / b:4.0f}%" if (eb is not None and b > 0) else "  n/a"
        link = rec.get("beta_link_s_per_byte")
        samples = rec.get("samples") or []
        bw = ""
        if samples:
            s = max(samples, key=lambda s: s["bytes"])
            bw = f"{busbw(name, s['bytes'], float(np.median(s['times_s'])), s['P']) / 1e9:10.3f}"
        lines.append(
            f"  {name:11s} {_us(rec['alpha_s'])[-9:]:>9s} "
            f"{_us(rec.get('alpha_stderr')).strip():>7s} "
            f"{_gbps(b)} {rel_b:>5s} {(_gbps(link) if link is not None else '      n/a')} "
            f"{_fmt_err(rec.get('heldout_median_rel_err')):>8s} "
            f"{_fmt_err(rec.get('line_heldout_median_rel_err', rec.get('heldout_median_rel_err'))):>8s}"
            f" {bw:>10s}  {rec['model']}")
    if any(prof.primitive(n).shared_medium for n in prof.primitives):
        lines.append("  (one host: all ranks share one medium, so the fitted beta holds the "
                     "contention of P ranks; 'link' = beta / concurrency = one link's rate)")
    lines += segment_lines(prof) + burst_lines(prof)
    return lines


def burst_lines(prof: Profile) -> list[str]:
    """The link's token bucket (profiler.measure_burst), where it was measured."""
    lb = prof.link_burst
    if not lb:
        return []
    how = (f"{_size(lb['link_bytes'])} all pairs at once: {lb['drained_s'] * 1e3:.2f} ms back to "
           f"back, {lb['fresh_s'] * 1e3:.2f} ms after {lb['pause_s'] * 1e3:.0f} ms idle")
    busy = [f"  link burst: {w}"] if (w := busy_burst_warning(prof)) else []
    if not lb["bytes"]:
        return [f"  link burst: none ({how})"] + busy
    return [f"  link burst: {_size(lb['bytes'])} pass at the medium's speed after an idle pause "
            f"(a token bucket; {how}; link {1e-9 / lb['link_s_per_byte']:.3f} GB/s); the "
            "algorithm runs start on an idle link and the model credits every call the burst"] + busy


def busy_burst_warning(prof: Profile) -> str | None:
    """What to say when a busy host disturbed every measurement of the link's burst
    (``link_burst.disturbed``, profiler.measure_burst); None otherwise."""
    lb = prof.link_burst
    if not lb.get("disturbed"):
        return None
    return (f"measured on a busy host (disturbed in every attempt, found {_size(lb['bytes'])}): "
            "a token bucket on the link may be missed or undersized (docs/PROFILES.md, 'Runs'); "
            "profile again on a quiet host")


def _size(b: float, units=(" GiB", " MiB", " KiB", " B")) -> str:
    """A byte count, short (1.5 MiB); with ``units`` ("G", "M", "K", "") an element count."""
    for unit, scale in zip(units, (1 << 30, 1 << 20, 1 << 10)):
        if b >= scale:
            v = b / scale
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.3g}{unit}"
    return f"{b:.0f}{units[-1]}"


def _elems(n: float) -> str:
    return _size(n, ("G", "M", "K", ""))


def _ranges(starts, fmt) -> list[str]:
    """'[lo, hi)' of each segment from its start (the first from 0, the last to inf)."""
    ends = [fmt(m) for m in starts[1:]] + ["inf"]
    return [f"[{'0' if i == 0 else fmt(m)}, {end})" for i, (m, end) in enumerate(zip(starts, ends))]


def segment_lines(prof: Profile) -> list[str]:
    """The regime segments (what predictions use); nothing for single-line records."""
    if not any(prof.primitive(name).segments for name in prof.primitives):
        return ["  one alpha-beta line per primitive (no regime segments"
                + ("; `autotune profile --refit FILE` adds them from the stored samples)"
                   if prof.measured else ")")]
    lines = ["regimes (predictions use the segment covering m; 'held-out' above is theirs, "
             "'line h-o' the single line's):"]
    for name in PRIMITIVES:
        fit = prof.primitive(name, None)
        if fit is None or not fit.segments:
            continue
        segs = fit.record["segments"]
        parts = [f"{r} a {1e6 * sg['alpha_s']:.2f} us 1/b "
                 f"{_gbps(sg['beta_s_per_byte']).strip()} GB/s"
                 for r, sg in zip(_ranges([sg["from_bytes"] for sg in segs], _size), segs)]
        lines.append(f"  {name:11s} " + "; ".join(parts))
    return lines


def compute_lines(prof: Profile) -> list[str]:
    units = prof.data["compute"].get("units") or {}
    lines = [f"local compute on {prof.compute_device} (t = c0 + c1*n; predictions: the regime "
             "covering n):"]
    for k in COMPUTE_KERNELS:
        fit = prof.compute(k)
        if fit is not None:
            unit = units.get(k, "per element")
            lines.append(f"  {k:12s} c0 {1e6 * fit.c0:9.2f} us   c1 "
                         f"{1e9 * fit.c1:8.4g} ns/elem   ({unit})")
            if fit.segments:
                lines.append(f"  {'':12s} regimes " + "; ".join(
                    f"{r} c0 {1e6 * c0:.2f} us c1 {1e9 * c1:.4g} ns" for r, (_, c0, c1) in
                    zip(_ranges([sg[0] for sg in fit.segments], _elems), fit.segments)))
    return lines


def _by_density(by: dict) -> str:
    return ", ".join(f"{d}: {v:.4f}" if v is not None else f"{d}: n/a"
                     for d, v in sorted(by.items(), key=lambda kv: float(kv[0])))


def xi_lines(prof: Profile) -> list[str]:
    xi = prof.xi
    med = xi.get("median")
    head = f"xi (Assumption 1 gap, source: {xi['source']}): median " + (
        f"{med:.4f}" if med is not None else "n/a")
    lines = [head + " (the paper's definition: gap / ||lr * averaged gradient||)"]
    for label, rec in (("by density", xi),
                       ("gap / ||averaged accumulator|| (residuals included; not the paper's xi)",
                        xi.get("relative_to_accumulator")),
                       ("share of the gradient's norm in its top-k (tune --capture-min)",
                        xi.get("captured_norm"))):
        if rec and rec.get("by_density"):
            lines.append(f"  {label}: " + _by_density(rec["by_density"]))
    if xi.get("model"):
        lines.append(f"  from: {xi['model']}, {xi.get('steps')} steps, train accuracy "
                     f"{xi.get('train_accuracy', float('nan')):.3f}")
    return lines


def fastest_table(runs: list[dict]) -> list[dict]:
    """For each (n, P, density) of the lossy runs: the fastest algorithm.

    Lossless algorithms (density null) are candidates at every density.
    """
    dense = defaultdict(list)
    lossy = defaultdict(list)
    for r in runs:
        if r["density"] is None:
            dense[(r["n"], r["P"])].append(r)
        else:
            lossy[(r["n"], r["P"], r["density"])].append(r)
    keys = (sorted(lossy, key=lambda k: (k[1], k[0], k[2]))
            or sorted(((n, P, None) for n, P in dense), key=lambda k: (k[1], k[0])))
    out = []
    for key in keys:
        n, P, d = key
        cands = lossy.get(key, []) + dense.get((n, P), [])
        if not cands:
            continue
        best = min(cands, key=lambda r: r["median_s"])
        ref = next((r for r in cands if r["algorithm"] == "mpi"), None)
        out.append({"n": n, "P": P, "density": d, "algorithm": best["algorithm"],
                    "median_s": best["median_s"],
                    "speedup_vs_mpi": (ref["median_s"] / best["median_s"]) if ref else None,
                    "candidates": len(cands)})
    return out


def fastest_lines(prof: Profile) -> list[str]:
    rows = fastest_table(prof.runs)
    if not rows:
        return ["runs: none"]
    lines = [f"fastest algorithm per (n, P, density) among {len(prof.runs)} measured runs:",
             f"  {'P':>3s} {'n':>8s} {'density':>8s}  {'fastest':10s} {'ms':>9s} {'vs mpi':>7s}"]
    for r in rows:
        d = f"{r['density']:g}" if r["density"] is not None else "-"
        sp = f"{r['speedup_vs_mpi']:6.2f}x" if r["speedup_vs_mpi"] else "    n/a"
        lines.append(f"  {r['P']:3d} {'2^' + str(int(np.log2(r['n']))):>8s} {d:>8s}  "
                     f"{r['algorithm']:10s} {1e3 * r['median_s']:9.3f} {sp}")
    return lines


def model_error_lines(prof: Profile) -> list[str]:
    """The cost model's held-out error per algorithm (``costmodel.heldout_errors``):
    one size left out (in range), one process count left out (per octave of P)."""
    from . import costmodel

    if not prof.runs:
        return ["cost model held-out error: no runs to cross-validate (the model is unchecked)"]
    machine = costmodel.Machine.from_profile(prof)
    errs = costmodel.heldout_errors(machine, prof.runs)
    Ps = sorted({int(r["P"]) for r in prof.runs})
    lines = [f"cost model held-out error (median |predicted/measured - 1|; runs at P = "
             f"{', '.join(map(str, Ps))}; shared-host bandwidth law: {machine.law}"
             + ("" if machine.fixed_shape is None
                else f"; fixed cost o1 = {machine.fixed_shape:.2f} o0, every algorithm") + "):",
             f"  {'algorithm':10s} {'one size out':>12s} {'one P out, per octave':>22s} "
             f"{'runs':>5s}  weights lat/bw/cmp, fixed cost ms o0 + o1 (P-1)"]
    pct = lambda e: f"{100 * np.expm1(e):.0f}%" if np.isfinite(e) else "-"  # noqa: E731
    for a, (inside, octave, k) in sorted(errs.items()):
        w = machine.weights.get(a, (1.0, 1.0, 1.0))
        o0, o1 = machine.overhead.get(a, (0.0, 0.0))
        lines.append(f"  {a:10s} {pct(inside):>12s} {pct(octave):>22s} {k:5d}  "
                     f"{w[0]:.2f}/{w[1]:.2f}/{w[2]:.2f}, {1e3 * o0:.3f} + {1e3 * o1:.3f} (P-1)")
    return lines


def fingerprint_lines(prof: Profile) -> list[str]:
    fp = prof.fingerprint
    hosts = fp["hosts"]
    host = ", ".join(hosts[:3]) + (f" (+{len(hosts) - 3})" if len(hosts) > 3 else "")
    rph = fp.get("ranks_per_host")
    nodes = -(-fp["P"] // rph) if isinstance(rph, int) and rph > 0 else len(hosts)
    cpu = fp.get("cpu_model") if not fp.get("cpu_id") else f"{fp.get('cpu_model')} ({fp['cpu_id']})"
    return [
        f"profile {prof.path or ''}  ({prof.source}, created {prof.created}, "
        f"schema v{prof.version})",
        f"  machine: P={fp['P']} on {nodes} host(s) [{host}], device {fp['device']}, "
        f"network {fp['network']}",
        f"  cpu {cpu}; gpu {fp.get('gpu_model')}; mpi {fp.get('mpi_library')}; "
        f"nccl {fp.get('nccl_version')}",
    ]


def settings_lines(prof: Profile) -> list[str]:
    st = prof.settings
    if not st:
        return []
    el = (st.get("elapsed_s") or {}).get("total")
    la = st.get("loadavg_start")
    return [f"  measured with plan '{st.get('plan')}'"
            + (f" in {el:.0f} s" if el is not None else "")
            + (f", host load average at start {la[0]:.2f} (1 min) {la[1]:.2f} (5 min)"
               if la else "")]


def summary_lines(prof: Profile) -> list[str]:
    """What ``autotune profile`` prints at the end."""
    return primitive_lines(prof) + compute_lines(prof) + xi_lines(prof)


def show_text(prof: Profile) -> str:
    lines = fingerprint_lines(prof) + settings_lines(prof)
    if prof.foreign:
        lines.append("  WARNING: this profile is from another machine: " + "; ".join(prof.foreign))
    if prof.notes:
        lines.append(f"  notes: {prof.notes}")
    lines += [""] + primitive_lines(prof) + [""] + compute_lines(prof) + [""] + xi_lines(prof)
    lines += [""] + fastest_lines(prof) + [""] + model_error_lines(prof)
    skipped = defaultdict(list)
    for s in prof.skipped:
        skipped[s["algorithm"]].append(s)
    for algo, ss in skipped.items():
        lines.append(f"  skipped {algo} in {len(ss)} case(s): {ss[0]['reason'][:100]}")
    return "\n".join(lines)


# -- plots -------------------------------------------------------------------------
def plot(prof: Profile, outdir) -> list[Path]:
    """Write fits.png (and algorithms.png when there are runs, compute.png when
    there are compute samples) into ``outdir``; returns the paths.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    title = (f"{prof.fingerprint['network']}, P={prof.P}, {prof.fingerprint['device']} "
             f"({prof.source})")

    names = [n for n in PRIMITIVES if n in prof.primitives]
    cols = 3
    rows = max(1, -(-len(names) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        rec = prof.primitives[name]
        ss = rec.get("samples") or []
        P = ss[0]["P"] if ss else prof.P
        A, B = model_terms(name, P)
        if ss:
            m = np.array([s["bytes"] for s in ss], dtype=float)
            t = np.array([np.median(s["times_s"]) for s in ss])
            h = np.array([s.get("heldout", False) for s in ss])
            low = np.array([s.get("fit_weight", 1.0) < 0.5 for s in ss]) & ~h
            ax.loglog(m[~h & ~low], t[~h & ~low], "o", color="C0", label="measured (fit)")
            if low.any():
                ax.loglog(m[low], t[low], "x", color="0.4",
                          label="measured (down-weighted by the robust fit)")
            if h.any():
                ax.loglog(m[h], t[h], "s", mfc="none", color="C3", label="measured (held out)")
            lo, hi = m.min(), m.max()
        else:
            lo, hi = 4.0, 32.0 * 2 ** 20
        mm = np.logspace(np.log10(lo), np.log10(hi), 200)
        segs = rec.get("segments")
        ax.loglog(mm, rec["alpha_s"] * A + rec["beta_s_per_byte"] * mm * B,
                  "--" if segs else "-", color="C1", lw=1 if segs else 1.5,
                  label=("single line" if segs else "fit") if prof.measured
                  else "model (published)")
        if segs:
            ab = np.array([segment_at(rec, v) for v in mm])
            which = np.array([sum(v >= sg["from_bytes"] for sg in segs[1:]) for v in mm])
            for j in range(len(segs)):
                sel = which == j
                if sel.any():
                    ax.loglog(mm[sel], ab[sel, 0] * A + ab[sel, 1] * mm[sel] * B, "-", lw=2,
                              color=f"C{2 + j}", label=f"regime {j + 1}"
                              f" (from {_size(segs[j]['from_bytes']) if j else '0'})")
            for sg in segs[1:]:
                ax.axvline(sg["from_bytes"], color="0.6", lw=0.8, ls=":")
        err = rec.get("heldout_median_rel_err")
        b = rec["beta_s_per_byte"]
        if segs:
            line_err = rec.get("line_heldout_median_rel_err")
            ax.set_title(f"{name}: {len(segs)} regime(s), held-out {100 * err:.0f}%"
                         + (f" (one line: {100 * line_err:.0f}%)" if line_err is not None else ""),
                         fontsize=9)
        else:
            ax.set_title(f"{name}: a={1e6 * rec['alpha_s']:.2f} us, "
                         f"1/b={(1e-9 / b) if b else float('inf'):.3g} GB/s"
                         + (f", held-out {100 * err:.0f}%" if err is not None else ""), fontsize=9)
        ax.set_xlabel("m (bytes)")
        ax.set_ylabel("time (s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(f"alpha-beta fits: {title}")
    fig.tight_layout()
    p = outdir / "fits.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    written.append(p)

    runs = prof.runs
    if runs:
        Ps = sorted({r["P"] for r in runs})
        dens = sorted({r["density"] for r in runs if r["density"] is not None}) or [None]
        fig, axes = plt.subplots(len(Ps), len(dens), figsize=(5.5 * len(dens), 4 * len(Ps)),
                                 squeeze=False)
        algos = sorted({r["algorithm"] for r in runs})
        colors = {a: f"C{i % 10}" for i, a in enumerate(algos)}
        for i, P in enumerate(Ps):
            for j, d in enumerate(dens):
                ax = axes[i][j]
                for a in algos:
                    rs = sorted((r for r in runs if r["P"] == P and r["algorithm"] == a
                                 and (r["density"] is None or r["density"] == d)),
                                key=lambda r: r["n"])
                    if rs:
                        style = "--" if rs[0]["density"] is None else "-"
                        ax.loglog([r["n"] for r in rs], [r["median_s"] for r in rs], style,
                                  marker="o", ms=3, color=colors[a], label=a)
                ax.set_title(f"P={P}" + (f", density {d:g}" if d is not None else ""), fontsize=9)
                ax.set_xlabel("n (elements)")
                ax.set_ylabel("median time per call (s)")
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=7)
        fig.suptitle(f"algorithms, median per call\n{title}; dashed: lossless", fontsize=10)
        fig.tight_layout()
        p = outdir / "algorithms.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)

    cs = prof.data["compute"].get("samples") or []
    if cs:
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for i, k in enumerate(sorted({s["kernel"] for s in cs})):
            ss = sorted((s for s in cs if s["kernel"] == k), key=lambda s: s["n"])
            n = np.array([s["n"] for s in ss], dtype=float)
            ax.loglog(n, [np.median(s["times_s"]) for s in ss], "o", color=f"C{i}", label=k)
            fit = prof.compute(k)
            if fit:
                nn = np.logspace(np.log10(n.min()), np.log10(n.max()), 50)
                ax.loglog(nn, [fit(v) for v in nn], "-", color=f"C{i}")
        ax.set_xlabel("n (elements)")
        ax.set_ylabel("time (s)")
        ax.set_title(f"local compute ({prof.compute_device}): points measured, "
                     "lines the fits predictions use", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = outdir / "compute.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)
    return written

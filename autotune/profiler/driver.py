"""The driver of ``autotune profile``: the plans, the progress line, the
machine's fingerprint, ``run_profile`` (the four campaigns in order) and the
command's ``main`` (and ``--refit``)."""
from __future__ import annotations

import os
import re
import socket
import sys
import time

import numpy as np

from collectives import ALGORITHMS, MPICommunicator

from ..profile import PRIMITIVES, Profile, cpu_id, cpu_model, gpu_model, nccl_version
from .common import ProfilerError, _agree_error, _control, _loadavg, _xp
from .fits import refit_profile
from .measure import (_GPU_ALGO_EXTRA, count_algorithm_steps, count_compute_steps, idle_gap,
                      measure_algorithms, measure_burst, measure_compute, measure_primitives,
                      primitive_sizes, process_counts)
from .xi import load_gradient_dir, xi_from_files, xi_from_training


# The kernels' sizes: every half octave from 2^20 up to 2^24 (64 MiB, past the last-level
# cache of most CPUs), where a kernel's rate changes as its vectors leave each cache level and
# the size regimes (fits.fit_compute) need four sizes each: with the halves the last knee
# (past 2^22.5 on a 2-core Intel VM: 0.8-0.9 -> 1.3-1.4 ns per element) gets a regime of its own.
_COMPUTE_LOG2N = [12, 14, 16, 18, 20, 20.5, 21, 21.5, 22, 22.5, 23, 23.5, 24]

# What each --sizes plan measures.  "tiny" exists for the test-suite.
PLANS = {
    "tiny": dict(
        log2_bytes=list(range(2, 17, 2)), prim_warmup=1, prim_repeat=3, prim_budget_s=0.05,
        algo_log2n=[10], densities=[0.01], algo_warmup=2, algo_repeat=2, algo_budget_s=0.1,
        compute_log2n=[10, 14, 18], compute_repeat=3, xi_steps=6, xi_every=2,
        xi_densities=[0.01, 0.1], burst=dict(pause_s=0.01, repeat=3)),
    "quick": dict(
        log2_bytes=list(range(2, 23)), prim_warmup=2, prim_repeat=15, prim_budget_s=0.3,
        algo_log2n=[12, 14, 16, 18, 20], densities=[0.01], algo_warmup=3, algo_repeat=5,
        algo_budget_s=0.3, odd_process_counts=True, compute_log2n=_COMPUTE_LOG2N,
        compute_repeat=5, xi_steps=40, xi_every=4, xi_densities=[0.001, 0.01, 0.05, 0.1]),
    "full": dict(
        log2_bytes=list(range(2, 27)), half_octaves=True, prim_warmup=3, prim_repeat=11,
        prim_budget_s=4.0,
        algo_log2n=[12, 14, 16, 18, 20], densities=[0.001, 0.01, 0.05], algo_warmup=5,
        algo_repeat=7, algo_budget_s=3.0, lossless_log2n=[22, 23, 24], odd_process_counts=True,
        compute_log2n=_COMPUTE_LOG2N,
        compute_repeat=7, xi_steps=300, xi_every=10, xi_densities=[0.001, 0.01, 0.05, 0.1]),
}


class _Progress:
    """Progress of the profiler on rank 0's stderr (nothing elsewhere or with ``quiet``).

    On a terminal, one bar redrawn in place (at most every 0.1 s).  Anywhere
    else -- under mpiexec, whose ranks write to pipes, or into a log file -- a
    redrawn bar would show nothing until the end, so it writes whole flushed
    lines: one at the start, then at most one every ``interval_s`` (2 s), and
    the last step's (at ``close`` if the count fell short of the total), each
    with done/total, percent, elapsed seconds and the step.
    """

    LINE_INTERVAL_S = 2.0
    BAR_INTERVAL_S = 0.1

    def __init__(self, comm, total: int, quiet: bool = False, *, stream=None,
                 interval_s: float | None = None, clock=time.monotonic):
        self.on = comm.rank == 0 and not quiet
        self.stream = sys.stderr if stream is None else stream
        try:
            self.tty = bool(self.on and self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False
        self.interval_s = (interval_s if interval_s is not None else
                           self.BAR_INTERVAL_S if self.tty else self.LINE_INTERVAL_S)
        self.clock = clock
        self.t0 = clock()
        self.total = max(int(total), 1)
        self.done = 0
        self.what = "starting"
        self._shown = 0        # self.done when last written
        self._last = None      # clock() when last written
        self._width = 0        # length of the bar drawn last (tty)
        if self.on:
            self._write()      # at once: the first step can take a while

    def _text(self) -> str:
        pct = min(100, 100 * self.done // self.total)
        return f"[{self.done}/{self.total}] {pct:3d}% {self.clock() - self.t0:6.1f} s  {self.what}"

    def _write(self) -> None:
        if self.tty:
            import shutil

            cols = max(20, shutil.get_terminal_size((80, 24)).columns - 1)
            fill = min(self.done, self.total) * 20 // self.total
            text = f"profile |{'#' * fill}{'.' * (20 - fill)}| {self._text()}"[:cols]
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self.stream.write(f"autotune profile: {self._text()}\n")
        self.stream.flush()
        self._shown, self._last = self.done, self.clock()

    def step(self, what: str, k: int = 1) -> None:
        if not self.on:
            return
        self.done += k
        self.what = what
        if (self._last is None or self._shown < self.total <= self.done
                or self.clock() - self._last >= self.interval_s):
            self._write()

    def close(self) -> None:
        if not self.on:
            return
        if self.done and self._shown != self.done:
            self._write()  # the last step, where the rate limit held it back
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
        self.on = False



# -- fingerprint ---------------------------------------------------------------------
def fingerprint(comm, *, device: str, network: str | None) -> dict:
    ctl = _control(comm)
    name = socket.gethostname().encode()[:255]
    buf = np.zeros(256, dtype=np.uint8)
    buf[:len(name)] = np.frombuffer(name, dtype=np.uint8)
    table = ctl.allgather(buf) if comm.size > 1 else buf[None]
    hosts = [bytes(row).rstrip(b"\0").decode(errors="replace") for row in np.asarray(table)]
    uniq = sorted(set(hosts))
    return {
        "hosts": uniq,
        "ranks_per_host": max(hosts.count(h) for h in uniq),
        "cores_per_host": os.cpu_count(),  # rank 0's host (the cost model's contention)
        "cpu_model": cpu_model(),
        "cpu_id": cpu_id(),
        "gpu_model": gpu_model(device),
        "mpi_library": ctl.library_version(),
        "nccl_version": nccl_version(device),
        "P": comm.size,
        "device": device,
        "backend": comm.backend,
        "network": network or ("shm" if len(uniq) == 1 else "unknown"),
    }


# -- driver --------------------------------------------------------------------------
def run_profile(comm, *, plan_name: str = "quick", device: str = "cpu", network: str | None = None,
                gradients: str | None = None, max_bytes: int | None = None,
                algorithms: list[str] | None = None, quiet: bool = False,
                seed: int = 0, backend: str = "mpi") -> Profile | None:
    """Measure and return the Profile on rank 0 (None on the other ranks).

    Args:
        comm: an MPICommunicator over the ranks to profile.
        backend: ``mpi`` (payloads through ``comm``) or ``nccl``: payloads,
            the alpha/beta primitives and the algorithm runs go GPU to GPU
            through a :class:`collectives.NCCLCommunicator` bootstrapped over
            ``comm`` (needs ``device="gpu"``); barriers, timing reductions and
            the xi run's host gradients stay on MPI.

    Raises:
        ProfilerError: on every rank alike.
    """
    t_start = time.perf_counter()
    load_start = _loadavg()
    if backend not in ("mpi", "nccl"):
        raise ProfilerError(f"unknown backend {backend!r} (mpi or nccl)")
    if backend == "nccl" and device != "gpu":
        raise ProfilerError("--backend nccl moves device buffers: use it with --device gpu")
    if comm.size < 2:
        raise ProfilerError("a profile needs at least 2 ranks (mpiexec -n P, or --np P)")
    plan = PLANS[plan_name]
    msg = None
    if device == "gpu":
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() < 1:
                msg = "--device gpu: no CUDA device visible"
            else:
                cupy.cuda.Device(comm.rank % cupy.cuda.runtime.getDeviceCount()).use()
        except Exception as e:  # cupy missing or broken driver
            msg = f"--device gpu needs cupy and a CUDA GPU ({type(e).__name__}: {e})"
    _agree_error(comm, msg)
    if backend == "nccl":
        msg = None
        try:
            from collectives import NCCLCommunicator

            comm = NCCLCommunicator(comm)
        except Exception as e:  # NCCL missing or failing to initialise on some rank
            msg = f"--backend nccl: cannot start NCCL ({type(e).__name__}: {e})"
            comm = _control(comm)
        _agree_error(_control(comm), msg)
    xp, sync = _xp(device)
    if device == "gpu":
        comm.sync_phases = True  # the per-phase split includes the GPU work (as in bench)
        # up to 2^20 a GPU collective is launch-bound: run the algorithms where the
        # kernels' cost shows too, so the learned correction covers that regime
        plan = dict(plan, algo_log2n=list(plan["algo_log2n"])
                    + [e for e in _GPU_ALGO_EXTRA if e > max(plan["algo_log2n"])])

    names = list(ALGORITHMS) if not algorithms else algorithms
    unknown = [a for a in names if a not in ALGORITHMS]
    _agree_error(comm, f"unknown algorithm(s) {unknown}; registered: {sorted(ALGORITHMS)}"
                 if unknown else None)

    snapshots, msg = None, None
    if gradients and comm.rank == 0:
        try:
            snapshots = load_gradient_dir(gradients)
        except ProfilerError as e:
            msg = str(e)
    _agree_error(comm, msg)

    fp = fingerprint(comm, device=device, network=network)
    shared_medium = len(fp["hosts"]) == 1
    max_bytes = max_bytes or (1 << max(plan["log2_bytes"]))
    # the lossless runs beyond algo_log2n stop where the primitives do
    plan = dict(plan, lossless_log2n=[e for e in plan.get("lossless_log2n", [])
                                      if e > max(plan["algo_log2n"]) and (4 << e) <= max_bytes])
    n_sizes = len(primitive_sizes(plan, max_bytes))
    # one host's ranks behind one shaped link (a namespace's token bucket): its burst
    burst_here = shared_medium and device == "cpu"
    total = (len(PRIMITIVES) * n_sizes + int(burst_here)
             + count_algorithm_steps(comm.size, plan, names)
             + count_compute_steps(plan, device)
             + (0 if gradients else plan["xi_steps"]))
    progress = _Progress(comm, total, quiet)
    try:
        t0 = time.perf_counter()
        prims = measure_primitives(comm, plan, max_bytes=max_bytes, xp=xp, sync=sync,
                                   progress=progress, shared_medium=shared_medium)
        burst = {}
        if burst_here:
            burst = measure_burst(comm, xp=xp, p2p=prims["p2p"], **plan.get("burst", {}))
            progress.step("burst")
        gap_s = idle_gap(burst)
        t1 = time.perf_counter()
        runs, skipped = measure_algorithms(comm, plan, names=names, xp=xp, sync=sync,
                                           progress=progress, seed=seed, gap_s=gap_s)
        t2 = time.perf_counter()
        compute = measure_compute(comm, plan, device=device, xp=xp, sync=sync, progress=progress)
        t3 = time.perf_counter()
        if gradients:
            xi = xi_from_files(snapshots, plan["xi_densities"]) if comm.rank == 0 else None
        else:
            xi = xi_from_training(comm, plan, seed=seed, progress=progress)
        t4 = time.perf_counter()
    finally:
        progress.close()
    if comm.rank != 0:
        return None
    settings = {
        "plan": plan_name, "max_bytes": max_bytes, "seed": seed,
        "algorithms": names, "densities": plan["densities"],
        "algo_log2n": plan["algo_log2n"], "lossless_log2n": plan["lossless_log2n"],
        "process_counts": process_counts(comm.size, plan.get("odd_process_counts", False)),
        "elapsed_s": {"primitives": t1 - t0, "algorithms": t2 - t1, "compute": t3 - t2,
                      "xi": t4 - t3, "total": time.perf_counter() - t_start},
        "loadavg_start": load_start, "loadavg_end": _loadavg(),
        "backend": comm.backend,
        "timing": "median of repeats; each repeat after a barrier, slowest rank's time; "
                  "small messages timed in batches of ~5 ms"
                  + ("; each repeat ends with a CUDA stream synchronize" if sync else "")
                  + (f"; each algorithm run's repeat after {gap_s * 1e3:.1f} ms idle "
                     "(the link's burst refilled)" if gap_s else ""),
    }
    extra = {"link_burst": burst} if burst else {}
    return Profile.new(source="measured", fingerprint=fp, primitives=prims, compute=compute,
                       runs=runs, xi=xi, skipped=skipped, settings=settings, **extra)


def _parse_bytes(s: str | None) -> int | None:
    """'4M', '64KiB', '65536' -> bytes."""
    if not s:
        return None
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmg]?)(?:i?b)?\s*", s.lower())
    if not m:
        raise ProfilerError(f"--max-bytes {s!r}: expected a size such as 4M, 64K or 65536")
    return int(float(m[1]) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m[2]])


def refit_main(args) -> int:
    """``autotune profile --refit FILE``: refit from the stored samples, no MPI."""
    from ..profile import ProfileError
    from ..report import primitive_lines

    try:
        prof = refit_profile(Profile.load(args.refit))
    except (ProfileError, ProfilerError) as e:
        print(f"autotune profile: error: {e}", file=sys.stderr)
        return 2
    path = prof.save(args.out or args.refit)
    if not args.quiet:
        print("\n".join(primitive_lines(prof)))
    print(f"refitted {args.refit} -> {path}")
    return 0


def main(args) -> int:
    if getattr(args, "refit", None):
        return refit_main(args)
    comm = MPICommunicator()
    plan = args.sizes or ("quick" if args.quick else "full")
    out = args.out or f"profile-{args.network or 'shm'}-P{comm.size}.json"
    try:
        max_bytes = _parse_bytes(args.max_bytes)
        prof = run_profile(comm, plan_name=plan, device=args.device, network=args.network,
                           gradients=args.gradients, max_bytes=max_bytes,
                           algorithms=args.algorithms.split(",") if args.algorithms else None,
                           quiet=args.quiet, seed=args.seed,
                           backend=getattr(args, "backend", "mpi"))
    except ProfilerError as e:
        if comm.rank == 0:
            print(f"autotune profile: error: {e}", file=sys.stderr)
        return 2
    if comm.rank == 0:
        path = prof.save(out)
        from ..report import busy_burst_warning, summary_lines

        if not args.quiet:
            print("\n".join(summary_lines(prof)))
        el = prof.settings["elapsed_s"]["total"]
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB) in {el:.1f} s")
        if warning := busy_burst_warning(prof):
            print(f"autotune profile: warning: the link's burst was {warning}", file=sys.stderr)
        if comm.size == 2:
            print("autotune profile: note: two ranks time one process count, so how times grow "
                  "with P comes from the paper's formulas alone, not from runs (docs/BENCHMARKS.md, "
                  "'Selector regret'); profile with 4 ranks or more where you can",
                  file=sys.stderr)
    return 0

"""Performance-regression check: run the timed benchmarks, compare with a saved baseline.

From the repository root:

    python -m tests.benchmarks                       # compare (--machine cpu-2core); exit 1 on a regression
    python -m tests.benchmarks --save                # (re)record this hardware's baseline
    python -m tests.benchmarks --machine gpu-h200    # another machine kind

Each suite is one pytest run with pytest-benchmark's own machinery
(``--benchmark-enable``; ``--benchmark-save`` to record,
``--benchmark-compare=<baseline file>`` for its comparison table).  Suites:

  host  kernels (numpy; cupy where a GPU is) and the selector, one process
  mpi   every algorithm over MPI with numpy data, under ``mpiexec -n P``
  nccl  every algorithm over NCCL with cupy data, under ``mpiexec -n P`` (GPU)

What is gated: every benchmark *relative to a reference timed in the same
rounds*, right before each of its calls (conftest.py, ``measure``; the
reference's statistics are saved in the benchmark's ``extra_info``):

  kernels            one read pass over the input (``x.sum()``, same size and
                     device); ``to_dense``: allocating a zeroed n-vector
  selector           ``reference_workload()``, fixed Python + small numpy calls
  sparse algorithms  one read pass over the round's input
  dense              the native allreduce (``mpi``, resp. ``nccl``) of that input

A benchmark fails when, on its statistic (the fastest of 200 rounds; the
median for ``scatter_add``, ``to_dense`` and ``oktopk``, whose fastest round
is a lucky one),

    (now / now_reference) / (baseline / baseline_reference)  >  1 + threshold

Whatever slows the machine as a whole (another CPU model of the same kind,
its clock, other jobs) moves benchmark and reference alike and cancels out; a
change of the benchmarked code does not.  The native allreduce is gated on its
own median at ``--native-fail`` (+100%: gross regressions of the shared
communicator layer only).  Host data are timed in CPU time of the process
(``time.process_time``: time other processes take on the same cores does not
count), the MPI ranks with ``OMPI_MCA_mpi_yield_when_idle=1`` (a rank waiting
for a descheduled peer gives its core away instead of spinning) and every
benchmark process with glibc's mmap threshold fixed (see _ALLOC_ENV); GPU data
are timed in wall time.

Noise comes in bursts (another job's minute on the cores), so a benchmark
beyond the threshold is run again, alone, up to ``--retries`` (2) times and
fails only if it fails every time; a real slowdown does.  Likewise ``--save``
records, runs one confirming compare (which must pass) and keeps per
benchmark the faster of the two runs.

Baselines are kept per machine kind *and per hardware model*:
``tests/benchmarks/baselines/<machine>/<hardware>/<pytest-benchmark machine id>/NNNN_<suite>.json``
where ``<hardware>`` names the CPU model (py-cpuinfo's brand, family and
model, e.g. ``amd-epyc-family25-model17``, and ``-avx512`` where the CPU
exposes it), plus the GPU model where there is one (``...+nvidia-h200``).  A machine kind is not one piece of hardware (the
2-core CPU kind came as AMD EPYC family 26 and 25 and as an Intel Xeon, issue
#22; the hypervisor calls both EPYCs just "AMD EPYC"), and ratios to a
reference move between models too, if much less than absolute times: a
compare only uses a baseline of the same model.  On hardware without one it
says so, records one there instead (nothing is gated in that run; commit the
new folder to gate later runs) and prints, for information, the ratios
against the other models' baselines; ``--require-baseline`` fails instead.
The compare also fails when the run and the baseline hold different
benchmarks, references, statistics or clocks (re-record after changing one).

Threshold: ``min:15%`` for every suite (``--fail STAT:PCT%`` replaces it; STAT
applies to the benchmarks that do not name their own).  Chosen from the
run-to-run spread of these ratios on the 2-core machine; a 30% slowdown of
one kernel and of one algorithm (``--bench-slowdown``, a test-only hook of
conftest.py) failed 9 of 9 runs on one VM and 4 of 5 on another
(docs/BENCHMARKS.md); test_bench_gate.py has the noise figures and checks the
mechanism with a 2.5x slowdown.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BASELINES = HERE / "baselines"
STATS = ("min", "q1", "median", "mean", "max")


@dataclass(frozen=True)
class Suite:
    files: tuple[str, ...]
    mpi: bool
    fail: str  # default threshold: STAT:PCT% of the ratio to the reference
    env: dict = field(default_factory=dict)

    def save_name(self, name: str, nprocs: int) -> str:
        return f"{name}-p{nprocs}" if self.mpi else name


# glibc's malloc with a fixed mmap threshold (32 MiB, its largest) and no trimming: by
# default the threshold moves with what the process freed before, so whether a 4-16 MiB
# temporary costs a page-zeroing pass depended on which benchmarks ran earlier in the
# process (the native allreduce's median moved 1.2 <-> 2.5-5 ms between launches)
_ALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
# waiting ranks yield their core (the timer is CPU time; see the docstring)
_MPI_ENV = {**_ALLOC_ENV, "OMPI_MCA_mpi_yield_when_idle": "1"}
SUITES = {
    "host": Suite(("test_bench_kernels.py", "test_bench_selector.py"), mpi=False,
                  fail="min:15%", env=_ALLOC_ENV),
    "mpi": Suite(("test_bench_allreduce.py",), mpi=True, fail="min:15%",
                 env={**_MPI_ENV, "AUTOTUNE_BENCH_ARRAY": "numpy"}),
    "nccl": Suite(("test_bench_allreduce.py",), mpi=True, fail="min:15%",
                  env={**_MPI_ENV, "AUTOTUNE_BENCH_ARRAY": "cupy", "NCCL_NVLS_ENABLE": "0"}),
}


@dataclass(frozen=True)
class Machine:
    nprocs: int
    suites: tuple[str, ...]
    about: str


MACHINES = {
    # one rank per core: with 4 ranks on the 2 cores the scheduler decided the times (the
    # same code's medians moved 0.44-3.1x between consecutive runs at load 3)
    "cpu-2core": Machine(2, ("host", "mpi"), "the 2-core CPU machine (CI), P=2, one rank per core"),
    "gpu-h100": Machine(2, ("host", "mpi", "nccl"), "2x H100 NVLink, P=2, one GPU per rank"),
    "gpu-h200": Machine(2, ("host", "mpi", "nccl"), "2x H200 NVLink, P=2, one GPU per rank"),
}


class ToolError(RuntimeError):
    pass


# -- which hardware ------------------------------------------------------------------
def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm|c)\)", " ", text.lower())
    text = text.split("@")[0]  # "... CPU @ 2.10GHz": the clock is not the model
    text = re.sub(r"\b(cpu|processor|\d+-core)\b", " ", text)
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "unknown"


def hardware_key(cpu: dict, gpu: str | None) -> str:
    """The baseline folder of this hardware: CPU model, ``-avx512`` where the
    CPU exposes AVX-512 (numpy dispatches its loops, sorts and partitions on
    it: a hypervisor may expose it on one day's VM of a model and not on
    another's), + GPU model."""
    key = _slug(str(cpu.get("brand_raw") or cpu.get("arch_string_raw") or "unknown-cpu"))
    if cpu.get("family") is not None and cpu.get("model") is not None:
        key += f"-family{cpu['family']}-model{cpu['model']}"
    if "avx512f" in (cpu.get("flags") or ()):
        key += "-avx512"
    if gpu:
        key += "+" + _slug(gpu)
    return key


def _gpu_name() -> str | None:
    """GPU 0's name, as conftest records it in machine_info["gpu"] (None without one)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(errors="replace")
    except Exception:
        pass
    return None


def this_hardware() -> str:
    import cpuinfo  # what pytest-benchmark records as machine_info["cpu"]

    return hardware_key(cpuinfo.get_cpu_info(), _gpu_name())


def recorded_hardware(doc: dict) -> str:
    mi = doc.get("machine_info", {})
    return hardware_key(mi.get("cpu", {}), mi.get("gpu"))


def machine_id() -> str:
    from pytest_benchmark.utils import get_machine_id

    return get_machine_id()


def baseline_files(storage: Path, save_name: str) -> list[Path]:
    """``storage`` is baselines/<machine>/<hardware>."""
    return sorted((storage / machine_id()).glob(f"[0-9][0-9][0-9][0-9]_{save_name}.json"))


def other_hardware(machine_dir: Path, hw: str, save_name: str) -> list[Path]:
    """Baselines of the same suite recorded on other hardware of this machine kind."""
    return sorted(p for p in machine_dir.glob(f"*/*/[0-9][0-9][0-9][0-9]_{save_name}.json")
                  if p.parents[1].name != hw)


def obsolete_files(machine_dir: Path) -> list[Path]:
    """Baselines of the layout before hardware folders (<machine>/<machine id>/*.json)."""
    return sorted(machine_dir.glob("*/[0-9][0-9][0-9][0-9]_*.json"))


def forbidden_strings() -> list[str]:
    """This machine's paths, which must not end up in a committed baseline."""
    paths = {str(ROOT), sys.prefix, sys.base_prefix, str(Path(sys.executable).parent),
             str(Path.home())}
    return sorted(p for p in paths if len(p) > 1)


def check_no_paths(path: Path) -> None:
    text = path.read_text()
    found = [p for p in forbidden_strings() if p in text]
    if found:
        path.unlink()
        raise ToolError(f"{path.name} held local paths {found}: removed it; "
                        "see tests/benchmarks/conftest.py's pytest_benchmark_update_* hooks")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _short(fullname: str) -> str:
    return fullname.split("::", 1)[-1]


# -- judging ----------------------------------------------------------------------------
def parse_fail(expr: str) -> tuple[str, float]:
    m = re.fullmatch(rf"({'|'.join(STATS)}):(\d+(?:\.\d+)?)%", expr)
    if not m:
        raise ToolError(f"--fail {expr!r}: expected STAT:PCT% with STAT one of {', '.join(STATS)}")
    return m.group(1), float(m.group(2))


def judge(name: str, base_doc: dict, now_doc: dict, exprs: list[str], native_fail: float,
          gate: bool = True, only=None) -> tuple[list[str], dict, dict]:
    """Compare a run with a baseline, print the table; return (problems, failing, ratios):
    failing = {benchmark: why} beyond the threshold, ratios = {benchmark: {stat: gated
    ratio}} (relative to the reference; the reference's own: absolute), problems the
    rest.  With gate=False only print (another hardware's baseline); with ``only`` (a
    rerun) judge just those benchmarks."""
    base = {b["fullname"]: b for b in base_doc["benchmarks"]}
    now = {b["fullname"]: b for b in now_doc["benchmarks"]}
    problems: list[str] = []
    failing: dict[str, str] = {}
    if only is not None:
        base = {k: v for k, v in base.items() if k in only}
        problems += [f"suite {name}: {_short(k)} missing from the rerun" for k in only if k not in now]
    elif set(base) != set(now):
        problems.append(f"suite {name}: the run and the baseline differ in benchmarks "
                        f"(only in the run: {sorted(map(_short, set(now) - set(base)))}; only in "
                        f"the baseline: {sorted(map(_short, set(base) - set(now)))}); "
                        "re-record with --save")
    fails = [parse_fail(e) for e in exprs]
    print(f"\n{'benchmark':66s} {'stat':>6s} {'now/base':>9s} {'reference':>10s} "
          f"{'relative':>9s}  (relative = benchmark/reference now over the same in the baseline)")
    ratios: dict = {}
    rows = []
    for key in set(base) & set(now):
        b, n = base[key], now[key]
        ref_b, ref_n = b["extra_info"].get("reference"), n["extra_info"].get("reference")
        tb, tn = b.get("options", {}).get("timer"), n.get("options", {}).get("timer")
        if tb != tn:
            problems.append(f"suite {name}: {_short(key)} timed with {tn}, its baseline with {tb}; "
                            "re-record with --save")
            continue
        absolute = {s: n["stats"][s] / b["stats"][s] for s in STATS if b["stats"].get(s)}
        if ref_n is True and ref_b is True:  # the native allreduce: its own time, loosely
            ratios[key] = {}  # gated on its own time only
            limit = 1 + native_fail / 100
            verdict = ""
            if gate and absolute["median"] > limit:
                verdict = f"FAIL (median, limit {limit:.2f}x)"
                failing[key] = (f"suite {name}: {_short(key)} (the reference) median "
                                f"{absolute['median']:.2f}x the baseline (limit {limit:.2f}x)")
            rows.append((0.0, f"{_short(key):66s} {'median':>6s} {absolute['median']:9.3f} "
                              f"{'(is one)':>10s} {'':>9s}  {verdict}"))
            continue
        rs_b, rs_n = b["extra_info"].get("reference_stats"), n["extra_info"].get("reference_stats")
        if not (isinstance(ref_n, str) and ref_n == ref_b and rs_b and rs_n):
            problems.append(f"suite {name}: {_short(key)} lacks the same reference timings in "
                            f"the run ({ref_n!r}) and the baseline ({ref_b!r}); re-record with --save")
            continue
        rel = {s: absolute[s] / (rs_n[s] / rs_b[s]) for s in absolute if rs_b.get(s) and s in rs_n}
        own = n["extra_info"].get("gate")  # the benchmark's own statistic, where it names one
        checks = [(own or s, pct) for s, pct in fails]
        if own and own != b["extra_info"].get("gate"):
            problems.append(f"suite {name}: {_short(key)} gates {own}, its baseline "
                            f"{b['extra_info'].get('gate')}; re-record with --save")
        shown = checks[0][0]
        ratios[key] = {s: rel[s] for s, _ in checks}
        bad = [(s, pct) for s, pct in checks if rel[s] > 1 + pct / 100]
        verdict = ("FAIL " + ", ".join(f"{s} +{(rel[s] - 1) * 100:.0f}% > +{pct:g}%" for s, pct in bad)
                   ) if bad and gate else ""
        if gate and bad:
            failing[key] = "; ".join(
                f"suite {name}: {_short(key)} {s} {rel[s]:.2f}x the baseline relative to its "
                f"reference ({ref_n}; limit +{pct:g}%)" for s, pct in bad)
        rows.append((rel[shown], f"{_short(key):66s} {shown:>6s} {absolute[shown]:9.3f} "
                                 f"{rs_n[shown] / rs_b[shown]:10.3f} {rel[shown]:9.3f}  {verdict}"))
    for _, line in sorted(rows, key=lambda r: -r[0]):
        print(line)
    return problems, failing, ratios


# -- running ----------------------------------------------------------------------------
def pytest_argv(suite: Suite, nprocs: int, bench_args: list[str], extra: list[str],
                nodes: list[str] | None = None) -> list[str]:
    from autotune.launch import mpiexec_argv

    targets = nodes or [str(Path("tests/benchmarks") / f) for f in suite.files]
    argv = [sys.executable, "-m", "pytest", *targets,
            "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=-ra",
            "--benchmark-enable", "--benchmark-sort=name",
            "--benchmark-columns=min,median,iqr,rounds", *bench_args, *extra]
    return mpiexec_argv(nprocs, argv) if suite.mpi else argv


def run_pytest(name: str, args, storage: Path, current: Path, bench: list[str], what: str,
               nodes: list[str] | None = None) -> int | None:
    suite = SUITES[name]
    env = {**suite.env, "AUTOTUNE_BENCH_MACHINE": args.machine}
    if args.rounds:
        env["AUTOTUNE_BENCH_ROUNDS"] = str(args.rounds)
    if args.quick:
        env["AUTOTUNE_BENCH_SIZES"] = "smoke"
    argv = pytest_argv(suite, args.np, [f"--benchmark-storage=file://{storage}",
                                        f"--benchmark-json={current}", *bench], args.pytest_args,
                       nodes)
    print(f"\n=== suite {name} ({what}): {shlex.join(argv)}", flush=True)
    from autotune.launch import one_host_env

    full_env = one_host_env({**os.environ, **env})
    for key in [k for k in full_env if k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))]:
        del full_env[key]  # timed runs are never an xdist worker (pytest-benchmark disables itself)
    try:
        return subprocess.run(argv, cwd=ROOT, env=full_env, timeout=args.timeout).returncode
    except subprocess.TimeoutExpired:
        return None


def record(name: str, args, storage: Path, workdir: Path) -> list[str]:
    """Record the suite's baseline into ``storage`` (replacing its file)."""
    save_name = SUITES[name].save_name(name, args.np)
    for f in baseline_files(storage, save_name):
        f.unlink()
    current = workdir / f"{save_name}.json"
    rc = run_pytest(name, args, storage, current, [f"--benchmark-save={save_name}"], "record")
    if rc is None:
        return [f"suite {name}: timed out after {args.timeout}s"]
    problems = [] if rc == 0 else [f"suite {name}: pytest exited {rc}"]
    saved = baseline_files(storage, save_name)
    if rc == 0 and len(saved) != 1:
        problems.append(f"suite {name}: expected one saved baseline, found {saved}")
    for f in saved:
        check_no_paths(f)
        print(f"recorded {_rel(f)}")
    return problems


def compare(name: str, args, storage: Path, workdir: Path, baseline: Path,
            first: dict | None = None) -> list[str]:
    """Run the suite and judge it against ``baseline``; put the first run's results in
    ``first["doc"]`` if given.  Benchmarks beyond the threshold are run again, alone, up
    to ``args.retries`` times: one fails only if it fails every time (noise comes in
    bursts that a real slowdown does not wait out)."""
    save_name = SUITES[name].save_name(name, args.np)
    base_doc = json.loads(baseline.read_text())
    exprs = args.fail or [SUITES[name].fail]
    problems: list[str] = []
    failing: dict[str, list[str]] = {}
    for attempt in range(1 + args.retries):
        nodes = sorted(failing) if attempt else None
        current = workdir / f"{save_name}.json"
        current.unlink(missing_ok=True)
        what = (f"compare with {_rel(baseline)}" if not attempt else
                f"attempt {attempt + 1} of {1 + args.retries} for the {len(nodes)} beyond the "
                "threshold")
        rc = run_pytest(name, args, storage, current,
                        [f"--benchmark-compare={baseline}"] if not attempt else [], what, nodes)
        if rc is None:
            return problems + [f"suite {name}: timed out after {args.timeout}s"]
        if rc != 0:
            problems.append(f"suite {name}: pytest exited {rc}")
        if not current.exists():
            return problems + [f"suite {name}: no results written"]
        now_doc = json.loads(current.read_text())
        if recorded_hardware(base_doc) != recorded_hardware(now_doc):
            return problems + [f"suite {name}: {_rel(baseline)} was recorded on "
                               f"{recorded_hardware(base_doc)}, this run on "
                               f"{recorded_hardware(now_doc)}"]
        more, fails, r = judge(name, base_doc, now_doc, exprs, args.native_fail,
                               only=set(nodes) if attempt else None)
        problems += more
        if first is not None and not attempt:
            first["doc"] = now_doc
        failing = {k: failing.get(k, []) + [why] for k, why in fails.items()}
        if not failing or problems:
            break
    for k, whys in failing.items():
        problems.append(whys[-1] + (f" (in each of {len(whys)} runs)" if len(whys) > 1 else ""))
    return problems


def keep_faster(name: str, baseline: Path, other: dict, exprs: list[str]) -> list[str]:
    """Make ``baseline`` hold, per benchmark, the faster (relative to its reference, on
    the statistic gated) of itself and the run ``other``: the baseline is then the best
    of two runs, as a compare is the best of up to 1 + --retries runs.  Returns the
    benchmarks taken from ``other``."""
    doc = json.loads(baseline.read_text())
    other_by = {b["fullname"]: b for b in other["benchmarks"]}
    default = parse_fail(exprs[0])[0]

    def key(b):
        ref = b["extra_info"].get("reference")
        if ref is True:
            return b["stats"]["median"]
        stat = b["extra_info"].get("gate") or default
        return b["stats"][stat] / b["extra_info"]["reference_stats"][stat]

    taken = []
    for i, b in enumerate(doc["benchmarks"]):
        o = other_by.get(b["fullname"])
        if o is not None and o["extra_info"].get("reference") == b["extra_info"].get("reference") \
                and key(o) < key(b):
            doc["benchmarks"][i] = o
            taken.append(_short(b["fullname"]))
    if taken:
        baseline.write_text(json.dumps(doc, indent=4))
        check_no_paths(baseline)
    print(f"\nsuite {name}: the baseline keeps, per benchmark, the faster of the recorded and "
          f"the confirming run ({len(taken)} of {len(doc['benchmarks'])} from the latter)")
    return taken


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.benchmarks",
        description="Run the timed benchmarks and compare them with (or record) the saved "
                    "baseline of this machine kind and hardware model; every benchmark is "
                    "judged relative to a reference timed in the same rounds.",
        epilog="machines: " + "; ".join(f"{k}: {m.about}" for k, m in MACHINES.items())
               + ".  Arguments after -- go to pytest (e.g. -k EXPR; --bench-slowdown "
                 "TARGET=FACTOR, a test of the gate).")
    ap.add_argument("--machine", default="cpu-2core",
                    help=f"baseline name: one of {', '.join(MACHINES)} (default cpu-2core), or a "
                         "new name [a-z0-9-] with --np and --suites")
    ap.add_argument("--save", action="store_true",
                    help="record (replace) this hardware's baseline, then confirm it with one compare")
    ap.add_argument("--no-confirm", action="store_true",
                    help="with --save: skip the confirming compare")
    ap.add_argument("--require-baseline", action="store_true",
                    help="fail, instead of recording one, where this hardware has no baseline")
    ap.add_argument("--fail", action="append", default=None, metavar="EXPR",
                    help="threshold STAT:PCT%% on the ratio to the reference for every suite "
                         f"(repeatable; STAT: {', '.join(STATS)}); default per suite: "
                         + ", ".join(f"{k} {v.fail}" for k, v in SUITES.items()).replace("%", "%%"))
    ap.add_argument("--retries", type=int, default=2, metavar="N",
                    help="run the benchmarks beyond the threshold again, alone, up to N times; "
                         "they fail only if they fail every time (default 2)")
    ap.add_argument("--np", type=int, default=None, help="MPI ranks for the collective suites")
    ap.add_argument("--native-fail", type=float, default=100.0, metavar="PCT",
                    help="collective suites: the native allreduce's own limit, %% slower "
                         "than its baseline (default 100)")
    ap.add_argument("--suites", default=None, help="comma-separated subset of "
                                                   + ",".join(SUITES))
    ap.add_argument("--storage", type=Path, default=BASELINES,
                    help="baseline root (default tests/benchmarks/baselines)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds per benchmark")
    ap.add_argument("--quick", action="store_true",
                    help="time the small smoke sizes (to test this tool; not a baseline)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per suite")
    ap.add_argument("pytest_args", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", args.machine):
        ap.error(f"--machine {args.machine!r}: use lowercase letters, digits and '-'")
    if args.save and any(a.startswith("--bench-slowdown") for a in args.pytest_args):
        ap.error("--bench-slowdown is a test of the gate: not with --save")
    known = MACHINES.get(args.machine)
    args.np = args.np or (known.nprocs if known else 4)
    suites = args.suites.split(",") if args.suites else list(known.suites if known else ("host", "mpi"))
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        ap.error(f"unknown suites {unknown}; known: {', '.join(SUITES)}")
    try:
        for e in args.fail or []:
            parse_fail(e)
    except ToolError as e:
        ap.error(str(e))
    machine_dir = (args.storage / args.machine).resolve()
    hw = this_hardware()
    storage = machine_dir / hw
    print(f"machine kind {args.machine}, hardware {hw}: baselines in {_rel(storage)}")
    old = obsolete_files(machine_dir)
    if old:
        print("ignored, the layout before hardware folders (delete them): "
              + ", ".join(_rel(p) for p in old))
    problems: list[str] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as tmp:
        workdir = Path(tmp)
        try:
            recorded = []
            for s in suites:
                save_name = SUITES[s].save_name(s, args.np)
                own = baseline_files(storage, save_name)
                if args.save:
                    problems += record(s, args, storage, workdir)
                    recorded.append(s)
                elif len(own) > 1:
                    raise ToolError(f"suite {s!r}: {len(own)} baselines for {save_name!r} in "
                                    f"{_rel(storage / machine_id())} (need one); re-record with "
                                    f"`python -m tests.benchmarks --machine {args.machine} --save`")
                elif own:
                    problems += compare(s, args, storage, workdir, own[0])
                elif args.require_baseline:
                    problems.append(f"suite {s}: no baseline for this hardware ({hw}) in "
                                    f"{_rel(machine_dir)}; record one with `python -m "
                                    f"tests.benchmarks --machine {args.machine} --save`")
                else:
                    others = other_hardware(machine_dir, hw, save_name)
                    print(f"\n*** suite {s}: NO BASELINE FOR THIS HARDWARE ({hw}) in "
                          f"{_rel(machine_dir)} (there are: "
                          f"{', '.join(p.parents[1].name for p in others) or 'none'}); recording "
                          "one instead of comparing: nothing is gated in this run", flush=True)
                    more = record(s, args, storage, workdir)
                    problems += more
                    if not more:
                        notes.append(f"suite {s}: no baseline for {hw}: recorded "
                                     f"{_rel(baseline_files(storage, save_name)[0])} (not gated; "
                                     "commit it to gate later runs on this hardware)")
                        current = json.loads((workdir / f"{save_name}.json").read_text())
                        for other in others:
                            print(f"\nfor information only, not gated: against "
                                  f"{_rel(other)} (other hardware)")
                            judge(s, json.loads(other.read_text()), current,
                                  args.fail or [SUITES[s].fail], args.native_fail, gate=False)
            if args.save and not problems and not args.no_confirm:
                # a baseline recorded during a burst of load would fail every later compare:
                # check at once that it reproduces, and keep the better of the two runs
                for s in recorded:
                    save_name = SUITES[s].save_name(s, args.np)
                    baseline = baseline_files(storage, save_name)[0]
                    first: dict = {}
                    more = compare(s, args, storage, workdir, baseline, first)
                    problems += more
                    if not more and "doc" in first:
                        keep_faster(s, baseline, first["doc"], args.fail or [SUITES[s].fail])
                if problems:
                    problems.append("the new baseline did not reproduce in the confirming "
                                    "compare: re-record it when the machine is quieter")
        except ToolError as e:
            problems.append(str(e))
    where = args.machine + ("" if args.np == (known.nprocs if known else 4) else f" --np {args.np}")
    for n in notes:
        print("\nNOTE: " + n)
    if problems:
        print("\nFAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    if args.save:
        print(f"\nbaseline recorded for {hw}; compare with: python -m tests.benchmarks "
              f"--machine {where}")
    elif notes and len(notes) == len(suites):
        print(f"\nno baseline for {hw} yet: recorded one, nothing gated")
    else:
        limits = args.fail or sorted({SUITES[s].fail for s in suites})
        print(f"\nno regression beyond {' / '.join(limits)} (relative to each benchmark's "
              f"reference) against the {args.machine} baseline of {hw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

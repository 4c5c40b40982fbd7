"""Performance-regression check: run the timed benchmarks, compare with a saved baseline.

From the repository root:

    python -m tests.benchmarks --machine cpu-2core            # compare; exit 1 on a regression
    python -m tests.benchmarks --machine cpu-2core --save     # (re)record the baseline

Everything is pytest-benchmark's own machinery: each suite is one pytest run
with ``--benchmark-enable`` and either ``--benchmark-save`` (record) or
``--benchmark-compare=<baseline file> --benchmark-compare-fail=<EXPR>``
(compare), which fails the run when a benchmark's statistic regresses beyond
EXPR.  Suites:

  host  kernels (numpy; cupy where a GPU is) and the selector, one process
  mpi   every algorithm over MPI with numpy data, under ``mpiexec -n P``
  nccl  every algorithm over NCCL with cupy data, under ``mpiexec -n P`` (GPU)

Baselines live in the repository, one folder per machine kind:
``tests/benchmarks/baselines/<machine>/<pytest-benchmark machine id>/NNNN_<suite>.json``
(the machine id is e.g. ``Linux-CPython-3.11-64bit``).  Recording replaces
the suite's previous file and then runs one compare against the new
baseline to confirm it reproduces (a baseline recorded during a burst of
load on a shared machine would fail every later compare).  The compare also fails when the run and the
baseline do not hold the same benchmarks (re-record after adding one).

Default thresholds (docs/BENCHMARKS.md, "Performance regression tracking",
has the run-to-run spread they were chosen from): ``min:25%`` for the host
suite (one process: its fastest round is what machine load disturbs least),
``median:25%`` for the collective suites (P ranks in lockstep: their fastest
round is as noisy as the median).  ``--fail`` replaces them for every suite,
e.g. ``--fail median:10%``.

The collective suites are compared *relative to the native allreduce timed in
the same run* (``mpi``, resp. ``nccl``): a benchmark fails when
(now / now_native) / (baseline / baseline_native) exceeds the threshold.  The
whole machine drifting (another VM on the host, clock changes: every
collective 1.2-1.6x slower between two consecutive runs at load 1 on the CPU
machine) cancels out; a change in one algorithm does not.  The native
allreduce itself is gated on its absolute median at ``--native-fail`` (100%:
only gross regressions of the shared communicator layer).  pytest-benchmark
still prints its own comparison table.
"""
from __future__ import annotations

import argparse
import json
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


@dataclass(frozen=True)
class Suite:
    files: tuple[str, ...]
    mpi: bool
    fail: str  # default --benchmark-compare-fail expression
    env: dict = field(default_factory=dict)
    reference: str | None = None  # collective suites: compared relative to this algorithm

    def save_name(self, name: str, nprocs: int) -> str:
        return f"{name}-p{nprocs}" if self.mpi else name


SUITES = {
    # one process: the fastest round is what load disturbs least
    "host": Suite(("test_bench_kernels.py", "test_bench_selector.py"), mpi=False,
                  fail="min:25%"),
    # P ranks in lockstep: the median round (the fastest is as noisy as the rest)
    "mpi": Suite(("test_bench_allreduce.py",), mpi=True, fail="median:25%",
                 env={"AUTOTUNE_BENCH_ARRAY": "numpy"}, reference="mpi"),
    "nccl": Suite(("test_bench_allreduce.py",), mpi=True, fail="median:25%",
                  env={"AUTOTUNE_BENCH_ARRAY": "cupy", "NCCL_NVLS_ENABLE": "0"}, reference="nccl"),
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


def machine_id() -> str:
    from pytest_benchmark.utils import get_machine_id

    return get_machine_id()


def baseline_files(storage: Path, save_name: str) -> list[Path]:
    return sorted((storage / machine_id()).glob(f"[0-9][0-9][0-9][0-9]_{save_name}.json"))


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


def load_stats(path: Path) -> dict[str, dict]:
    return {b["fullname"]: b["stats"] for b in json.loads(path.read_text())["benchmarks"]}


def pytest_argv(suite: Suite, nprocs: int, bench_args: list[str], extra: list[str]) -> list[str]:
    from autotune._mpirun import mpiexec_argv

    argv = [sys.executable, "-m", "pytest", *(str(Path("tests/benchmarks") / f) for f in suite.files),
            "-q", "-p", "no:cacheprovider", "--benchmark-enable", "--benchmark-sort=name",
            "--benchmark-columns=min,median,iqr,rounds", *bench_args, *extra]
    return mpiexec_argv(nprocs, argv) if suite.mpi else argv


def run_suite(name: str, args, storage: Path, workdir: Path, ratios: dict | None = None) -> list[str]:
    """Run one suite; return the problems found (empty: it passed).

    A compare fills ``ratios`` with {benchmark: {stat: now / baseline}}."""
    from autotune._mpirun import mpi_env

    suite = SUITES[name]
    save_name = suite.save_name(name, args.np)
    existing = baseline_files(storage, save_name)
    current = workdir / f"{save_name}.json"
    bench = [f"--benchmark-storage=file://{storage}", f"--benchmark-json={current}"]
    if args.save:
        bench.append(f"--benchmark-save={save_name}")
    else:
        if len(existing) != 1:
            raise ToolError(
                f"suite {name!r}: {len(existing)} baselines for {save_name!r} in "
                f"{storage / machine_id()} (need exactly one); record one with "
                f"`python -m tests.benchmarks --machine {args.machine} --save`")
        bench.append(f"--benchmark-compare={existing[0]}")
        if not suite.reference:  # relative suites are judged below, after the run
            bench += [f"--benchmark-compare-fail={e}" for e in (args.fail or [suite.fail])]
    env = {**suite.env, "AUTOTUNE_BENCH_MACHINE": args.machine}
    if args.rounds:
        env["AUTOTUNE_BENCH_ROUNDS"] = str(args.rounds)
    if args.quick:
        env["AUTOTUNE_BENCH_SIZES"] = "smoke"
    argv = pytest_argv(suite, args.np, bench, args.pytest_args)
    print(f"\n=== suite {name} ({'record' if args.save else 'compare'}): {shlex.join(argv)}",
          flush=True)
    try:
        rc = subprocess.run(argv, cwd=ROOT, env=mpi_env(env), timeout=args.timeout).returncode
    except subprocess.TimeoutExpired:
        return [f"suite {name}: timed out after {args.timeout}s"]
    problems = [] if rc == 0 else [f"suite {name}: pytest exited {rc}"
                                   + (" (performance regressed)" if not args.save and not suite.reference else "")]
    if not current.exists():
        return problems + [f"suite {name}: no results written"]
    if args.save:
        saved = baseline_files(storage, save_name)
        if rc == 0 and len(saved) != 1:
            problems.append(f"suite {name}: expected one saved baseline, found {saved}")
        for f in saved:
            check_no_paths(f)
            print(f"recorded {f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}")
        return problems
    base, now = load_stats(existing[0]), load_stats(current)
    if set(base) != set(now):
        problems.append(f"suite {name}: the run and the baseline differ in benchmarks "
                        f"(only in the run: {sorted(set(now) - set(base))}; only in the "
                        f"baseline: {sorted(set(base) - set(now))}); re-record with --save")
    common = set(base) & set(now)
    ref = None
    if suite.reference:
        refs = [k for k in common if re.search(rf"\[{re.escape(suite.reference)}-", k)]
        if len(refs) != 1:
            return problems + [f"suite {name}: no single native reference "
                               f"{suite.reference!r} among the benchmarks"]
        ref = refs[0]
    print(f"\n{'benchmark':72s} {'median now/base':>16s} {'min now/base':>13s}"
          + (f" {'median rel. to ' + suite.reference:>22s}" if ref else ""))
    exprs = args.fail or [suite.fail]
    for key in sorted(common, key=lambda k: now[k]["median"] / base[k]["median"]):
        r = {stat: now[key][stat] / base[key][stat] for stat in ("median", "min", "mean")}
        line = f"{key.split('::', 1)[-1]:72s} {r['median']:16.3f} {r['min']:13.3f}"
        if ref:
            rel = {stat: r[stat] / (now[ref][stat] / base[ref][stat]) for stat in r}
            line += f" {rel['median']:22.3f}"
            if key == ref:
                limit = 1 + args.native_fail / 100
                if r["median"] > limit:
                    problems.append(f"suite {name}: native {suite.reference} median "
                                    f"{r['median']:.2f}x the baseline (limit {limit:.2f}x)")
            else:
                for expr in exprs:
                    stat, pct = _parse_fail(expr)
                    if rel[stat] > 1 + pct / 100:
                        problems.append(f"suite {name}: {key.split('::', 1)[-1]} {stat} "
                                        f"{rel[stat]:.2f}x the baseline relative to "
                                        f"{suite.reference} (limit +{pct:g}%)")
                r = rel  # the confirming compare judges what the compare judges
        if ratios is not None and key != ref:
            ratios[key] = r
        print(line)
    return problems


def _parse_fail(expr: str) -> tuple[str, float]:
    m = re.fullmatch(r"(min|max|mean|median):(\d+(?:\.\d+)?)%", expr)
    if not m:
        raise ToolError(f"--fail {expr!r}: only STAT:PCT% (STAT = min, max, mean, median) is "
                        "supported for the collective suites")
    return m.group(1), float(m.group(2))


def inflated(suite: Suite, ratios: dict) -> list[str]:
    """Benchmarks whose new baseline is slower than a run right after it by more
    than the suite's threshold (recorded during a burst of load): the compare
    would then miss regressions of that size."""
    stat, pct = _parse_fail(suite.fail)
    return [f"{k.split('::', 1)[-1]}: {stat} now/baseline {r[stat]:.2f}"
            for k, r in ratios.items() if stat in r and r[stat] < 1 / (1 + pct / 100)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.benchmarks",
        description="Run the timed benchmarks and compare them with (or record) the saved "
                    "baseline of a machine kind.",
        epilog="machines: " + "; ".join(f"{k}: {m.about}" for k, m in MACHINES.items())
               + ".  Arguments after -- go to pytest.")
    ap.add_argument("--machine", required=True,
                    help=f"baseline name: one of {', '.join(MACHINES)} (or a new name "
                         "[a-z0-9-], with --np and --suites)")
    ap.add_argument("--save", action="store_true",
                    help="record (replace) the baseline, then confirm it with one compare")
    ap.add_argument("--no-confirm", action="store_true",
                    help="with --save: skip the confirming compare")
    ap.add_argument("--fail", action="append", default=None, metavar="EXPR",
                    help="pytest-benchmark --benchmark-compare-fail expression for every "
                         "suite (repeatable); default per suite: "
                         + ", ".join(f"{k} {v.fail}" for k, v in SUITES.items()).replace("%", "%%"))
    ap.add_argument("--np", type=int, default=None, help="MPI ranks for the collective suites")
    ap.add_argument("--native-fail", type=float, default=100.0, metavar="PCT",
                    help="collective suites: the native allreduce's own absolute limit, %% slower "
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
    known = MACHINES.get(args.machine)
    args.np = args.np or (known.nprocs if known else 4)
    suites = args.suites.split(",") if args.suites else list(known.suites if known else ("host", "mpi"))
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        ap.error(f"unknown suites {unknown}; known: {', '.join(SUITES)}")
    storage = (args.storage / args.machine).resolve()
    problems = []
    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as tmp:
        try:
            if args.save:  # replace: the suites' old baselines go first
                for s in suites:
                    for f in baseline_files(storage, SUITES[s].save_name(s, args.np)):
                        f.unlink()
            for s in suites:
                problems += run_suite(s, args, storage, Path(tmp))
            if args.save and not problems and not args.no_confirm:
                # a baseline recorded during a burst of load would fail every later
                # compare: check at once that it reproduces
                args.save = False
                for s in suites:
                    ratios: dict = {}
                    problems += run_suite(s, args, storage, Path(tmp), ratios)
                    slow = inflated(SUITES[s], ratios)
                    if slow:
                        problems.append(f"suite {s}: baseline slower than the confirming run "
                                        f"beyond {SUITES[s].fail}: " + "; ".join(slow))
                args.save = True
                if problems:
                    problems.append("the new baseline did not reproduce in the confirming "
                                    "compare (either way): re-record it when the machine is quiet")
        except ToolError as e:
            problems.append(str(e))
    where = args.machine + ("" if args.np == (known.nprocs if known else 4) else f" --np {args.np}")
    if problems:
        print("\nFAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    if args.save:
        print(f"\nbaseline recorded; compare with: python -m tests.benchmarks --machine {where}")
    else:
        limits = args.fail or sorted({SUITES[s].fail for s in suites})
        print(f"\nno regression beyond {' / '.join(limits)} against the {args.machine} baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())

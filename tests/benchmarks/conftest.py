"""Fixtures of the performance benchmarks (pytest-benchmark).

Two modes, chosen by pytest-benchmark's own switch:
  * smoke (``--benchmark-disable``, the default in pyproject's addopts, what CI
    runs): every benchmark body runs once at a small size, untimed, and its
    result is checked, so each benchmark is also a test;
  * timed (``--benchmark-enable``, what ``python -m tests.benchmarks`` passes):
    the fixed sizes below, a fixed number of rounds, each benchmark with a
    reference timed in the same rounds (``measure``), in CPU time of the process
    for host data and wall time for GPU data (pytest-benchmark's ``timer``).

``--bench-slowdown kernels.NAME=F`` / ``collectives.NAME=F`` (test_bench_gate.py)
makes one kernel or one algorithm F times slower, to test the regression gate.

Under ``mpiexec -n P`` (the collective benchmarks) every rank runs pytest.
Benchmarks use ``benchmark.pedantic`` with fixed rounds, so all ranks call the
collectives in lockstep (pytest-benchmark's calibration would pick different
round counts per rank and deadlock).  Only rank 0 saves, compares and
prints; the other ranks' pytest output goes to a log that is shown if they
fail.  An exception on any rank aborts the MPI job (the others would wait
forever inside a collective).

Environment (set by ``python -m tests.benchmarks``):
  AUTOTUNE_BENCH_ROUNDS   timed rounds per benchmark (default per group)
  AUTOTUNE_BENCH_SIZES    ``smoke`` to time the small sizes (tests of the tool)
  AUTOTUNE_BENCH_ARRAY    ``numpy`` (MPI backend) or ``cupy`` (NCCL backend)
                          for the collective benchmarks
  AUTOTUNE_BENCH_MACHINE  the baseline's machine name, recorded as ``node``
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np
import pytest

from autotune.launch import under_mpi

# Timed rounds per group (the compare gates their min, a few benchmarks their median,
# relative to a reference: see python -m tests.benchmarks --help and test_bench_gate.py)
ROUNDS = {"kernel": 200, "allreduce": 200, "selector": 200, "train": 3}
WARMUP = {"kernel": 2, "allreduce": 3, "selector": 10, "train": 1}


def _world():
    """(rank, size) of the MPI world; (0, 1) without a launcher (no MPI init)."""
    if not under_mpi():
        return 0, 1
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


RANK, WORLD_SIZE = _world()
_LOG = None


def is_timed(config) -> bool:
    """True when pytest-benchmark will time (``--benchmark-enable``)."""
    disabled = config.getoption("benchmark_disable") and not config.getoption("benchmark_enable")
    return not disabled


def smoke_sizes(config) -> bool:
    return not is_timed(config) or os.environ.get("AUTOTUNE_BENCH_SIZES") == "smoke"


def timed_rounds(group: str) -> tuple[int, int]:
    """(rounds, warmup rounds) of a timed benchmark in ``group``."""
    env = os.environ.get("AUTOTUNE_BENCH_ROUNDS")
    if env:
        r = int(env)
        if r < 1:
            raise ValueError(f"AUTOTUNE_BENCH_ROUNDS must be >= 1, got {env!r}")
        return r, min(WARMUP[group], 1)
    return ROUNDS[group], WARMUP[group]


# -- ranks other than 0: run in lockstep, but neither save nor print ---------------
_RANK0_ONLY = {"benchmark_save": None, "benchmark_autosave": False, "benchmark_json": None,
               "benchmark_compare": [], "benchmark_compare_fail": None,
               "benchmark_histogram": None, "benchmark_cprofile_dump": None}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    global _LOG
    _SLOWDOWNS[:] = _install_slowdowns(config)
    if RANK == 0:
        return
    for opt, value in _RANK0_ONLY.items():
        if hasattr(config.option, opt):
            setattr(config.option, opt, value)
    bs = getattr(config, "_benchmarksession", None)  # this conftest loaded late
    if bs is not None:
        bs.save = bs.autosave = bs.json = bs.histogram = None
        bs.compare, bs.compare_fail, bs.compared_mapping = [], None, {}
    # the terminal reporter is made after this hook: it will write to the log
    _LOG = tempfile.NamedTemporaryFile("w+", prefix=f"autotune-bench-rank{RANK}-",
                                       suffix=".log", delete=False)
    sys.stdout = _LOG


_EXIT = [0]


def pytest_sessionfinish(session, exitstatus):
    _EXIT[0] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Undo the slowdowns; other ranks: show their output only when they failed, then
    drop the log."""
    while _RESTORE:
        owner, attr, original = _RESTORE.pop()
        if original is None:
            delattr(owner, attr)
        else:
            setattr(owner, attr, original)
    if _LOG is None:
        return
    _LOG.flush()
    if _EXIT[0] not in (0, 5):  # 5: nothing collected
        _LOG.seek(0)
        sys.stderr.write(f"[rank {RANK}] pytest exited {_EXIT[0]}; its output:\n"
                         + _LOG.read()[-6000:])
    _LOG.close()
    os.unlink(_LOG.name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    outcome = yield
    exc = outcome.excinfo
    if exc is None or WORLD_SIZE == 1:
        return
    if issubclass(exc[0], (pytest.skip.Exception, pytest.xfail.Exception)):
        return
    from mpi4py import MPI

    sys.stderr.write(f"[rank {RANK}] {item.nodeid} failed; aborting the MPI job so that "
                     "no rank waits in a collective:\n"
                     + str(item.repr_failure(pytest.ExceptionInfo.from_exc_info(exc))) + "\n")
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(1)


# -- a deliberate slowdown, to test the regression gate (test_bench_gate.py) -------------
def pytest_addoption(parser):
    parser.addoption(
        "--bench-slowdown", action="append", default=[], metavar="TARGET=FACTOR",
        help="tests of the regression gate only: make TARGET take FACTOR times as long by "
             "spinning after each call for (FACTOR-1) times the call's own time; TARGET is "
             "kernels.NAME (the function the benchmarks call) or collectives.NAME (that "
             "algorithm's call); refused together with --benchmark-save")


_RESTORE: list = []


def _slowed(fn, factor: float, only_type=None):
    """``fn`` followed by a busy wait of (factor - 1) x its duration: CPU time of this
    thread for host data, wall time after a device synchronize for cupy data (what the
    benchmarks time in each case)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if only_type is not None and type(args[0]) is not only_type:  # not a subclass
            return fn(*args, **kwargs)
        cp = sys.modules.get("cupy")
        gpu = cp is not None and any(isinstance(a, cp.ndarray) for a in args)
        clock = time.perf_counter if gpu else time.thread_time
        t0 = clock()
        out = fn(*args, **kwargs)
        if gpu:
            cp.cuda.get_current_stream().synchronize()
        end = clock() + (factor - 1) * (clock() - t0)
        while clock() < end:
            pass
        return out

    return wrapper


def _install_slowdowns(config) -> list[str]:
    specs = config.getoption("bench_slowdown", default=None) or []
    if not specs:
        return []
    if config.getoption("benchmark_save", default=None) or \
            config.getoption("benchmark_autosave", default=False):
        raise pytest.UsageError("--bench-slowdown: refused while saving a baseline")
    done = []
    for spec in specs:
        target, _, factor = spec.partition("=")
        pkg, _, name = target.partition(".")
        try:
            f = float(factor)
        except ValueError:
            f = 0.0
        if f < 1 or pkg not in ("kernels", "collectives") or not name:
            raise pytest.UsageError(f"--bench-slowdown {spec!r}: expected kernels.NAME=FACTOR "
                                    "or collectives.NAME=FACTOR with FACTOR >= 1")
        if pkg == "kernels":
            import kernels

            fn = getattr(kernels, name, None)
            if not callable(fn):
                raise pytest.UsageError(f"--bench-slowdown: no function kernels.{name}")
            setattr(kernels, name, _slowed(fn, f))
            _RESTORE.append((kernels, name, fn))
        else:
            from collectives import ALGORITHMS

            cls = ALGORITHMS.get(name)
            if cls is None:
                raise pytest.UsageError(f"--bench-slowdown: no algorithm {name!r} in "
                                        f"collectives.ALGORITHMS ({', '.join(ALGORITHMS)})")
            _RESTORE.append((cls, "__call__", vars(cls).get("__call__")))  # None: inherited
            cls.__call__ = _slowed(cls.__call__, f, only_type=cls)
        done.append(f"{target} x{f:g}")
    return done


_SLOWDOWNS: list[str] = []


def pytest_report_header(config):
    if _SLOWDOWNS:
        return [f"SLOWDOWN INJECTED (a test of the regression gate): {', '.join(_SLOWDOWNS)}"]
    return []


# -- what goes into a saved baseline: no paths, the machine's name ---------------------
def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["node"] = os.environ.get("AUTOTUNE_BENCH_MACHINE", "unnamed")
    machine_info["numpy"] = np.__version__
    machine_info["cores"] = os.cpu_count()
    machine_info["mpi_ranks"] = WORLD_SIZE
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            props = cupy.cuda.runtime.getDeviceProperties(0)
            machine_info["gpu"] = props["name"].decode(errors="replace")
            machine_info["cupy"] = cupy.__version__
    except Exception:  # no cupy or no device: a CPU machine
        pass
    if under_mpi():
        from mpi4py import MPI

        machine_info["mpi"] = " ".join(MPI.Get_library_version().split(",")[0].split())


def pytest_benchmark_update_commit_info(config, commit_info):
    commit_info["project"] = "autotune-collectives"


def pytest_generate_tests(metafunc):
    """A module's ``SIZES = {"smoke": n, "timed": n}`` parametrizes its ``n``
    (the size then shows in the benchmark's name, which the baseline keys on)."""
    sizes = getattr(metafunc.module, "SIZES", None)
    if sizes is not None and "n" in metafunc.fixturenames:
        n = sizes["smoke" if smoke_sizes(metafunc.config) else "timed"]
        metafunc.parametrize("n", [n], ids=[f"n{n}"])


# -- fixtures ---------------------------------------------------------------------
@pytest.fixture(scope="session")
def smoke(pytestconfig) -> bool:
    """True when sizes are the small smoke ones."""
    return smoke_sizes(pytestconfig)


def _stats(values) -> dict:
    """pytest-benchmark's statistics of ``values`` (the numeric ones)."""
    from pytest_benchmark.stats import Stats

    s = Stats()
    for v in values:
        s.update(v)
    return {k: v for k, v in s.as_dict().items() if isinstance(v, (int, float))}


#: reference samples per benchmark at least (benchmarks of few rounds time it repeatedly)
REFERENCE_SAMPLES = 50


@pytest.fixture
def measure(benchmark):
    """``measure(group, fn, setup=None, *, reference)``: time ``fn`` with fixed rounds.

    ``reference`` is what ``python -m tests.benchmarks`` judges this benchmark
    against, measured in the same rounds so that the machine's speed and load
    cancel out:

      * ``(name, ref_fn)`` or ``(name, ref_fn, sync)``: in every round (warmup
        included), after ``setup`` and before ``fn``, ``ref_fn()`` is timed with
        this benchmark's timer, between two calls of ``sync()`` (untimed; the
        collectives' barrier, so that ranks enter both calls together); the
        reference's timings are saved as ``extra_info["reference_stats"]``
        (pytest-benchmark's own statistics of them), ``name`` as
        ``extra_info["reference"]``.  With fewer than REFERENCE_SAMPLES rounds
        it is timed several times a round.
      * ``True``: this benchmark is itself a reference (the native allreduce);
        the tool gates it on its own time, loosely.

    ``gate`` names the statistic the tool gates for this benchmark (default: the
    suite's, see ``python -m tests.benchmarks --help``), where measurements showed
    another one steadier.  Returns fn's result (of the last round; of its one call
    in smoke mode).
    """
    def run(group, fn, setup=None, *, reference, gate=None):
        benchmark.group = group
        if gate is not None:  # the statistic the tool gates (default: the suite's)
            benchmark.extra_info["gate"] = gate
        rounds, warmup = timed_rounds(group)
        if reference is True:
            benchmark.extra_info["reference"] = True
            return benchmark.pedantic(fn, setup=setup, rounds=rounds, warmup_rounds=warmup,
                                      iterations=1)
        if not (isinstance(reference, tuple) and len(reference) in (2, 3)
                and isinstance(reference[0], str) and callable(reference[1])):
            raise TypeError("reference must be True or (name, fn[, setup]), got "
                            f"{reference!r}")
        name, ref_fn, sync = (*reference, None)[:3]
        timer = benchmark._timer  # this benchmark's own (see the timer marks)
        times: list[float] = []
        repeats = 1 if benchmark.disabled else max(1, -(-REFERENCE_SAMPLES // rounds))

        def setup_with_reference():
            args = setup() if setup is not None else None
            for _ in range(repeats):
                if sync is not None:
                    sync()
                t0 = timer()
                ref_fn()
                times.append(timer() - t0)
            if sync is not None:
                sync()
            return args

        out = benchmark.pedantic(fn, setup=setup_with_reference, rounds=rounds,
                                 warmup_rounds=warmup, iterations=1)
        benchmark.extra_info["reference"] = name
        if not benchmark.disabled:
            benchmark.extra_info["reference_stats"] = _stats(times[warmup * repeats:])
        return out

    return run


#: CPU time of the process for host (numpy) work: what another process on the same
#: cores takes (preemption) is not counted; wall time where a GPU does the work
CPU_TIMER = pytest.mark.benchmark(timer=time.process_time)
WALL_TIMER = pytest.mark.benchmark(timer=time.perf_counter)


ARRAY_MODULES = [pytest.param("numpy", marks=CPU_TIMER), pytest.param("cupy", marks=WALL_TIMER)]


def gpu_present() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.fixture(scope="session", params=ARRAY_MODULES)
def xp(request):
    """numpy, and cupy where a GPU is present (skipped otherwise)."""
    if request.param == "numpy":
        return np
    if not gpu_present():
        pytest.skip("cupy benchmarks need cupy and a CUDA GPU")
    import cupy

    return cupy

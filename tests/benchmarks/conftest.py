"""Fixtures of the performance benchmarks (pytest-benchmark).

Two modes, chosen by pytest-benchmark's own switch:
  * smoke (``--benchmark-disable``, the default in pyproject's addopts, what CI
    runs): every benchmark body runs once at a small size, untimed, and its
    result is checked, so each benchmark is also a test;
  * timed (``--benchmark-enable``, what ``python -m tests.benchmarks`` passes):
    the fixed sizes below, a fixed number of rounds.

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

import numpy as np
import pytest

from autotune._mpirun import under_mpi

# Timed rounds per group; the compare checks their min (host suite) or median
# (collective suites), see python -m tests.benchmarks --help.
ROUNDS = {"kernel": 50, "allreduce": 50, "selector": 200, "train": 3}
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
    """Other ranks: show their output only when they failed, then drop the log."""
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


@pytest.fixture
def measure(benchmark, pytestconfig):
    """``measure(group, fn, setup=None)``: time ``fn`` with fixed rounds.

    Returns fn's result (of the last round; of its one call in smoke mode).
    """

    def run(group, fn, setup=None):
        benchmark.group = group
        rounds, warmup = timed_rounds(group)
        return benchmark.pedantic(fn, setup=setup, rounds=rounds, warmup_rounds=warmup,
                                  iterations=1)

    return run


ARRAY_MODULES = ["numpy", "cupy"]


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

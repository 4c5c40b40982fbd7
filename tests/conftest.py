"""Fixtures for the tests under tests/ (helpers live in support.py).

GPU cases (marked ``gpu``, and the GPU-only modules) are collected only where a
CUDA GPU and cupy are: a CPU machine runs every CPU case and says in the summary
how many GPU cases it left out.

Cases marked ``quiet`` judge timings: they run while no other case of the run
does (the suite runs on two xdist workers, whose MPI jobs share the two cores).
Every case holds a shared lock on one file of the run; a ``quiet`` case holds
it exclusively.  Cases marked ``mpi`` run one at a time (a second lock): two
oversubscribed jobs on two cores spin against each other and cost more CPU
than they overlap; the other worker meanwhile runs the cases without MPI.  A
fixture wider than a case that launches mpiexec takes the same locks itself
(``mpi_job``), since it is set up before its first case's own.
"""
import contextlib
import fcntl
from pathlib import Path

import pytest

from support import HAS_GPU, run_mpi

#: modules whose every case needs a GPU
GPU_MODULES = ["test_gpu_kernels.py"]
collect_ignore = [] if HAS_GPU else list(GPU_MODULES)
_LEFT_OUT: list[str] = []


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    keep = [it for it in items if it.get_closest_marker("gpu") is None]
    _LEFT_OUT.extend(it.nodeid for it in items if it.get_closest_marker("gpu") is not None)
    items[:] = keep


def pytest_terminal_summary(terminalreporter):
    if not HAS_GPU:
        terminalreporter.write_line(
            f"no CUDA GPU: GPU cases not collected ({', '.join(GPU_MODULES)} and "
            f"{len(_LEFT_OUT)} marked gpu); run them on a GPU machine (benchmarks/gpu_suite.sh)")


@pytest.fixture
def mpirun():
    return run_mpi


def _lock_files(config, tmp_path_factory) -> tuple[Path, Path]:
    """(quiet.lock, mpi.lock) of this run: in its base temporary folder (pytest-N,
    the workers' popen-gwN sit in it; pytest keeps the last few), shared by its
    workers."""
    base = tmp_path_factory.getbasetemp()
    quiet = (base.parent if hasattr(config, "workerinput") else base) / "quiet.lock"
    return quiet, quiet.with_name("mpi.lock")


@contextlib.contextmanager
def _held(quiet_lock: Path, mpi_lock: Path | None, *, quiet: bool = False):
    with contextlib.ExitStack() as stack:
        for path, mode in ((quiet_lock, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH),
                           (mpi_lock, fcntl.LOCK_EX)):
            if path is not None:
                fcntl.flock(stack.enter_context(open(path, "a")), mode)
        yield


@pytest.fixture(scope="session")
def mpi_job(pytestconfig, tmp_path_factory):
    """``with mpi_job(): ...``: for a fixture wider than a case that launches
    mpiexec (it is set up before the case's own lock is taken): holds the locks
    an ``mpi`` case holds.  Its cases are marked ``mpi(in_fixture=True)``: they
    hold no MPI lock themselves."""
    quiet, mpi = _lock_files(pytestconfig, tmp_path_factory)
    return lambda: _held(quiet, mpi)


@pytest.fixture(autouse=True)
def _quiet_and_mpi_cases_run_alone(request, tmp_path_factory):
    quiet, mpi = _lock_files(request.config, tmp_path_factory)
    marker = request.node.get_closest_marker("mpi")
    launches = marker is not None and not marker.kwargs.get("in_fixture", False)
    with _held(quiet, mpi if launches else None,
               quiet=request.node.get_closest_marker("quiet") is not None):
        yield

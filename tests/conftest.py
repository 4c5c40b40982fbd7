"""Fixtures for the tests under tests/ (helpers live in support.py).

GPU cases (marked ``gpu``, and the GPU-only modules) are collected only where a
CUDA GPU and cupy are: a CPU machine runs every CPU case and says in the summary
how many GPU cases it left out.

Cases marked ``quiet`` judge timings: they run while no other case of the run
does (the suite runs on two xdist workers, whose MPI jobs share the two cores).
Every case holds a shared lock on one file of the run; a ``quiet`` case holds
it exclusively.  Cases marked ``mpi`` run one at a time (a second lock): two
oversubscribed jobs on two cores spin against each other and cost more CPU
than they overlap; the other worker meanwhile runs the cases without MPI.
"""
import fcntl

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


@pytest.fixture(autouse=True)
def _quiet_and_mpi_cases_run_alone(request, tmp_path_factory):
    # the run's base temporary folder (pytest-N, the workers' popen-gwN sit in it;
    # pytest keeps the last few): one lock file per run, shared by its workers
    base = tmp_path_factory.getbasetemp()
    lock = (base.parent if hasattr(request.config, "workerinput") else base) / "quiet.lock"
    with open(lock, "a") as f, open(lock.with_name("mpi.lock"), "a") as m:
        quiet = request.node.get_closest_marker("quiet") is not None
        fcntl.flock(f, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
        if request.node.get_closest_marker("mpi") is not None:
            fcntl.flock(m, fcntl.LOCK_EX)
        yield

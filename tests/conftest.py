"""Fixtures for the tests under tests/ (helpers live in support.py).

GPU cases (marked ``gpu``, and the GPU-only modules) are collected only where a
CUDA GPU and cupy are: a CPU machine runs every CPU case and says in the summary
how many GPU cases it left out.
"""
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

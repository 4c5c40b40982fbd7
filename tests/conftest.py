"""Fixtures for the tests under tests/ (helpers live in support.py)."""
import pytest

from support import HAS_GPU, ROOT, requires_gpu, run_mpi  # noqa: F401  (re-exported)


@pytest.fixture
def mpirun():
    return run_mpi

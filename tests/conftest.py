"""Fixtures for the tests under tests/ (helpers live in support.py)."""
import pytest

from support import run_mpi


@pytest.fixture
def mpirun():
    return run_mpi

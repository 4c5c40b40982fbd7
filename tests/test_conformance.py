"""DESIGN.md's invariants for every registered algorithm under real mpiexec, P = 1..8.

The suite itself lives in tests/mpi/conformance.py (one runner, applied to
``collectives.ALGORITHMS``); here pytest launches it once per process count.
"""
import pytest

from collectives import ALGORITHMS
from tests.mpi import VARIANTS


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 5, 6, 7, 8])
def test_conformance(mpirun, nprocs):
    out = mpirun(nprocs, "tests.mpi.conformance", timeout=900)
    assert f"conformance P={nprocs}:" in out and "cases passed" in out
    for name, cls in ALGORITHMS.items():
        if "mpi" not in cls.backends:
            continue
        assert f"  {name} " in out or f"  {name:10s} ok" in out
    for spec in VARIANTS:
        assert f"  {spec} " in out or f"  {spec:10s} ok" in out

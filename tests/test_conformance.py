"""DESIGN.md's invariants for every registered algorithm under real mpiexec, P = 1..8.

The suite itself lives in tests/mpi/conformance.py (one runner, applied to
``collectives.ALGORITHMS``); here pytest launches it once per process count.
"""
import pytest

from collectives import ALGORITHMS
from support import gpu_mpi
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


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_half_precision_inputs(mpirun, nprocs):
    """float16 / bfloat16 through autotune.allreduce, every algorithm: reduced in
    float32, rounded back, identical on every rank; mixed dtypes and non-contiguous
    half tensors raise on every rank (tests/mpi/half_checks.py).  numpy float16 at
    every P; torch's float16 and bfloat16 (a conversion at the call, the same at
    any P; its import is most of a run) at P = 2."""
    out = mpirun(nprocs, "tests.mpi.half_checks", *([] if nprocs == 2 else ["--no-torch"]),
                 timeout=300)
    assert f"half_checks P={nprocs}:" in out and "cases passed" in out


@gpu_mpi()
def test_half_precision_inputs_on_the_gpu(mpirun):
    """The same with cupy float16 and torch CUDA float16 / bfloat16 (MPI backend)."""
    out = mpirun(1, "tests.mpi.half_checks", "--array", "gpu", timeout=300)
    assert "half_checks P=1:" in out and "cases passed" in out

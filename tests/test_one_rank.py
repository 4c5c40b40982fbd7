"""One bad rank never hangs the job (tests/mpi/one_rank_checks.py, under real mpiexec).

For every input the API takes, one rank differs (or is invalid) and every rank
must raise the same kind of error, or every rank gets the right answer; plus a
user's wildcard receive and a user's own collective in flight across the
library's calls.  Each case has a watchdog inside the runner; the launch has a
timeout here.  The CLI's one-rank cases are in tests/test_cli.py.
"""
import pytest

from benchmarks import NVLS_OFF_ENV
from support import gpu_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3, 5])
def test_one_bad_rank(mpirun, nprocs):
    out = mpirun(nprocs, "tests.mpi.one_rank_checks", timeout=240)
    assert f"one_rank P={nprocs}:" in out and "cases passed" in out
    assert "user wildcard receive" in out and "user collective interleaved" in out


@gpu_mpi(2)
def test_one_bad_rank_on_gpus(mpirun):
    """The call cases on device arrays through NCCL, at P = 2 (two GPUs)."""
    out = mpirun(2, "tests.mpi.one_rank_checks", "--array", "cupy", timeout=240,
                 env=NVLS_OFF_ENV)
    assert "one_rank P=2 on GPUs (NCCL, cupy):" in out and "cases passed" in out

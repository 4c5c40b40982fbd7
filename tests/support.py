"""Helpers shared by the test modules (imported as ``support``; the conftest
files of tests/ and tests/benchmarks/ are both named ``conftest``, so test
modules must not import from ``conftest``)."""
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.launch import mpi_env, mpiexec_argv

ROOT = Path(__file__).resolve().parent.parent


def run_mpi(nprocs: int, module: str, *args: str, timeout: float = 600, env=None):
    """Run ``python -m module args`` under real mpiexec; fail the test on a
    non-zero exit, showing the ranks' output."""
    argv = mpiexec_argv(nprocs, [sys.executable, "-m", module, *args])
    try:
        p = subprocess.run(argv, cwd=ROOT, env=mpi_env(env), capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{module} at P={nprocs} hung past {timeout}s:\n{e.stdout}\n{e.stderr}")
    if p.returncode != 0:
        pytest.fail(f"{module} at P={nprocs} exited {p.returncode}:\n"
                    f"{p.stdout[-4000:]}\n{p.stderr[-6000:]}")
    return p.stdout


def _has_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


HAS_GPU = _has_gpu()
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU and cupy")

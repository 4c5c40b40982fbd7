"""Helpers shared by the test modules (imported as ``support``; the conftest
files of tests/ and tests/benchmarks/ are both named ``conftest``, so test
modules must not import from ``conftest``)."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.launch import mpiexec_argv, one_host_env

ROOT = Path(__file__).resolve().parent.parent


def run(cmd, *, cwd=ROOT, timeout: float = 60, env=None) -> subprocess.CompletedProcess:
    """``cmd`` with its output captured, in its own process group (mpiexec and its
    ranks with it): past ``timeout`` the whole group is killed and TimeoutExpired
    raised with the output so far, so no mpiexec or rank outlives a test.  The
    environment: this one, ``env`` and the launcher's one-host MPI defaults."""
    p = subprocess.Popen(cmd, cwd=cwd, env=one_host_env({**os.environ, **(env or {})}),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def run_mpi(nprocs: int, module: str, *args: str, timeout: float = 600, env=None):
    """Run ``python -m module args`` under real mpiexec; fail the test on a
    non-zero exit, showing the ranks' output."""
    argv = mpiexec_argv(nprocs, [sys.executable, "-m", module, *args])
    try:
        p = run(argv, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{module} at P={nprocs} hung past {timeout}s:\n{e.stdout}\n{e.stderr}")
    if p.returncode != 0:
        pytest.fail(f"{module} at P={nprocs} exited {p.returncode}:\n"
                    f"{p.stdout[-4000:]}\n{p.stderr[-6000:]}")
    return p.stdout


def bench_tool(*args: str, timeout: float = 300) -> tuple[int, str]:
    """Run ``python -m tests.benchmarks args`` (the regression-tracking tool):
    (exit status, stdout + stderr)."""
    p = run([sys.executable, "-m", "tests.benchmarks", *args], timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def _gpus() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


GPUS = _gpus()
HAS_GPU = GPUS > 0
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU and cupy")


def gpu_mpi(gpus: int = 1):
    """Mark a test that launches MPI ranks on ``gpus`` GPUs or more (collected
    only on a GPU machine, skipped where fewer GPUs are visible)."""
    skip = pytest.mark.skipif(GPUS < gpus, reason=f"needs {gpus} CUDA GPU(s) and cupy")
    return lambda fn: pytest.mark.mpi(pytest.mark.gpu(skip(fn)))

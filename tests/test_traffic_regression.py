"""Traffic per rank of every algorithm, checked exactly against tests/data/traffic_golden.json.

Timings are too noisy to catch a change in volume; byte counts are not.  Every
algorithm of ``collectives.ALGORITHMS`` that runs on MPI is run under real
mpiexec (P = 3 and 4) on fixed seeded data (tests/mpi/traffic_golden.py) and
its per-call, per-rank, per-phase bytes and messages sent and received must
equal the golden file's, to the byte.  After a deliberate change of an
algorithm's traffic, regenerate the file and commit it with the change:

    python -m tests.mpi.traffic_golden --update
"""
from __future__ import annotations

import copy
import json

import pytest

from collectives import ALGORITHMS
from tests.mpi import traffic_golden as tg

UPDATE = "python -m tests.mpi.traffic_golden --update"


def load_golden() -> dict:
    return json.loads(tg.GOLDEN.read_text())


def differences(expected: dict, got: dict, limit: int = 20) -> list[str]:
    """Every disagreement between two count tables, as readable lines (at most ``limit``)."""
    out: list[str] = []

    def walk(e, g, where, depth):
        # depth 0 algorithm, 1 size, 2 calls, 3 ranks, 4 phases, 5 counts
        if len(out) >= limit:
            return
        if isinstance(e, dict) and isinstance(g, dict):
            for k in sorted(set(e) | set(g)):
                if k not in g:
                    out.append(f"{where}{k}: missing from this run (golden {e[k]})")
                elif k not in e:
                    out.append(f"{where}{k}: new in this run ({g[k]})")
                else:
                    walk(e[k], g[k], f"{where}{k} ", depth + 1)
        elif depth in (2, 3) and isinstance(e, list) and isinstance(g, list) and len(e) == len(g):
            for i, (a, b) in enumerate(zip(e, g)):
                walk(a, b, f"{where}{('call', 'rank')[depth - 2]} {i} ", depth + 1)
        elif e != g:
            if depth == 5 and len(e) == len(g) == len(tg.FIELDS):
                detail = ", ".join(f"{f} {a} -> {b}" for f, a, b in zip(tg.FIELDS, e, g) if a != b)
                out.append(f"{where.strip()}: {detail}")
            else:
                out.append(f"{where.strip()}: golden {e}, this run {g}")

    walk(expected, got, "", 0)
    return out


def test_golden_matches_the_runner_and_the_registry():
    golden = load_golden()
    assert golden["settings"] == tg.settings(), f"settings changed: run `{UPDATE}`"
    assert sorted(golden["P"]) == sorted(map(str, tg.PS))
    mpi_algorithms = sorted(n for n, cls in ALGORITHMS.items() if "mpi" in cls.backends)
    for p, table in golden["P"].items():
        assert sorted(table) == mpi_algorithms, (
            f"P={p}: golden algorithms {sorted(table)} != registered {mpi_algorithms}; "
            f"run `{UPDATE}`")


def test_a_one_byte_change_is_caught():
    """The comparison itself: one byte more in one phase of one rank is reported."""
    golden = load_golden()["P"]["4"]
    changed = copy.deepcopy(golden)
    phases = changed["oktopk"]["n=65536"][2][1]
    phase = sorted(phases)[0]
    phases[phase][0] += 1
    diff = differences(golden, changed)
    assert diff == [f"oktopk n=65536 call 2 rank 1 {phase}: bytes_sent "
                    f"{golden['oktopk']['n=65536'][2][1][phase][0]} -> {phases[phase][0]}"]
    assert differences(golden, copy.deepcopy(golden)) == []
    del changed["dense"]
    assert any("dense: missing" in d for d in differences(golden, changed))


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", tg.PS)
def test_traffic_matches_golden(mpirun, tmp_path, nprocs):
    out = tmp_path / "traffic.json"
    mpirun(nprocs, "tests.mpi.traffic_golden", "--out", str(out), timeout=600)
    run = json.loads(out.read_text())
    assert run["settings"] == tg.settings() and run["P"] == nprocs
    diff = differences(load_golden()["P"][str(nprocs)], run["counts"])
    assert not diff, (f"traffic at P={nprocs} differs from tests/data/traffic_golden.json "
                      f"(first {len(diff)}):\n  " + "\n  ".join(diff)
                      + f"\nIf the change is deliberate, run `{UPDATE}` and commit the file.")

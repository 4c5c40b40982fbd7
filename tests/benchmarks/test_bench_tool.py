"""The regression tool itself (``python -m tests.benchmarks``), end to end.

Real runs, small: the smoke sizes timed for two rounds (``--quick``), one
kernel and one collective (under real mpiexec at P = 2), into a temporary
baseline folder.  Then the saved baseline is edited the way a real change
would move it, so the verdicts do not depend on this machine's noise: a
baseline 10^4x slower than the run must pass, one 10^4x faster must fail
(the host suite with pytest-benchmark's "Performance has regressed", the
collective suite on its native reference's absolute gate), one algorithm
alone 10^4x faster in the baseline must fail relative to the native
allreduce, and a baseline that lacks a benchmark of the run must fail too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune._mpirun import under_mpi

ROOT = Path(__file__).resolve().parents[2]
TIME_FIELDS = ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3", "ld15iqr",
               "hd15iqr", "total")

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(under_mpi(), reason="launches its own mpiexec")]


def tool(*args, timeout=300):
    p = subprocess.run([sys.executable, "-m", "tests.benchmarks", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def scale(path: Path, factor: float, only: str = "") -> None:
    """Make the recorded times ``factor`` times longer (of benchmarks whose name contains ``only``)."""
    doc = json.loads(path.read_text())
    for b in doc["benchmarks"]:
        if only not in b["name"]:
            continue
        for f in TIME_FIELDS:
            b["stats"][f] *= factor
        b["stats"]["ops"] /= factor
    path.write_text(json.dumps(doc))


def test_record_compare_and_fail_on_regression(tmp_path):
    common = ["--machine", "ci-test", "--storage", str(tmp_path), "--quick", "--rounds", "2",
              "--np", "2", "--suites", "host,mpi"]
    only = ["--", "-k", "kth_magnitude or dense or mpi", "--color=no"]
    rc, out = tool(*common, "--save", "--no-confirm", *only)
    assert rc == 0, out
    files = sorted((tmp_path / "ci-test").glob("*/*.json"))
    assert [f.name.split("_", 1)[1] for f in files] == ["host.json", "mpi-p2.json"], files
    local = {str(ROOT), sys.prefix, str(Path.home())}
    for f in files:
        text = f.read_text()
        assert not [p for p in local if p in text], f"local path in {f.name}"
        doc = json.loads(text)
        assert doc["machine_info"]["node"] == "ci-test"
        assert doc["commit_info"]["project"] == "autotune-collectives"
    mpi_doc = json.loads(files[1].read_text())
    assert mpi_doc["machine_info"]["mpi_ranks"] == 2
    assert [b["name"] for b in mpi_doc["benchmarks"]] == [
        "test_allreduce[dense-P2-d0.01-numpy-n4103]", "test_allreduce[mpi-P2-d0.01-numpy-n4103]"], \
        "rank 0 alone saves, each benchmark once"

    for f in files:
        scale(f, 1e4)  # baseline far slower: no regression
    # the collectives are judged relative to the native allreduce of the same run, where a
    # uniform scaling cancels out: make dense far slower than mpi too, so no noise decides
    scale(files[1], 1e4, only="[dense-")
    rc, out = tool(*common, *only)
    assert rc == 0, out
    assert "no regression beyond median:25% / min:25%" in out

    scale(files[1], 1e-12, only="[dense-")  # dense alone far faster than before, mpi as it was
    rc, out = tool(*common, *only)
    assert rc == 1, out
    assert "dense-P2-d0.01-numpy-n4103] median" in out and "relative to mpi" in out, out
    assert "suite host" not in out.split("FAILED:")[-1], out

    for f in files:
        scale(f, 1e-8)  # baseline far faster: every benchmark regressed
    rc, out = tool(*common, *only)
    assert rc == 1, out
    assert "Performance has regressed" in out
    assert "suite host: pytest exited" in out and "suite mpi: native mpi median" in out


def test_compare_fails_without_a_matching_baseline(tmp_path):
    common = ["--machine", "ci-test", "--storage", str(tmp_path), "--quick", "--rounds", "2",
              "--suites", "host"]
    rc, out = tool(*common, "--", "-k", "kth_magnitude")
    assert rc == 1 and "record one with" in out, out
    rc, out = tool(*common, "--save", "--no-confirm", "--", "-k", "kth_magnitude")
    assert rc == 0, out
    rc, out = tool(*common, "--", "-k", "kth_magnitude or sampled_threshold")
    assert rc == 1 and "differ in benchmarks" in out and "sampled_threshold" in out, out


def test_benchmark_path_needs_no_optuna():
    """The GPU machine has no optuna: nothing the benchmarks import may need it."""
    code = ("import sys; sys.modules['optuna'] = None; import pytest; "
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--benchmark-disable', "
            "'tests/benchmarks/test_bench_kernels.py', 'tests/benchmarks/test_bench_selector.py', "
            "'tests/benchmarks/test_bench_allreduce.py']))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]

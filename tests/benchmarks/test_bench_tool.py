"""The regression tool itself (``python -m tests.benchmarks``), end to end.

Real runs, small: the smoke sizes timed for two rounds (``--quick``), one
kernel and two collectives (under real mpiexec at P = 2), into a temporary
baseline folder.  Then the saved baseline is edited the way a real change
would move it, so the verdicts do not depend on this machine's noise:

  * every benchmark 10^4x slower in the baseline: passes;
  * one algorithm alone 10^12x faster in the baseline (its reference as it
    was): fails, relative to its reference;
  * the whole baseline machine 10^8x faster (benchmarks and their references
    alike): the host suite passes (the machine's speed cancels out), the
    collective suite fails only on the native allreduce's own loose gate;
  * one kernel alone 10^8x faster: fails.

And: hardware without a baseline of its own records one instead of failing
(or fails with --require-baseline) and shows the other hardware's baseline for
information; a baseline that lacks a benchmark of the run fails.  The real
verdict on real timings (a deliberate slowdown) is ``test_bench_gate.py``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.launch import under_mpi
from support import bench_tool as tool

ROOT = Path(__file__).resolve().parents[2]
TIME_FIELDS = ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3", "ld15iqr",
               "hd15iqr", "total")

# the recording case alone launches mpiexec (its mpi suite at P = 2); the others
# run the host suite, or in-process benchmarks at P = 1
pytestmark = pytest.mark.skipif(under_mpi(), reason="launches its own mpiexec")


def this_hardware() -> str:
    sys.path.insert(0, str(ROOT))
    from tests.benchmarks.__main__ import this_hardware as hw

    return hw()


def scale(path: Path, original: str, factor: float, only: dict | None = None,
          references: float = 1.0):
    """Write ``original`` to ``path`` with every benchmark's recorded times ``factor``
    times longer (``only[s]`` times for those whose name contains ``s``), and their
    references' times ``references`` times longer."""
    doc = json.loads(original)
    for b in doc["benchmarks"]:
        f = next((v for k, v in (only or {}).items() if k in b["name"]), factor)
        for st, g in ((b["stats"], f), (b["extra_info"].get("reference_stats"), references)):
            if st is None:
                continue
            for k in TIME_FIELDS:
                st[k] *= g
            st["ops"] /= g
    path.write_text(json.dumps(doc))


def failed_block(out: str) -> str:
    return out.split("FAILED:")[-1] if "FAILED:" in out else ""


@pytest.mark.mpi
def test_record_compare_and_fail_on_regression(tmp_path):
    common = ["--machine", "ci-test", "--storage", str(tmp_path), "--quick", "--rounds", "2",
              "--np", "2", "--suites", "host,mpi", "--retries", "0"]
    only = ["--", "-k", "kth_magnitude or dense- or topka- or mpi-", "--color=no"]
    rc, out = tool(*common, "--save", "--no-confirm", *only)
    assert rc == 0, out
    hw = this_hardware()
    files = sorted((tmp_path / "ci-test").glob("*/*/*.json"))
    assert [f.name.split("_", 1)[1] for f in files] == ["host.json", "mpi-p2.json"], files
    assert {f.parents[1].name for f in files} == {hw}, "one folder per hardware model"
    local = {str(ROOT), sys.prefix, str(Path.home())}
    for f in files:
        text = f.read_text()
        assert not [p for p in local if p in text], f"local path in {f.name}"
        doc = json.loads(text)
        assert doc["machine_info"]["node"] == "ci-test"
        assert doc["commit_info"]["project"] == "autotune-collectives"
    host, mpi = files
    host_doc, mpi_doc = json.loads(host.read_text()), json.loads(mpi.read_text())
    assert mpi_doc["machine_info"]["mpi_ranks"] == 2
    refs = {b["name"]: b["extra_info"]["reference"] for b in mpi_doc["benchmarks"]}
    assert refs == {"test_allreduce[dense-P2-d0.01-numpy-n4103]": "native mpi allreduce",
                    "test_allreduce[mpi-P2-d0.01-numpy-n4103]": True,
                    "test_allreduce[topka-P2-d0.01-numpy-n4103]": "read pass x.sum()"}, \
        "rank 0 alone saves, each benchmark once, with its reference"
    (kth,) = host_doc["benchmarks"]
    assert kth["extra_info"]["reference"] == "read pass x.sum()"
    assert kth["extra_info"]["reference_stats"]["rounds"] >= 2
    assert kth["options"]["timer"] == "process_time"  # CPU time (conftest)
    original = {f: f.read_text() for f in files}

    # (the smoke sizes timed twice are noisy: benchmarks that must pass get a 10^4 margin)
    for f in files:  # the baseline far slower: no regression
        scale(f, original[f], 1e4)
    rc, out = tool(*common, *only)
    assert rc == 0, out
    assert "no regression beyond min:15%" in out

    scale(mpi, original[mpi], 1e4, only={"[topka-": 1e-12})  # topka alone far faster before
    mpi_only = [a if a != "host,mpi" else "mpi" for a in common]
    rc, out = tool(*mpi_only, *only)
    assert rc == 1, out
    assert failed_block(out).strip().splitlines() == [
        "suite mpi: test_allreduce[topka-P2-d0.01-numpy-n4103] min "
        + failed_block(out).split("n4103] min ", 1)[1].splitlines()[0]], out
    assert "relative to its reference (read pass x.sum()" in failed_block(out), out

    for f in files:  # the baseline machine 10^8x faster: benchmarks and references alike
        scale(f, original[f], 1e-8 * 1e4, only={"[mpi-": 1e-8}, references=1e-8)
    rc, out = tool(*mpi_only, *only)
    assert rc == 1, out
    assert failed_block(out).strip().splitlines() == [
        "suite mpi: test_allreduce[mpi-P2-d0.01-numpy-n4103] (the reference) median "
        + failed_block(out).split("(the reference) median ", 1)[1].splitlines()[0]], out

    scale(mpi, original[mpi], 1e4)
    scale(host, original[host], 1e-8)  # the kernel alone far faster, not its reference
    rc, out = tool(*common, *only)
    assert rc == 1, out
    failed = failed_block(out)
    assert "suite host: test_kth_magnitude[numpy] min" in failed and "suite mpi" not in failed, out


def test_hardware_without_a_baseline_records_one(tmp_path):
    common = ["--machine", "ci-test", "--storage", str(tmp_path), "--quick", "--rounds", "2",
              "--suites", "host", "--retries", "0"]
    hw = this_hardware()
    rc, out = tool(*common, "--require-baseline", "--", "-k", "kth_magnitude")
    assert rc == 1 and "no baseline for this hardware" in out, out
    rc, out = tool(*common, "--", "-k", "kth_magnitude")
    assert rc == 0, out
    assert f"NO BASELINE FOR THIS HARDWARE ({hw})" in out and "nothing is gated" in out, out
    (saved,) = (tmp_path / "ci-test" / hw).glob("*/*_host.json")

    # that baseline, as if another CPU model had recorded it; and one of the old layout
    other = tmp_path / "ci-test" / "other-cpu-family0-model0"
    shutil.move(str(tmp_path / "ci-test" / hw), other)
    old = tmp_path / "ci-test" / saved.parent.name / "0001_host.json"
    old.parent.mkdir()
    old.write_text("{}")
    rc, out = tool(*common, "--", "-k", "kth_magnitude")
    assert rc == 0, out
    assert "(there are: other-cpu-family0-model0)" in out, out
    assert "for information only, not gated" in out and "test_kth_magnitude[numpy]" in out, out
    assert "ignored, the layout before hardware folders" in out, out
    assert list((tmp_path / "ci-test" / hw).glob("*/*_host.json")), "recorded for this hardware"

    rc, out = tool(*common, "--", "-k", "kth_magnitude or topk_select")
    assert rc == 1 and "differ in benchmarks" in out and "topk_select" in out, out


def test_slowdown_is_refused_when_saving(tmp_path):
    rc, out = tool("--storage", str(tmp_path), "--save", "--", "--bench-slowdown",
                   "kernels.kth_magnitude=1.3")
    assert rc == 2 and "not with --save" in out, out
    assert not list(tmp_path.iterdir())


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


def test_hardware_key_names_the_model_and_avx512():
    from tests.benchmarks.__main__ import hardware_key

    cpu = {"brand_raw": "AMD EPYC", "family": 25, "model": 17, "flags": ["avx2", "fma"]}
    assert hardware_key(cpu, None) == "amd-epyc-family25-model17"
    assert hardware_key({**cpu, "flags": ["avx2", "avx512f"]}, "NVIDIA H200") == \
        "amd-epyc-family25-model17-avx512+nvidia-h200"


"""The scaling study (benchmarks/scaling.py): projection, model error,
tables and plots on synthetic rows, plus one real two-rank measurement."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autotune import costmodel
from autotune.profile import Profile
from benchmarks import scaling

ROOT = Path(__file__).resolve().parent.parent
DAINT = Profile.load(ROOT / "profiles" / "piz_daint.json").data
SHM = Profile.load(ROOT / "profiles" / "cpu_shm_p4.json").data  # measured at P=4, shared medium


def test_projection_dense_grows_with_n_and_oktopk_wins_at_scale():
    models = {"small": dict(n=1 << 20, density=0.01), "large": dict(n=1 << 26, density=0.01)}
    proj = scaling.project(DAINT, models=models, Ps=(16, 256))
    t = {(r["model"], r["P"]): r for r in proj}
    for P in (16, 256):
        assert t[("large", P)]["pred_s"]["dense"] > 30 * t[("small", P)]["pred_s"]["dense"]
        # the speedups are the ratio of the predictions, not computed elsewhere
        r = t[("large", P)]
        assert r["speedup_vs_dense"]["oktopk"] == pytest.approx(
            r["pred_s"]["dense"] / r["pred_s"]["oktopk"])
    # TopkA's allgather grows with P; Ok-Topk's volume does not: the gap widens
    r16, r256 = t[("large", 16)]["speedup_vs_dense"], t[("large", 256)]["speedup_vs_dense"]
    assert r256["topka"] < r16["topka"]
    assert r256["oktopk"] > 1.0 and r256["oktopk"] > r256["topka"]


def test_paper_models_are_the_documented_sizes():
    proj = scaling.project(DAINT, Ps=(256,))
    ns = {r["model"]: (r["n"], r["density"]) for r in proj}
    assert ns["VGG-16 (Cifar-10)"] == (14_728_266, 0.02)
    assert ns["BERT (Wikipedia)"][1] == 0.01
    table = scaling.projection_table(proj)
    assert "3.29x-12.95x" in table and table.count("\n") == len(proj) + 3


def test_projection_band_from_a_measured_profile():
    """With a measured profile's held-out errors every prediction gets a band
    around it that widens with the octaves of P beyond P = 2."""
    proj = scaling.project(DAINT, Ps=(16, 256), band_from=SHM)
    for r in proj:
        for a, (lo, hi) in r["band_s"].items():
            assert lo < r["pred_s"][a] < hi
    t = {(r["model"], r["P"]): r for r in proj}
    m = "BERT (Wikipedia)"
    w16, w256 = (t[(m, P)]["band_s"]["oktopk"][1] / t[(m, P)]["pred_s"]["oktopk"]
                 for P in (16, 256))
    assert w256 > w16 > 1
    assert "[" in scaling.projection_table(proj)
    assert "band_s" not in scaling.project(DAINT, Ps=(16,))[0]


def _synthetic_rows(factor_by_algo):
    """Rows whose 'measured' time is the fitted model's prediction times a factor."""
    rows = []
    M = scaling.machine_at(SHM)
    for P in (2, 4, 8):
        for n in (1 << 16, 1 << 20):
            for a, f in factor_by_algo.items():
                t = costmodel.predict(M, a, n, P, 0.01)
                rows.append({"n": n, "P": P, "algorithm": a, "density": 0.01, "median_s": f * t,
                             "times_s": [f * t] * 3, "split_s": {}, "bytes_sent_max": 0})
    return rows


def test_model_errors_are_against_the_measured_numbers():
    rows = _synthetic_rows({"dense": 2.0, "oktopk": 0.5, "mpi": 1.0})
    errs = scaling.model_errors(rows + [dict(rows[0], algorithm="nccl_only_name")], SHM)
    assert len(errs) == len(rows)  # algorithms without a cost model are left out
    for e in errs:
        f = {"dense": 2.0, "oktopk": 0.5, "mpi": 1.0}[e["algorithm"]]
        assert e["err_fitted"] == pytest.approx(abs(1 / f - 1))
        assert isinstance(e["covered"], bool)
    from autotune.selector import Selector

    sel = Selector(SHM)
    for e in errs:  # the selector's own prediction, scored against the same number
        pred = sel.predict(e["algorithm"], e["n"], e["P"], 0.01)[0]
        assert e["pred_selector_s"] == pytest.approx(pred)
        assert e["err_selector"] == pytest.approx(abs(pred - e["measured_s"]) / e["measured_s"])
    s = scaling.error_summary(errs)
    assert s["all"][4] == pytest.approx(np.median([e["err_selector"] for e in errs]))
    assert s["dense"][0] == pytest.approx(0.5) and s["oktopk"][0] == pytest.approx(1.0)
    assert s["mpi"][0] == pytest.approx(0.0, abs=1e-12) and s["mpi"][3] == 1.0
    assert s["all"][2] == len(rows) and s["all"][0] == pytest.approx(0.5)
    assert len(scaling.model_errors(rows, SHM, max_P=4)) == len(rows) * 2 // 3
    # Table 1 alone: the profile without its runs
    t1 = costmodel.Machine.from_profile({**SHM, "runs": []})
    e = errs[0]
    assert e["pred_table1_s"] == pytest.approx(
        costmodel.predict(t1, e["algorithm"], e["n"], e["P"], 0.01))


def test_sweep_noise_scores_sweeps_against_each_other():
    """The noise floor of the model error: a sweep 10% slower than another at every
    point differs from it by 0.1 (median over the common points, up to max_P)."""
    rows = _synthetic_rows({"dense": 1.0, "oktopk": 0.5})
    slower = [dict(r, median_s=1.1 * r["median_s"]) for r in rows]
    mixed = [dict(r, median_s=r["median_s"] * (2.0 if r["P"] > 4 else 1.0)) for r in rows]
    res = [{"rows": rows}, {"rows": slower}, {"rows": mixed}]
    got = scaling.sweep_noise(res)
    assert got[0] == pytest.approx(0.1 / 1.1) and len(got) == 3
    assert scaling.sweep_noise(res[::2], max_P=4) == [0.0]
    assert scaling.sweep_noise(res[:1]) == []


def test_runs_as_prediction_scores_the_profiles_own_runs():
    """The profile's runs as predictions: only the points it ran count (a lossless run
    matched whatever the study's density), each against that run's time."""
    runs = [{"algorithm": "dense", "n": 1 << 20, "P": 2, "density": None, "median_s": 0.010},
            {"algorithm": "oktopk", "n": 1 << 20, "P": 4, "density": 0.01, "median_s": 0.020},
            {"algorithm": "oktopk", "n": 1 << 20, "P": 8, "density": 0.01, "median_s": 0.040}]
    rows = [{"algorithm": "dense", "n": 1 << 20, "P": 2, "density": 0.01, "median_s": 0.015},
            {"algorithm": "oktopk", "n": 1 << 20, "P": 4, "density": 0.01, "median_s": 0.018},
            {"algorithm": "oktopk", "n": 1 << 20, "P": 4, "density": 0.05, "median_s": 0.5},
            {"algorithm": "oktopk", "n": 1 << 22, "P": 4, "density": 0.01, "median_s": 0.5},
            {"algorithm": "oktopk", "n": 1 << 20, "P": 8, "density": 0.01, "median_s": 0.4}]
    med, count = scaling.runs_as_prediction(rows, {"runs": runs}, max_P=4)
    assert count == 2 and med == pytest.approx(np.median([0.5, 0.1]))
    assert scaling.runs_as_prediction(rows, {"runs": runs})[1] == 3
    assert scaling.runs_as_prediction(rows[3:4], {"runs": runs}) is None


def _result(rows, network="plain", profile=SHM):
    return {"study": "scaling", "network": network, "density": 0.01, "cores": 2,
            "started": "2026-11-26T00:00:00Z", "loadavg_start": [1.0, 1.0, 1.0],
            "loadavg_end": [1.0, 1.0, 1.0], "rows": rows, "skipped": [{"P": 16, "reason": "budget"}],
            "profile": profile}


def test_tables_plots_and_cli(tmp_path):
    rows = _synthetic_rows({"dense": 1.0, "topka": 0.8, "oktopk": 1.25})
    table = scaling.measured_table(_result(rows))
    d = next(r for r in rows if r["P"] == 8 and r["n"] == 1 << 20 and r["algorithm"] == "dense")
    o = next(r for r in rows if r["P"] == 8 and r["n"] == 1 << 20 and r["algorithm"] == "oktopk")
    assert f"{1e3 * o['median_s']:.2f} ({d['median_s'] / o['median_s']:.2f}x)" in table
    assert "Skipped P=16: budget" in table

    pm = scaling.plot_measured(_result(rows), tmp_path, SHM)
    pp = scaling.plot_projection(scaling.project(DAINT), tmp_path)
    (tmp_path / "band").mkdir()
    pb = scaling.plot_projection(scaling.project(DAINT, band_from=SHM), tmp_path / "band")
    for p in (pm, pp, pb):
        assert p.name.startswith("scaling_") and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height = lambda p: int.from_bytes(p.read_bytes()[20:24], "big")  # noqa: E731 - PNG IHDR
    assert height(pb) > 1.8 * height(pp)  # the band's row of panels

    f = tmp_path / "plain.json"
    f.write_text(json.dumps(_result(rows)))
    out = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "report", str(f)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| **all** |" in out.stdout and "BERT (Wikipedia)" in out.stdout

    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps({"rows": rows}))
    with pytest.raises(ValueError, match="not a scaling-study result"):
        scaling.load_results(bad)
    with pytest.raises(ValueError, match="no profile"):
        scaling._profile_for(_result(rows, profile=None), None)


def test_measure_two_ranks_end_to_end(tmp_path):
    """A real (tiny) sweep: mpiexec per P, rows of every P merged in one file."""
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "measure",
                        "--network", "plain", "--np", "2", "--log2n", "10",
                        "--algorithms", "dense,topka", "--repeat", "2", "--warmup", "1",
                        "--budget", "100", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = scaling.load_results(out)
    assert {(r["P"], r["algorithm"]) for r in res["rows"]} == {(2, "dense"), (2, "topka")}
    for r in res["rows"]:
        assert r["n"] == 1024 and len(r["times_s"]) == 2 and r["median_s"] > 0
        assert math.isclose(r["median_s"], sorted(r["times_s"])[0] / 2 + sorted(r["times_s"])[1] / 2)
    assert res["rows"][0]["bytes_sent_max"] > 0  # dense moves bytes
    assert res["launches"][0]["argv"][0] in ("mpiexec", "mpirun")
    assert all(sys.executable not in a for a in res["launches"][0]["argv"])

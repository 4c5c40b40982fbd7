"""The shared timing primitive and the side-by-side (interleaved) sweeps built on it."""
import json
import time
from pathlib import Path

import numpy as np
import pytest

import collectives
from autotune.bench import sweep
from benchmarks import load_json, regret
from collectives import timeit, timeit_interleaved

ROOT = Path(__file__).resolve().parents[1]


def test_interleaved_rounds_rotate_and_time_every_callable():
    calls = []
    fns = [lambda c=c: calls.append(c) for c in "abc"]
    t = timeit_interleaved(fns, warmup=1, repeat=4)
    assert t.shape == (3, 4) and (t > 0).all()
    # one warm-up round in order, then round i starts at callable i (mod 3)
    assert "".join(calls) == "abc" + "abc" + "bca" + "cab" + "abc"


def test_timeit_is_the_one_callable_case():
    calls = []
    t = timeit(lambda: calls.append(1), warmup=2, repeat=5)
    assert t.shape == (5,) and len(calls) == 7


def test_between_runs_untimed_before_every_timed_call():
    calls = []
    pause = 0.05
    t = timeit_interleaved([lambda: calls.append("a"), lambda: calls.append("b")], warmup=1,
                           repeat=2, between=lambda: (calls.append("-"), time.sleep(pause)))
    # warm-up rounds run back to back; each timed call follows one pause
    assert "".join(calls) == "ab" + "-a-b" + "-b-a"
    assert (t < pause).all()   # the pause is outside the timed region


def test_sweep_orders_agree_on_everything_but_time():
    comm = collectives.MPICommunicator()
    algos = ["mpi", "dense", "topka", "oktopk"]
    rows = {o: sweep(comm, [1 << 12, 1 << 13], algos, 0.01, 3, 1, seed=int(
        np.random.default_rng().integers(1 << 30)), order=o) for o in ("sequential", "interleaved")}
    for o, rs in rows.items():
        assert [(r["n"], r["algorithm"]) for r in rs] == [(n, a) for n in (4096, 8192) for a in algos]
        assert all(len(r["times_s"]) == 3 and r["median_s"] > 0 for r in rs)
        assert all(r["baseline"] == "mpi" and r["speedup_vs_baseline"] > 0 for r in rs)
    assert [r["bytes_sent_max"] for r in rows["sequential"]] == \
        [r["bytes_sent_max"] for r in rows["interleaved"]]
    with pytest.raises(ValueError, match="order"):
        sweep(comm, [1 << 12], algos, 0.01, 1, 0, order="random")


def test_noise_floor_strategy_scores_the_other_sweeps_pick():
    prof = json.loads((ROOT / "profiles" / "cpu_shm_p8.json").read_text())
    key = (1 << 20, 4, 0.01)
    rng = np.random.default_rng()
    a, b = 1.0 + rng.random(), 1.0 + rng.random()
    here = {key: {"dense": a, "mpi": a + b}}          # dense faster here ...
    there = {key: {"dense": 2.0 * b, "mpi": b}}       # ... mpi faster in the other sweep
    rows, summary = regret.evaluate(prof, here, other=there)
    assert rows[0]["other sweep's best"] == ("mpi", pytest.approx((a + b) / a))
    assert summary["other sweep's best"][1] == pytest.approx((a + b) / a)
    _, alone = regret.evaluate(prof, here)
    assert "other sweep's best" not in alone


def test_bench_cli_stores_rows_with_their_settings(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "sweep.json"
    subprocess.run([sys.executable, "-m", "autotune.cli", "bench", "--log2n", "10:11", "--repeat", "2",
                    "--warmup", "0", "--algorithms", "dense,topka", "--gap-ms", "1", "--out", str(out)],
                   check=True, capture_output=True, cwd=ROOT)
    res = json.loads(out.read_text())
    assert {r["algorithm"] for r in res["rows"]} == {"mpi", "dense", "topka"}
    meta = res["meta"]
    assert meta["P"] == 1 and meta["device"] == "cpu" and meta["options"]["order"] == "auto"
    assert meta["order"] == "interleaved"           # auto: side by side on host data
    assert meta["options"]["repeat"] == 2 and meta["date_utc"].endswith("+00:00")
    assert meta["options"]["gap_ms"] == 1.0


def test_off_profile_sets_are_scored_as_one_profile_and_its_sweeps(tmp_path):
    import shutil

    data = ROOT / "docs" / "data" / "offprofile"
    files = [data / "g03_prof4_shm_p4.json.gz", *sorted(data.glob("g03[ab]_shm_p*.json.gz"))]
    for f in files:
        shutil.copy(f, tmp_path)
    plain = tmp_path / "g03b_shm_p9.json"  # a sweep stored uncompressed is read too
    sweep = load_json(files[-1])
    for r in sweep["rows"]:
        r["median_s"] *= 3.0 if r["algorithm"] == "dense" else 1.0
    plain.write_text(json.dumps(sweep))
    (tmp_path / "g03_prof2_shm_p2.json").write_text("{}")  # another P: not read
    [(name, summary, rows)] = regret.score_sets(tmp_path, "shm", 4)
    prof = load_json(files[0])
    direct_rows, direct = regret.evaluate(prof, regret.load_points([*files[1:], plain]))
    assert regret.evaluate(prof, regret.load_points(files[1:]))[0] != direct_rows
    assert name == "g03" and summary == direct["learned selector"] and rows == direct_rows
    met = summary[0] <= regret.GOAL[0] and summary[1] <= regret.GOAL[1]
    assert f"met {int(met)} of 1 sets" in regret.sets_markdown([(name, summary, rows)])


def test_a_plan_variants_profile_is_scored_with_the_quick_plans_samples():
    from autotune.profile import Profile
    from autotune.profiler.driver import PLANS
    from autotune.profiler.fits import refit_profile

    data = ROOT / "docs" / "data" / "offprofile"
    quick = load_json(data / "g03_prof4_shm_p4.json.gz")
    assert regret.as_quick(quick) is quick  # a --quick profile as it is
    variant = load_json(data / "q01_prof4_shm_p4.json.gz")  # primitives to 16 MiB
    cut = regret.as_quick(variant)
    assert {r["n"] for r in cut["runs"]} == {1 << e for e in PLANS["quick"]["algo_log2n"]}
    top = 1 << max(PLANS["quick"]["log2_bytes"])
    assert max(x["bytes"] for x in variant["primitives"]["p2p"]["samples"]) > top
    assert max(x["bytes"] for x in cut["primitives"]["p2p"]["samples"]) == top
    beta = lambda prof: prof["primitives"]["p2p"]["beta_s_per_byte"]  # noqa: E731
    assert beta(cut) != beta(variant)
    # kernels timed at sizes the plan does not time (here 8x dearer per element) are cut
    extra = json.loads(json.dumps(quick))
    samples = extra["compute"]["samples"]
    odd = [dict(s, n=3 * s["n"] // 2, times_s=[12 * t for t in s["times_s"]])
           for s in samples if s["n"] >= 1 << 20]
    extra["compute"]["samples"] = samples + odd
    cut = regret.as_quick(extra)
    assert cut["compute"]["samples"] == samples
    refit = refit_profile(Profile(quick)).data
    assert cut["compute"]["threshold"] == refit["compute"]["threshold"]

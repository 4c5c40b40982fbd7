"""The selector's cost: one decision (what ``algorithm="auto"`` pays on a tensor's
first call, on rank 0) and training it from a shipped profile (what
``autotune.init(profile=...)`` pays once).

Decisions are timed inside the profile's measured range (the learned
correction applies) and far outside it (the correction fades out).
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

import profiles
from autotune.profile import Profile
from autotune.selector import Selector

PROFILES = Path(profiles.__file__).resolve().parent
# (profile, n, P, density): inside the CPU profile's runs; outside the GPU one's
POINTS = [("cpu_shm_p4", 1 << 20, 4, 0.01), ("gpu_h200_nvlink_p2", 1 << 26, 8, 0.001)]


def _load(name: str) -> dict:
    return Profile.load(PROFILES / f"{name}.json").data


@pytest.fixture(scope="module")
def selectors():
    return {name: Selector(_load(name)) for name in {p[0] for p in POINTS}}


@pytest.mark.parametrize("profile,n,P,density", POINTS,
                         ids=[f"{p}-n{n}-P{P}-d{d:g}" for p, n, P, d in POINTS])
def test_selector_decision(measure, selectors, profile, n, P, density):
    sel = selectors[profile]
    d = measure("selector", lambda: sel.choose(n, P, density))
    assert d.algorithm in d.candidates
    assert all(math.isfinite(t) and t > 0 for t in d.predicted_s.values())
    assert d.algorithm == min(d.candidates, key=lambda a: (d.predicted_s[a], a))
    assert d.in_domain == (profile == "cpu_shm_p4")
    assert "<- chosen" in d.explain()
    # deterministic: a selector trained afresh on the same profile agrees bit for bit
    again = Selector(_load(profile)).choose(n, P, density)
    assert (again.algorithm, again.predicted_s) == (d.algorithm, d.predicted_s)


def test_selector_training(measure):
    data = _load("cpu_shm_p4")
    sel = measure("train", lambda: Selector(data))
    assert sel.model is not None, "the CPU profile has enough runs to train the correction"
    assert set(sel.algorithms) >= {"dense", "topka", "oktopk"}

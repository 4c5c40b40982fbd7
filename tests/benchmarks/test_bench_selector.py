"""The selector's cost: one decision (what ``algorithm="auto"`` pays on a tensor's
first call, on rank 0) and training it from a shipped profile (what
``autotune.init(profile=...)`` pays once).

Decisions are timed inside the profile's measured range (the learned
correction applies) and far outside it (the correction fades out).

The regression gate judges both relative to ``reference_workload()`` (a fixed
mix of interpreted Python and small numpy calls, none of this project's code)
timed in the same rounds, in CPU time of the process.
"""
from __future__ import annotations

import functools
import math
import time
from pathlib import Path

import numpy as np
import pytest

import profiles
from autotune.profile import Profile
from autotune.selector import Selector

pytestmark = pytest.mark.benchmark(timer=time.process_time)  # CPU time (see conftest)

PROFILES = Path(profiles.__file__).resolve().parent
# (profile, n, P, density): inside the CPU profile's runs; outside the GPU one's
POINTS = [("cpu_shm_p4", 1 << 20, 4, 0.01), ("gpu_h200_nvlink_p2", 1 << 26, 8, 0.001)]


def _load(name: str) -> dict:
    return Profile.load(PROFILES / f"{name}.json").data


@pytest.fixture(scope="module")
def selectors():
    return {name: Selector(_load(name)) for name in {p[0] for p in POINTS}}


@pytest.fixture
def measure(measure):
    """conftest's ``measure``; the selector is judged against the fixed reference
    workload below, timed before each of its rounds."""
    return functools.partial(measure, reference=("reference_workload()", reference_workload))


_RNG = np.random.default_rng(20261127)
_LO, _HI = _RNG.uniform(-1, 0, (8, 3)), _RNG.uniform(0, 1, (8, 3))
_W = _RNG.standard_normal((64, 9))


def reference_workload() -> float:
    """A fixed workload of the selector's kind, none of this project's code:
    interpreted Python, ``math``, and small numpy calls (array building,
    reductions, a small matrix product) dominated by per-call overhead."""
    acc = 0.0
    for i in range(64):
        q = np.array([math.log2(1 + i), math.log2(2 + i % 5), math.log10(0.001 * (1 + i % 7))])
        lo, hi = _LO[i % 8], _HI[i % 8]
        out = float(np.sum(np.maximum(lo - q, 0) + np.maximum(q - hi, 0)))
        feats = np.asarray([[*q, out, 1.0, float(i % 3), math.exp(-out), *q[:2]]])
        acc += float((feats @ _W[i]).max()) * math.exp(-out)
    return acc


@pytest.mark.parametrize("profile,n,P,density", POINTS,
                         ids=[f"{p}-n{n}-P{P}-d{d:g}" for p, n, P, d in POINTS])
def test_selector_decision(measure, selectors, profile, n, P, density):
    sel = selectors[profile]
    d = measure("selector", lambda: sel.choose(n, P, density))
    assert d.algorithm in d.candidates
    assert all(math.isfinite(t) and t > 0 for t in d.predicted_s.values())
    if d.robust:  # far beyond the profile's runs (autotune.selector.FAR_OCTAVES)
        assert "robust choice" in d.explain()
    else:
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

"""One registry: every algorithm declares itself once (name, lossy, backends,
traffic bound, cost terms), and everything that lists algorithms reads it.

A plug-in algorithm (tests/mpi/toy_algorithm.py) reaches the conformance suite,
the cost model, the selector and ``autotune bench`` without an edit elsewhere.
"""
import importlib
import inspect
import math
from pathlib import Path

import pytest

from autotune import bench, costmodel
from autotune.cli import build_parser
from autotune.profile import Profile
from autotune.selector import Selector
from collectives import ALGORITHMS, BACKENDS, Algorithm, Prices, register, unregister

PROFILES = Path(__file__).resolve().parent.parent / "profiles"
GRID = [(n, P, d) for n in (1 << 12, 1 << 20) for P in (2, 3, 8) for d in (0.01, 0.001)]


@pytest.fixture(scope="module")
def shm():
    return Profile.load(PROFILES / "cpu_shm_p4.json").data


@pytest.fixture
def toy():
    """The plug-in registered for one test, unregistered after it."""
    cls = importlib.import_module("tests.mpi.toy_algorithm").Toy
    register(cls)  # again after an earlier test's unregister (same class: a no-op otherwise)
    yield cls
    unregister(cls.name)
    assert "toy" not in ALGORITHMS


# -- (a) completeness ----------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_declares_itself(name):
    cls = ALGORITHMS[name]
    assert cls.name == name and isinstance(cls.lossy, bool)
    assert cls.backends and set(cls.backends) <= set(BACKENDS)
    assert not inspect.isabstract(cls)
    for method in ("traffic_bound", "cost"):
        assert isinstance(inspect.getattr_static(cls, method), staticmethod), method
    assert cls.traffic_bound(4096, 4, 41) >= 0


def test_every_backend_names_a_registered_native_allreduce():
    for backend, comm_cls in BACKENDS.items():
        assert comm_cls.backend == backend
        native = ALGORITHMS[comm_cls.native]
        assert backend in native.backends and not native.lossy
        assert comm_cls.devices


def test_registration_refuses_an_incomplete_algorithm():
    before = dict(ALGORITHMS)

    class NoCost(Algorithm):
        name = "nocost"

        def _call(self, x, *, name, density, **kw):
            return x.copy()

        @staticmethod
        def traffic_bound(n, P, k, itemsize=4):
            return 0

    with pytest.raises(TypeError, match="cost"):
        register(NoCost)

    class Elsewhere(NoCost):
        name = "elsewhere"
        backends = ("gloo",)
        cost = staticmethod(lambda prices, n, P, k, **kw: 0.0)

    with pytest.raises(ValueError, match="backends"):
        register(Elsewhere)
    with pytest.raises(ValueError, match="twice"):
        register(type("Dense2", (ALGORITHMS["dense"],), {"name": "dense"}))
    assert ALGORITHMS == before


def test_cost_model_prices_every_registered_algorithm(shm):
    m = costmodel.Machine.from_profile(shm)
    assert isinstance(m, Prices)
    for name in ALGORITHMS:
        for n, P, d in GRID:
            t = costmodel.predict(m, name, n, P, d)
            assert math.isfinite(t) and t > 0, (name, n, P, d, t)
    with pytest.raises(ValueError, match="no cost model"):
        costmodel.predict(m, "nonesuch", 1 << 12, 2)


def test_selector_candidates_are_the_registered_ones_of_the_backend():
    for path in sorted(PROFILES.glob("*.json")):
        prof = Profile.load(path).data
        backend = prof["fingerprint"].get("backend")  # none named: every algorithm
        registered = sorted(a for a, c in ALGORITHMS.items()
                            if backend is None or backend in c.backends)
        assert Selector(prof, learn=False).algorithms == registered, path.name
        measured = {r["algorithm"] for r in prof.get("runs") or ()}
        assert not measured or measured == set(registered), path.name  # every one was run


# -- (b) a plug-in ---------------------------------------------------------------------
@pytest.mark.mpi
def test_conformance_suite_runs_a_plugin(mpirun):
    out = mpirun(3, "tests.mpi.conformance", "--plugin", "tests.mpi.toy_algorithm",
                 "--algorithms", "toy", "--quick", timeout=300)
    assert "conformance P=3:" in out and "cases passed" in out
    assert "  toy " in out


def test_cost_model_and_selector_pick_up_a_plugin(toy, shm):
    m = costmodel.Machine.from_profile(shm)
    for n, P, d in GRID:
        t = costmodel.predict(m, "toy", n, P, d)
        assert math.isfinite(t) and t > 0
    sel = Selector(shm)
    assert "toy" in sel.algorithms
    d = sel.choose(1 << 16, 2, 0.01, lossy_ok=False)
    assert "toy" in d.candidates and "toy" in d.predicted_s
    assert sel.choose(1 << 16, 2, 0.01, candidates=["toy"]).algorithm == "toy"


def test_bench_picks_up_a_plugin(toy, capsys):
    args = build_parser().parse_args(["bench", "--log2n", "10:10", "--repeat", "1",
                                      "--warmup", "0"])
    assert bench.main(args) == 0
    table = capsys.readouterr().out
    assert "| toy |" in table and "| mpi |" in table

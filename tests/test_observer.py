"""Per-call observers (``collectives.observe``) and the uncounted control
reduce (``Communicator.control_allreduce``).

P = 1 in this process; the P = 2 case runs this module under mpiexec
(``python -m tests.test_observer``).  Policy under test: an exception in an
observer propagates to the caller, after the call completed, so the
algorithm's state is that of the completed call and later calls match a run
without the observer.
"""
import numpy as np
import pytest

import collectives
from collectives import ALGORITHMS


@pytest.fixture(scope="module")
def comm():
    return collectives.MPICommunicator()


def _data(n, seed):
    return np.random.default_rng(seed).standard_t(2, n).astype(np.float32)


def test_observer_sees_every_call(comm):
    seen = []
    algos = {a: ALGORITHMS[a](comm) for a in ("dense", "topka", "oktopk")}
    with collectives.observe(seen.append):
        calls = []
        for it in range(3):
            for a, algo in algos.items():
                x = _data(2000, it).reshape(40, 50)   # 2-D: the record has the flat input
                density = None if a == "dense" or it == 0 else 0.05
                out = algo(x, name=f"{a}.w", density=density)
                calls.append((algo, f"{a}.w", density, out, algo.last_traffic))
    assert len(seen) == len(calls) == 9
    for rec, (algo, name, density, out, traffic) in zip(seen, calls):
        assert rec.algorithm is algo and rec.name == name and rec.size == 2000
        want = density if density is not None else (algo.default_density if algo.lossy else None)
        assert rec.density == want
        assert rec.traffic is traffic   # that call's last_traffic
        assert rec.out is out and rec.x.shape == (2000,)
        if algo.name == "oktopk":
            assert {"iteration", "G", "global_candidates", "own", "wanted"} <= set(rec.stats)
        else:
            assert rec.stats is None
    ok = [r for r in seen if r.algorithm.name == "oktopk"]
    assert [r.stats["iteration"] for r in ok] == [0, 1, 2]
    assert ok[-1].stats == algos["oktopk"].last_stats and ok[-1].stats is not algos["oktopk"].last_stats
    assert "CallRecord('dense', name='dense.w', size=2000" in repr(seen[0])


def test_remove_stops_the_calls_and_order_is_registration(comm):
    order = []
    h1 = collectives.observe(lambda r: order.append(1))
    h2 = collectives.observe(lambda r: order.append(2))
    algo = ALGORITHMS["dense"](comm)
    algo(_data(100, 0))
    assert order == [1, 2]
    h1.remove()
    algo(_data(100, 1))
    assert order == [1, 2, 2]
    h2.remove()
    h2.remove()   # idempotent
    algo(_data(100, 2))
    assert order == [1, 2, 2]


def test_same_callback_twice_is_two_observations(comm):
    seen = []
    h1, h2 = collectives.observe(seen.append), collectives.observe(seen.append)
    algo = ALGORITHMS["dense"](comm)
    algo(_data(10, 0))
    h1.remove()
    algo(_data(10, 0))
    h2.remove()
    algo(_data(10, 0))
    assert len(seen) == 3


def test_observer_exception_propagates_and_leaves_state_as_completed(comm):
    xs = [_data(4096, s) for s in range(6)]
    ref = ALGORITHMS["oktopk"](comm)
    ref_out = [ref(x, name="g", density=0.01) for x in xs]

    algo = ALGORITHMS["oktopk"](comm)
    seen = []

    def flaky(rec):
        seen.append(rec.stats["iteration"])
        if rec.stats["iteration"] == 2:
            raise RuntimeError("observer bug")

    with collectives.observe(flaky):
        outs = []
        for i, x in enumerate(xs):
            if i == 2:
                with pytest.raises(RuntimeError, match="observer bug"):
                    algo(x, name="g", density=0.01)
                outs.append(None)
            else:
                outs.append(algo(x, name="g", density=0.01))
    assert seen == [0, 1, 2, 3, 4, 5]
    for i, (a, b) in enumerate(zip(outs, ref_out)):
        if i != 2:
            np.testing.assert_array_equal(a, b)   # bitwise: the state went on as without it
    np.testing.assert_array_equal(algo.state("g").residual, ref.state("g").residual)
    assert algo.state("g").iteration == ref.state("g").iteration == 6


def test_observe_needs_a_callable():
    with pytest.raises(TypeError, match="callable"):
        collectives.observe(None)


def test_control_allreduce_uncounted_one_rank(comm):
    before = comm.traffic.copy()
    x = np.array([3.0, -1.0, 2.5])
    for op in ("sum", "max", "min"):
        out = comm.control_allreduce(x, op)
        np.testing.assert_array_equal(out, x)
        assert out is not x
    assert comm.traffic.since(before).phases == {}
    with pytest.raises(ValueError, match="op must be"):
        comm.control_allreduce(x, "prod")


@pytest.mark.mpi
def test_control_allreduce_and_observer_two_ranks(mpirun):
    out = mpirun(2, "tests.test_observer", timeout=120)
    assert "observer P=2: ok" in out


def _mpi_main() -> None:
    """Under mpiexec: the control reduce is right and uncounted while the
    counted one counts; an observer sees each rank's own traffic."""
    comm = collectives.MPICommunicator()
    P, r = comm.size, comm.rank
    x = np.array([r + 1.0, -(r + 1.0), 10.0 * r], dtype=np.float64)
    ranks = np.arange(1, P + 1, dtype=np.float64)
    want = {"sum": [ranks.sum(), -ranks.sum(), 10.0 * (ranks - 1).sum()],
            "max": [P, -1.0, 10.0 * (P - 1)], "min": [1.0, -P, 0.0]}
    before = comm.traffic.copy()
    for op, w in want.items():
        np.testing.assert_array_equal(comm.control_allreduce(x, op), np.array(w))
    assert comm.traffic.since(before).phases == {}, comm.traffic.since(before).phases
    np.testing.assert_array_equal(comm.control_allreduce(np.arange(5, dtype=np.int64), "sum"),
                                  P * np.arange(5))
    before = comm.traffic.copy()
    np.testing.assert_array_equal(comm.allreduce(x, "sum"), np.array(want["sum"]))
    assert comm.traffic.since(before).total().bytes_sent > 0   # the public one counts

    seen = []
    algo = ALGORITHMS["dense"](comm)
    with collectives.observe(seen.append):
        out = algo(np.full(1000, r + 1.0, dtype=np.float32), name="w")
    np.testing.assert_array_equal(out, np.full(1000, ranks.sum(), dtype=np.float32))
    (rec,) = seen
    assert rec.name == "w" and rec.size == 1000 and rec.traffic is algo.last_traffic
    assert rec.traffic.total().bytes_sent > 0
    comm.barrier()
    if r == 0:
        print(f"observer P={P}: ok", flush=True)


if __name__ == "__main__":
    _mpi_main()

"""allreduce(algorithm="auto") under mpiexec: rank 0 decides from its profile and
broadcasts; every rank runs the same algorithm (ranks given no profile use rank 0's;
ranks given a different one raise, on every rank)."""
import sys
import zlib
from pathlib import Path

import numpy as np
from mpi4py import MPI

import autotune

W = MPI.COMM_WORLD
ROOT = Path(__file__).resolve().parents[2] / "profiles"
PROFILES = ["cpu_tcp1gbit_p4.json", "cpu_shm_p4.json", "piz_daint.json"]


def no_profile_default(backend: str) -> None:
    """``auto`` without a profile: ``dense`` over MPI, NCCL's own allreduce over NCCL."""
    import collectives

    comm = collectives.NCCLCommunicator() if backend == "nccl" else None
    autotune.init(comm)
    want = "nccl" if backend == "nccl" else "dense"
    for n, name in ((1000, None), (1 << 20, "w")):
        choice = autotune.dispatch.choose(n, name=name, density=0.01)
        assert choice.algorithm == want, (backend, n, choice)


def main() -> int:
    if "--backend" in sys.argv:  # the GPU machine: python -m tests.mpi.dispatch_checks --backend nccl
        no_profile_default(sys.argv[sys.argv.index("--backend") + 1])
        if W.rank == 0:
            print(f"dispatch_checks P={W.size}: no-profile default ok")
        return 0
    no_profile_default("mpi")
    if W.size > 1:
        try:
            autotune.init(profile=str(ROOT / PROFILES[W.rank % len(PROFILES)]))
        except ValueError as e:
            assert "differs" in str(e), e
        else:
            raise AssertionError("different profiles across ranks were accepted")
    autotune.init(profile=str(ROOT / PROFILES[0]) if W.rank == 0 else None)
    rng = np.random.default_rng([7, W.rank])
    for n in (1000, 1 << 16, 1 << 20):
        g = rng.standard_normal(n).astype(np.float32)
        out = autotune.allreduce(g, name=f"w{n}", density=0.01)
        exact = autotune.allreduce(g)  # unnamed: never lossy
        ref = np.empty(n, np.float64)
        W.Allreduce(g.astype(np.float64), ref)
        assert np.allclose(exact, ref, rtol=1e-4, atol=1e-4), "unnamed tensor lost precision"
        picks = W.allgather({k[0]: c.algorithm for k, c in autotune.decisions().items()})
        assert all(p == picks[0] for p in picks), f"ranks disagree: {picks}"
        hs = W.allgather(zlib.crc32(out.tobytes()))
        assert all(h == hs[0] for h in hs), "outputs differ across ranks"
    unnamed = [c.algorithm for k, c in autotune.decisions().items() if k[0] is None]
    from collectives import ALGORITHMS

    assert unnamed and not any(ALGORITHMS[a].lossy for a in unnamed), unnamed
    # rank 0 decides from the 1 Gbit/s profile: a named 2^20 tensor goes sparse there
    key, big = next((k, c) for k, c in autotune.decisions().items() if k[0] == f"w{1 << 20}")
    assert ALGORITHMS[big.algorithm].lossy, big.algorithm
    # a later call's density is used, not the one the decision was made at
    g = rng.standard_normal(1 << 20).astype(np.float32)
    autotune.allreduce(g, name=key[0], density=0.05)
    assert autotune.algorithm_instance(big.algorithm).state(key[0]).density == 0.05
    # SparseSGD with a density warm-up decides at its target density, then follows the schedule
    from autotune.training import SparseSGD

    sgd = SparseSGD(algorithm="auto", density=0.001, warmup_steps=1, density_warmup=3,
                    prefix="dw")
    for _ in range(6):
        sgd.synchronize([("w", rng.standard_normal(1 << 20).astype(np.float32))])
    c = autotune.decisions()[("dw.flat.float32", (1 << 20,), "float32", W.size, "cpu")]
    assert c.density == 0.001, c.density
    assert autotune.algorithm_instance(c.algorithm).state("dw.flat.float32").density == 0.001
    # tuned refresh intervals reach the tensor's state, through auto and forced calls
    g = rng.standard_normal(1 << 16).astype(np.float32)
    autotune.allreduce(g, name="tp", algorithm="oktopk", density=0.01, tau_prime=1, tau=5)
    st = autotune.algorithm_instance("oktopk").state("tp")
    assert (st.tau_prime, st.tau) == (1, 5), (st.tau_prime, st.tau)
    thr = []
    for _ in range(3):  # tau' = 1: the local threshold is exact at every call
        autotune.allreduce(rng.standard_normal(1 << 16).astype(np.float32), name="tp",
                           algorithm="oktopk", density=0.01)
        thr.append(autotune.algorithm_instance("oktopk").last_stats["refresh"])
    assert all(thr), thr
    autotune.allreduce(rng.standard_normal(1 << 20).astype(np.float32), name=key[0], density=0.05,
                       tau_prime=4)
    assert autotune.algorithm_instance(big.algorithm).state(key[0]).tau_prime == 4
    # parameters that differ across ranks: the same clear error on every rank, no hang
    for kw in () if W.size == 1 else ({"density": 0.01 * (1 + W.rank % 2)}, {"density": 0.01, "tau_prime": 1 + W.rank % 2},
               {"density": 0.01, "tau": 8 if W.rank == W.size - 1 else None}):
        for algorithm in ("oktopk", "gtopk", "auto"):
            try:
                autotune.allreduce(g, name=f"bad.{algorithm}", algorithm=algorithm, **kw)
            except ValueError as e:
                assert "parameters differ" in str(e), e
            else:
                raise AssertionError(f"no error for {kw} with {algorithm} on rank {W.rank}")
    # algorithm options: installed on every rank; differing ones raise on every rank
    autotune.init(options={"oktopk": {"residuals": "owner", "tau": 16}})
    assert autotune.algorithm_instance("oktopk").residuals == "owner"
    autotune.allreduce(g, name="opt", algorithm="oktopk", density=0.01)
    assert autotune.algorithm_instance("oktopk").state("opt").tau == 16
    for bad in () if W.size == 1 else ({"oktopk": {"tau": 8 + W.rank % 2}},
                                        {"oktopk": {"tau": 8}} if W.rank else {}):
        try:
            autotune.init(options=bad)
        except ValueError as e:
            assert "differ across ranks" in str(e), e
        else:
            raise AssertionError(f"no error for options {bad} on rank {W.rank}")
    autotune.init(options={})
    assert autotune.algorithm_instance("oktopk").residuals == "contributor"
    # forget: a prefix's states freed on every rank; those tensors start afresh
    for name in ("m.a", "m.b", "keep"):
        autotune.allreduce(g, name=name, algorithm="oktopk", density=0.01)
    assert autotune.forget("m.") == ["m.a", "m.b"]
    assert set(autotune.algorithm_instance("oktopk").states) == {"keep"}
    out = autotune.allreduce(g, name="m.a", algorithm="oktopk", density=0.01)
    assert len(set(W.allgather(zlib.crc32(out.tobytes())))) == 1
    assert autotune.algorithm_instance("oktopk").state("m.a").iteration == 1
    # close frees exactly the tensors its object reduced, not another's under the same prefix
    a = SparseSGD(algorithm="oktopk", density=0.01, flat=False, prefix="same")
    b = SparseSGD(algorithm="oktopk", density=0.01, flat=False, prefix="same")
    a.synchronize([("w", g.copy())])
    b.synchronize([("v", g.copy())])
    assert a.close() == ["same.w"] and a.step == 0
    assert "same.v" in autotune.algorithm_instance("oktopk").states
    if W.rank == 0:
        print("dispatch ok:", {k[0]: c.algorithm for k, c in autotune.decisions().items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

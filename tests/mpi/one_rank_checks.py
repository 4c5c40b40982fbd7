"""One bad rank: every input the API takes, differing on one rank only (run under mpiexec).

Each case makes one rank (the last, or rank 0 where rank 0 is special) pass
something different or invalid, and asserts that every rank raises an error
of the same type, or that every rank gets the right answer.  After each case
a dense allreduce checks that the library still works.  A watchdog ends the
job if a case hangs, naming it (pytest's timeout is the second line of defence).

Also: a user's pending wildcard receive and a user's own nonblocking
collective, on the caller's communicator, while the library runs every
algorithm (the library talks on its own duplicate, so neither matches it).

    mpiexec -n 3 python -m tests.mpi.one_rank_checks [--seed S] [--array cupy]

``--array cupy`` (a GPU per rank): the library on NCCL, and the call cases
(dtype, shape, size, contiguity, NaN/Inf, name, algorithm, parameters) on
device arrays; a device NaN/Inf is reported by ``autotune.synchronize()``,
which each such call is followed by (as a training step's end is).  The
caller's-communicator cases are MPI-only and are left out there.
"""
import argparse
import faulthandler
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import autotune
from collectives import ALGORITHMS
from tests.mpi import abort_job

W = MPI.COMM_WORLD
R, P = W.Get_rank(), W.Get_size()
BAD = P - 1
PROFILES = Path(__file__).resolve().parents[2] / "profiles"
GOOD, OTHER = str(PROFILES / "cpu_shm_p4.json"), str(PROFILES / "cpu_tcp1gbit_p4.json")
CASE_TIMEOUT_S = 60
DEVICE = False  # --array cupy (set by main)
SPARSE = sorted(a for a, c in ALGORITHMS.items() if c.lossy and "mpi" in c.backends)
EXACT = sorted(a for a, c in ALGORITHMS.items() if not c.lossy and "mpi" in c.backends)


def _bad(value, other, rank=BAD):
    return value if R == rank else other


def raises_everywhere(fn, *, match: str | None = None):
    """``fn()`` must raise on every rank, the same exception type everywhere."""
    try:
        fn()
        got = None
    except (ValueError, TypeError, RuntimeError) as e:
        got = e
    seen = W.allgather(None if got is None else (type(got).__name__, str(got)))
    assert all(s is not None for s in seen), f"raised on some ranks only: {seen}"
    assert len({s[0] for s in seen}) == 1, f"different exception types: {seen}"
    if match is not None:
        assert all(match in s[1] for s in seen), f"expected {match!r} in {seen}"
    return 1


def _to_device(t):
    """A cupy copy of a numpy array (a strided view stays a strided view)."""
    import cupy as cp

    if not isinstance(t, np.ndarray):
        return t
    if t.flags.c_contiguous:
        return cp.asarray(t)
    base = t.base  # a strided view of a contiguous array from its start (x[::2])
    assert base is not None and base.flags.c_contiguous and \
        t.__array_interface__["data"][0] == base.__array_interface__["data"][0]
    return cp.ndarray(t.shape, t.dtype, cp.asarray(base).data, strides=t.strides)


def device_call(t, **kw):
    """``autotune.allreduce`` on a device copy of ``t``, then the end-of-step check."""
    try:
        return autotune.allreduce(_to_device(t), **kw)
    finally:
        autotune.synchronize()


def healthy(rng) -> None:
    """A dense allreduce still gives the exact sum (nothing left in flight)."""
    x = rng.standard_normal(257).astype(np.float64)
    ref = np.empty_like(x)
    W.Allreduce(x, ref)
    out = autotune.allreduce(x, algorithm="dense")
    assert np.allclose(out, ref, rtol=1e-12, atol=1e-12)
    if DEVICE:  # nothing left half-entered on NCCL either
        out = device_call(x, algorithm="dense").get()
        assert np.allclose(out, ref, rtol=1e-12, atol=1e-12)


def cases(rng, tmp: Path):
    x = rng.standard_normal(4096).astype(np.float32)
    call = device_call if DEVICE else autotune.allreduce
    yield "dtype int32", lambda: raises_everywhere(
        lambda: call(_bad(x.astype(np.int32), x), algorithm="dense"))
    yield "dtype float64", lambda: raises_everywhere(
        lambda: call(_bad(x.astype(np.float64), x), algorithm="dense"), match="dtype")
    yield "dtype float16", lambda: raises_everywhere(
        lambda: call(_bad(x.astype(np.float16), x), name="h", algorithm="topka"))
    yield "shape", lambda: raises_everywhere(
        lambda: call(_bad(x.reshape(32, 128), x.reshape(64, 64)), algorithm="dense"),
        match="shape")
    yield "size", lambda: raises_everywhere(
        lambda: call(_bad(x[:-1].copy(), x), algorithm="dense"), match="size")
    yield "non-contiguous", lambda: raises_everywhere(
        lambda: call(_bad(x[::2], x[:2048].copy()), algorithm="dense"), match="contiguous")
    nan = x.copy()
    nan[5] = np.nan
    yield "nan", lambda: raises_everywhere(
        lambda: call(_bad(nan, x), algorithm="dense"), match="NaN")
    inf = x.copy()
    inf[7] = np.inf
    yield "inf sparse", lambda: raises_everywhere(
        lambda: call(_bad(inf, x), name="inf", algorithm="oktopk", density=0.01), match="Inf")
    yield "empty", lambda: raises_everywhere(
        lambda: call(_bad(x[:0], x), algorithm="dense"))
    yield "not an array", lambda: raises_everywhere(
        lambda: call(_bad(list(x[:4]), x[:4].copy()), algorithm="dense"), match="unsupported")
    yield "name", lambda: raises_everywhere(
        lambda: call(x, name=_bad("a", "b"), algorithm="topka", density=0.01), match="name")
    yield "name missing", lambda: raises_everywhere(
        lambda: call(x, name=_bad(None, "n"), algorithm="gtopk", density=0.01))
    pairs = [("oktopk", "topka"), ("dense", "mpi"), ("gtopk", "topkdsa"), ("auto", "dense"),
             ("gaussiank", "topka2a"), ("oktopk", "auto")]
    for a, b in pairs:
        yield f"algorithm {a}/{b}", lambda a=a, b=b: raises_everywhere(
            lambda: call(x, name="alg", algorithm=_bad(a, b), density=0.01),
            match="algorithm")
    yield "algorithm unknown", lambda: raises_everywhere(
        lambda: call(x, name="u", algorithm=_bad("nope", "dense")), match="unknown algorithm")
    if not DEVICE:
        yield "algorithm nccl on mpi", lambda: raises_everywhere(
            lambda: call(x, algorithm=_bad("nccl", "dense")))
    yield "density", lambda: raises_everywhere(
        lambda: call(x, name="d", algorithm="oktopk", density=_bad(0.02, 0.01)),
        match="parameters differ")
    for d in (0.0, 2.0, -1.0, "0.01", float("nan")):
        yield f"density {d!r}", lambda d=d: raises_everywhere(
            lambda: call(x, name="d", algorithm="topka", density=_bad(d, 0.01)))
    yield "op", lambda: raises_everywhere(
        lambda: call(x, algorithm="dense", op=_bad("mean", "sum")), match="op")
    yield "op unknown", lambda: raises_everywhere(
        lambda: call(x, algorithm="dense", op=_bad("max", "sum")), match="op")
    yield "tau", lambda: raises_everywhere(
        lambda: call(x, name="t", algorithm="oktopk", density=0.01, tau=_bad(8, 16)))
    yield "tau_prime 0", lambda: raises_everywhere(
        lambda: call(x, name="t", algorithm="oktopk", density=0.01, tau_prime=_bad(0, 4)),
        match="tau_prime")
    yield "tau 1.5", lambda: raises_everywhere(
        lambda: call(x, name="t", algorithm="topka", density=0.01, tau=_bad(1.5, 2)))
    yield "forget prefix", lambda: raises_everywhere(
        lambda: autotune.forget(_bad("a.", "b.")), match="differ")
    yield "resolve name", lambda: raises_everywhere(
        lambda: autotune.resolve(x, name=_bad("r1", "r2")), match="name")

    # -- init: profile, options, environment ------------------------------------------
    missing, corrupt = str(tmp / "missing.json"), tmp / "corrupt.json"
    corrupt.write_text('{"schema": "autotune-profile", "version": 1, "fing')
    yield "profile missing everywhere", lambda: raises_everywhere(
        lambda: autotune.init(profile=missing), match="no such file")
    yield "profile corrupt on rank 0 only", lambda: raises_everywhere(
        lambda: autotune.init(profile=_bad(str(corrupt), None, rank=0)), match="not valid JSON")
    yield "profile corrupt on one rank", lambda: raises_everywhere(
        lambda: autotune.init(profile=_bad(str(corrupt), GOOD)))
    yield "profile missing on one rank", lambda: raises_everywhere(
        lambda: autotune.init(profile=_bad(missing, GOOD)), match="no such file")
    yield "profile differs", lambda: raises_everywhere(
        lambda: autotune.init(profile=_bad(OTHER, GOOD)), match="differs")
    yield "profile not on rank 0", lambda: raises_everywhere(
        lambda: autotune.init(profile=_bad(None, GOOD, rank=0)), match="rank 0")

    def profile_on_rank0_only():
        # allowed: rank 0 decides; every rank runs its choice
        autotune.init(profile=GOOD if R == 0 else None)
        g = rng.standard_normal(1 << 14).astype(np.float32)
        W.Bcast(g, 0)
        out = autotune.allreduce(g, name="p0", density=0.01)
        picks = W.allgather(autotune.decisions()[("p0", g.shape, "float32", P, "cpu")].algorithm)
        assert len(set(picks)) == 1, picks
        assert len(set(W.allgather(out.tobytes()))) == 1
        return 1
    yield "profile on rank 0 only", profile_on_rank0_only

    def selector_fails_on_rank0():
        # the profile loads and agrees everywhere; building rank 0's selector raises
        import autotune.selector as sel

        def broken(self, *a, **kw):
            raise RuntimeError("a fit failed")
        real = sel.Selector.__init__
        sel.Selector.__init__ = broken if R == 0 else real
        try:
            return raises_everywhere(lambda: autotune.init(profile=GOOD),
                                     match="no selector could be built")
        finally:
            sel.Selector.__init__ = real
    yield "selector fails on rank 0", selector_fails_on_rank0
    yield "options differ", lambda: raises_everywhere(
        lambda: autotune.init(options={"oktopk": {"tau": _bad(8, 16)}}), match="differ")
    yield "options unknown algorithm", lambda: raises_everywhere(
        lambda: autotune.init(options=_bad({"nope": {}}, {})))
    yield "options bad keyword", lambda: raises_everywhere(
        lambda: autotune.init(options={"oktopk": _bad({"no_such": 1}, {})}))

    # -- training side: constructors and broadcasts -------------------------------------
    from autotune.training import SparseSGD
    yield "SparseSGD algorithm", lambda: raises_everywhere(
        lambda: SparseSGD(algorithm=_bad("nope", "oktopk"), density=0.01))
    yield "SparseSGD density", lambda: raises_everywhere(
        lambda: SparseSGD(algorithm="oktopk", density=_bad(2.0, 0.01)))

    def sgd_algorithm_differs():
        sgd = SparseSGD(algorithm=_bad("topka", "oktopk"), density=0.01, prefix="sgdd")
        return raises_everywhere(lambda: sgd.synchronize([("w", x.copy())]), match="algorithm")
    yield "SparseSGD algorithm differs", sgd_algorithm_differs

    def sgd_warmup_differs():
        sgd = SparseSGD(algorithm="oktopk", density=0.01, warmup_steps=_bad(1, 0), prefix="sgdw")
        return raises_everywhere(lambda: sgd.synchronize([("w", x.copy())]), match="algorithm")
    yield "SparseSGD warm-up differs", sgd_warmup_differs

    torch = None
    if P == 2:  # the torch cases: importing torch takes 3 s of CPU per rank, and the
        # agreement they rely on is the one the cases above run at every P
        try:
            import torch
        except ImportError:
            pass
    if torch is not None:
        import autotune.torch as at

        def model():
            torch.manual_seed(0)
            return torch.nn.Linear(8, 4)
        yield "broadcast_parameters shape", lambda: raises_everywhere(
            lambda: at.broadcast_parameters(
                [torch.zeros(_bad(5, 4)), torch.zeros(3)]), match="layout")
        yield "broadcast_parameters root", lambda: raises_everywhere(
            lambda: at.broadcast_parameters(model(), root_rank=_bad(P, 0)))
        yield "broadcast_parameters count", lambda: raises_everywhere(
            lambda: at.broadcast_parameters([torch.zeros(4)] * _bad(2, 1)), match="layout")

        def optimizer_momentum():
            m = model()
            opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=_bad(0.9, 0.0))
            return raises_everywhere(lambda: at.DistributedOptimizer(
                opt, m.named_parameters(), algorithm="oktopk", density=0.1, momentum=0.9))
        yield "DistributedOptimizer momentum", optimizer_momentum

        def optimizer_algorithm():
            m = model()
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            return raises_everywhere(lambda: at.DistributedOptimizer(
                opt, m.named_parameters(), algorithm=_bad("nope", "topka"), density=0.1))
        yield "DistributedOptimizer algorithm", optimizer_algorithm
        yield "HookState algorithm", lambda: raises_everywhere(
            lambda: at.HookState(algorithm=_bad("nope", "oktopk"), density=0.01))
        yield "HookState chunk differs", lambda: raises_everywhere(
            lambda: at.HookState(algorithm="topka", chunk=_bad(1 << 20, 1 << 21)), match="chunk")

        # before any case below initializes torch.distributed (later calls return at once)
        yield "init_process_group port differs", lambda: raises_everywhere(
            lambda: at.init_process_group("gloo", port=_bad(29500, 29501)),
            match="init_process_group")

        def register_algorithm_differs():
            from torch.nn.parallel import DistributedDataParallel as DDP

            at.init_process_group("nccl" if DEVICE else "gloo")
            if DEVICE:
                dev = torch.device("cuda", autotune.dispatch.communicator().device)
                torch.cuda.set_device(dev)
                ddp = DDP(model().to(dev), device_ids=[dev.index])
            else:
                ddp = DDP(model())
            return raises_everywhere(lambda: at.register(
                ddp, algorithm=_bad("topka", "nccl"), density=0.1), match="register")
        yield "register algorithm differs", register_algorithm_differs

        def register_state_and_arguments():
            from torch.nn.parallel import DistributedDataParallel as DDP

            at.init_process_group("nccl" if DEVICE else "gloo")
            if DEVICE:
                dev = torch.device("cuda", autotune.dispatch.communicator().device)
                ddp = DDP(model().to(dev), device_ids=[dev.index])
            else:
                ddp = DDP(model())
            state = at.HookState(algorithm="topka", density=0.1, prefix="regboth")
            extra = _bad({"density": 0.2}, {})
            return raises_everywhere(lambda: at.register(ddp, state, **extra), match="not both")
        yield "register state and arguments", register_state_and_arguments
        if DEVICE and torch.cuda.is_available():
            yield "DDP hook NaN gradient", lambda: ddp_hook_nan(torch, at)

    # -- the caller's own traffic on the caller's communicator --------------------------
    if P > 1 and not DEVICE:
        yield "user wildcard receive", lambda: user_wildcard_receive(rng)
        yield "user collective interleaved", lambda: user_collective(rng)


def ddp_hook_nan(torch, at) -> int:
    """A NaN gradient on one rank at step 2 of a DDP model on GPUs (NCCL) is
    raised on every rank by that step's backward (the hook's end-of-step
    report), on each of the hook's paths: "each" (dense), "lane" (nccl),
    "group" (topka in pieces of >= 64 elements; step 2 is its second sparse
    step, whose pieces skip the host exchange), and by register()'s native
    route (DDP's allreduce)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    at.init_process_group("nccl")
    dev = torch.device("cuda", autotune.dispatch.communicator().device)
    torch.cuda.set_device(dev)
    for algorithm in ("dense", "nccl", "topka", "native"):
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 4)).to(dev),
                    device_ids=[dev.index], bucket_cap_mb=0.001)  # several buckets
        if algorithm == "native":
            state = at.register(model, algorithm="nccl", prefix="nan.native")
            assert state.native, "register(nccl) on NCCL kept a Python hook"
        else:
            state = at.HookState(algorithm=algorithm, density=0.1, prefix=f"nan.{algorithm}",
                                 chunk=64)  # topka: several pieces, each on the CUDA stream
            model.register_comm_hook(state, at.allreduce_hook)
        raised = None
        for step in range(4):
            x = torch.ones(2, 8, device=dev)
            if step == 2 and R == BAD:
                x[0, 0] = float("nan")
            model.zero_grad(set_to_none=True)  # a NaN gradient does not carry over
            try:
                model(x).sum().backward()
            except Exception as e:  # noqa: BLE001 - DDP's wait re-raises the hook's error
                raised = (step, "NaN or Inf" in str(e))
                break
        torch.cuda.synchronize()
        state.close()
        seen = W.allgather(raised)
        assert all(s == (2, True) for s in seen), \
            f"{algorithm}: expected (step 2, NaN) everywhere: {seen}"
    return 4


def _every_algorithm(rng, tag: str) -> int:
    n = 0
    for alg in EXACT + SPARSE:
        g = rng.standard_normal(3000).astype(np.float32)
        ref = np.empty(g.size, np.float64)
        W.Allreduce(g.astype(np.float64), ref)
        out = autotune.allreduce(g, name=f"{tag}.{alg}", algorithm=alg, density=0.05)
        assert len(set(W.allgather(out.tobytes()))) == 1, alg
        if alg in EXACT:
            assert np.allclose(out, ref, rtol=1e-4, atol=1e-4), alg
        n += 1
    return n


def user_wildcard_receive(rng) -> int:
    """Rank 0 has ``Irecv(ANY_SOURCE, ANY_TAG)`` pending on the caller's communicator
    while the library runs every algorithm; it must get the user's message only."""
    buf = np.zeros(4, np.float64)
    req = W.Irecv(buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG) if R == 0 else None
    n = _every_algorithm(rng, "wild")
    matched = bool(req.Test()) if R == 0 else False
    W.Barrier()  # rank 1 sends only after rank 0 has looked
    assert not matched, "the user's wildcard receive matched a library message"
    if R == 1:
        W.Send(np.full(4, 7.0), dest=0, tag=99)
    if R == 0:
        status = MPI.Status()
        req.Wait(status)
        assert (buf == 7.0).all() and status.Get_source() == 1 and status.Get_tag() == 99, \
            (buf, status.Get_source(), status.Get_tag())
    return n


def user_collective(rng) -> int:
    """A user's nonblocking allreduce and barrier on the caller's communicator stay
    in flight across the library's calls and complete with the right result."""
    a = np.full(8, float(R + 1))
    b = np.empty_like(a)
    req = W.Iallreduce(a, b)
    bar = W.Ibarrier()
    n = _every_algorithm(rng, "coll")
    MPI.Request.Waitall([req, bar])
    assert (b == P * (P + 1) / 2).all(), b
    return n


def main(argv=None) -> int:
    global DEVICE
    ap = argparse.ArgumentParser(prog="python -m tests.mpi.one_rank_checks",
                                 description="one bad rank never hangs the job")
    ap.add_argument("--seed", type=int, help="default: a fresh one, printed")
    ap.add_argument("--array", choices=("numpy", "cupy"), default="numpy",
                    help="cupy: the call cases on device arrays, the library on NCCL")
    args = ap.parse_args(argv)
    if P < 2:
        ap.error(f"needs P >= 2 ranks (one bad rank among good ones), got P = {P}")
    DEVICE = args.array == "cupy"
    seed = args.seed if args.seed is not None else \
        int(np.random.SeedSequence().entropy % (1 << 31))
    seed = W.bcast(seed, 0)
    rng = np.random.default_rng([seed, R])
    tmp = Path(W.bcast(tempfile.mkdtemp(prefix="autotune-onerank-") if R == 0 else None, 0))
    if DEVICE:
        import collectives

        autotune.init(collectives.NCCLCommunicator(collectives.MPICommunicator()), options={})
    else:
        autotune.init(options={})
    total = 0
    try:
        for name, case in cases(rng, tmp):
            if R == 0:
                print(f"  {name:34s} ...", end=" ", flush=True)
            faulthandler.dump_traceback_later(CASE_TIMEOUT_S, exit=True)
            t0 = time.perf_counter()
            try:
                total += case()
                healthy(rng)
            except Exception:
                return abort_job(W, f"one_rank {name}", seed)
            finally:
                faulthandler.cancel_dump_traceback_later()
            if R == 0:
                print(f"ok ({time.perf_counter() - t0:.2f} s)", flush=True)
    finally:
        W.Barrier()
        if R == 0:
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
    if R == 0:
        print(f"one_rank P={P}{' on GPUs (NCCL, cupy)' if DEVICE else ''}: {total} cases "
              f"passed (seed {seed})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

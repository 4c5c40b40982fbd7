"""PyTorch integration checks, run under ``mpiexec -n P`` (launched by
tests/test_torch_integration.py).

Cases (all by default; ``--cases a,b`` to pick):
  optimizer   autotune.torch.DistributedOptimizer, no torch.distributed: for
              every algorithm (dense, the sparse ones, auto), flat and
              per-layer, a few SGD-with-momentum steps on different data per
              rank; the SHA-256 of all parameters is identical on every rank,
              the parameters moved, and warm-up/sparse steps are counted.
              With ``dense`` the result equals one process training on the
              whole global batch (the average over ranks is the global mean).
  ddp         DistributedDataParallel (gloo on the MPI ranks: rank 0 picks a
              free port and broadcasts it) with autotune.torch.allreduce_hook,
              several buckets; identical parameters on every rank for every
              algorithm, and with ``dense`` the same parameters as DDP's own
              allreduce.
  native      autotune.torch.register's native route (DDP's own allreduce plus
              the library's end-of-backward NaN/Inf check and counts), forced on
              gloo: gradients equal DDP's, a NaN on one rank raised on every
              rank, no_sync() passes not counted.
  broadcast   broadcast_parameters makes differently initialized replicas
              (parameters and buffers) equal to rank 0's.
  half        bfloat16 and float16 models through DistributedOptimizer and the
              DDP hook (gradients reduced in float32): identical replicas, the
              parameters' dtype kept.
Exits non-zero (aborting the job) on the first failure.
"""
from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import autotune
import autotune.torch as at
from collectives import ALGORITHMS
from tests.mpi import run_cases

COMM = autotune.init()
RANK, P = COMM.rank, COMM.size
SPARSE = [a for a in ("gtopk", "topka", "oktopk", "topka2a") if a in ALGORITHMS]
STEPS = 4
LOCAL_B = 3


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def all_digests(model, buffers: bool = False) -> list[str]:
    d = at.state_digest(model, buffers=buffers)
    return [COMM.bcast_obj(d if RANK == r else None, r) for r in range(P)]


class WithUnused(nn.Module):
    """A model one of whose parameters gets no gradient (grad stays None)."""

    def __init__(self, body):
        super().__init__()
        self.body = body
        self.unused = nn.Linear(2, 2)

    def forward(self, x):
        return self.body(x)


def model_fn(seed: int = 0, unused: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    body = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 16), nn.BatchNorm1d(16),
                         nn.ReLU(), nn.Linear(16, 3))
    return WithUnused(body) if unused else body


def max_diff(p, q) -> float:
    return float((p.detach() - q.detach()).abs().max())


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(LOCAL_B, 12, generator=g), torch.randint(0, 3, (LOCAL_B,), generator=g)


def loss_fn(net, x, y):
    return nn.functional.cross_entropy(net(x), y)


def case_optimizer() -> int:
    n = 0
    for algorithm in ["dense", "auto", *SPARSE]:
        for flat in (True, False):
            model = model_fn(seed=RANK, unused=True)  # different start on purpose:
            at.broadcast_parameters(model)       # broadcast must fix it
            start = at.state_digest(model)
            opt = at.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                named_parameters=model.named_parameters(), algorithm=algorithm,
                density=0.05, flat=flat, warmup_steps=1, prefix=f"opt.{algorithm}.{flat}")
            for step in range(STEPS):
                x, y = batch(step, RANK)
                opt.zero_grad()
                loss_fn(model, x, y).backward()
                opt.step()
            digests = all_digests(model)
            check(len(set(digests)) == 1,
                  f"optimizer {algorithm} flat={flat}: replicas differ: {digests}")
            check(digests[0] != start, f"optimizer {algorithm} flat={flat}: nothing moved")
            st = opt.sparse_sgd
            check(st.step == STEPS and st.dense_steps == 1 and st.sparse_steps == STEPS - 1,
                  f"optimizer {algorithm}: step counts {st.stats()}")
            if algorithm == "dense":
                ref = model_fn(seed=0, unused=True)
                ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
                for step in range(STEPS):
                    xs, ys = zip(*(batch(step, r) for r in range(P)))
                    # the global batch's mean loss = the mean over ranks of local means;
                    # BatchNorm normalizes per rank, so apply it per shard too
                    ref_opt.zero_grad()
                    sum(loss_fn(ref, x, y) for x, y in zip(xs, ys)).div(P).backward()
                    ref_opt.step()
                for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                    check(torch.allclose(p, q, rtol=1e-4, atol=1e-6),
                          f"optimizer dense flat={flat}: {name} differs from the "
                          f"single-process global-batch run by {max_diff(p, q):.3g}")
            n += 1
    return n


def case_ddp() -> int:
    from torch.nn.parallel import DistributedDataParallel as DDP

    at.init_process_group("gloo")
    n = 0
    finals, exact = {}, set()
    DDP_OF = {}  # model -> its DDP wrapper

    def train(**hook):
        """STEPS of SGD on a fresh DDP model, through the hook of ``HookState(**hook)``
        (none: DDP's allreduce); (model, state)."""
        model = model_fn(seed=RANK)            # DDP broadcasts rank 0's at construction
        net = DDP_OF[model] = DDP(model, bucket_cap_mb=0.001)  # ~1 KB buckets: several per step
        state = None
        if hook:
            state = at.HookState(warmup_steps=1, **hook)
            net.register_comm_hook(state, at.allreduce_hook)
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        for step in range(STEPS):
            x, y = batch(step, RANK)
            opt.zero_grad()
            loss_fn(net, x, y).backward()
            opt.step()
        return model, state

    for algorithm in ["default", "dense", "auto", *SPARSE]:
        model, state = train() if algorithm == "default" else train(
            algorithm=algorithm, density=0.05, prefix=f"ddp.{algorithm}")
        digests = all_digests(model)
        check(len(set(digests)) == 1, f"ddp {algorithm}: replicas differ: {digests}")
        if state is not None:
            check(state.sgd.step == STEPS and state.sgd.sparse_steps == STEPS - 1,
                  f"ddp {algorithm}: step counts {state.sgd.stats()}")
            picks = {c.algorithm for k, c in autotune.decisions().items()
                     if (k.name or "").startswith(f"ddp.{algorithm}.")}
            lossy = algorithm in SPARSE or any(ALGORITHMS[a].lossy for a in picks)
            if not lossy:
                exact.add(algorithm)
            freed = state.close()  # the buckets' residuals leave the library
            check(bool(freed) == bool(lossy) and all(f.startswith(f"ddp.{algorithm}.")
                                                      for f in freed),
                  f"ddp {algorithm}: close freed {freed}")
            check(not any(name.startswith(f"ddp.{algorithm}.") for a in SPARSE
                          for name in autotune.algorithm_instance(a).states),
                  f"ddp {algorithm}: states left after close")
        finals[algorithm] = [p.detach().clone() for p in model.parameters()]
        n += 1
    # the lossy path in pieces (HookState.chunk): at density 1 TopkA is an exact sum, so
    # each piece's result, copied back into its buckets, must give DDP's training
    chunk = max(1, sum(p.numel() for p in model_fn(seed=RANK).parameters()) // 3)
    model, state = train(algorithm="topka", density=1.0, prefix="ddp.pieces", chunk=chunk)
    pieces = sorted(name for name in state.sgd._names if ".model." in name)  # not warm-up's
    check(len(pieces) >= 2 and all(".model.c" in name for name in pieces),
          f"ddp pieces: names {pieces} (chunk {chunk})")
    for p, q in zip(finals["default"], model.parameters()):
        check(torch.allclose(p, q, rtol=1e-4, atol=1e-6),
              f"ddp pieces: differs from DDP's allreduce by {max_diff(p, q):.3g}")
    state.close()
    n += 1
    # an error in a piece that is not the last voids the rest of its step on every rank:
    # later pieces are not reduced (no new names, no residuals), the step is not counted,
    # and the next step trains with the same pieces
    model, state = train(algorithm="topka", density=0.5, prefix="ddp.fail", chunk=chunk)
    names, steps, cls = set(state.sgd._names), state.sgd.step, type(state.sgd)
    orig = cls.allreduce

    def failing(self, tensor, key, **kw):
        if key.startswith("model.c0."):
            raise RuntimeError("injected")
        return orig(self, tensor, key, **kw)
    cls.allreduce = failing  # SparseSGD has __slots__: patched on the class, for one pass
    x, y = batch(0, RANK)
    try:
        loss_fn(DDP_OF[model], x, y).backward()
        raised = None
    except RuntimeError as e:
        raised = str(e)
    finally:
        cls.allreduce = orig
    check(raised is not None and "injected" in raised, f"ddp fail: raised {raised!r}")
    check(state.sgd.step == steps and set(state.sgd._names) == names,
          f"ddp fail: step {steps} -> {state.sgd.step}, names {sorted(set(state.sgd._names) - names)}")
    loss_fn(DDP_OF[model], x, y).backward()
    check(state.sgd.step == steps + 1 and set(state.sgd._names) == names,
          "ddp fail: the step after the error")
    state.close()
    n += 1
    check("dense" in exact, f"ddp: exact hooks {exact}")
    for algorithm in sorted(exact):  # "auto" too, where it picked exact algorithms only
        for p, q in zip(finals["default"], finals[algorithm]):
            check(torch.allclose(p, q, rtol=1e-4, atol=1e-6),
                  f"ddp: the {algorithm} hook differs from DDP's allreduce by {max_diff(p, q):.3g}")
    return n


def case_native() -> int:
    """register()'s native route (DDP averages, the library checks), forced on
    gloo: register() on a CPU model keeps the hook, the checks read DDP's
    averaged gradients (a NaN on rank 0 alone is raised on every rank; that
    step is not counted, its bytes are), no_sync() passes are not counted,
    training goes on after the error."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from autotune.torch._native import _NativeChecks

    at.init_process_group("gloo")
    state = at.register(DDP(model_fn(seed=0), bucket_cap_mb=0.001), algorithm="nccl")
    check(not state.native, "register: native route chosen without NCCL")
    model = model_fn(seed=0)
    net = DDP(model, bucket_cap_mb=0.001)
    state = at.HookState(algorithm="nccl", prefix="native")
    _NativeChecks(net, [p for p in model.parameters() if p.requires_grad], state)
    ref_model = model_fn(seed=0)
    ref = DDP(ref_model, bucket_cap_mb=0.001)
    outcomes = []
    for step in range(5):
        x, y = batch(step, RANK)
        if step == 2 and RANK == 0:
            x = x.clone()
            x[0, 0] = float("nan")
        with net.no_sync():  # a micro-batch that DDP does not average: not a step
            loss_fn(net, x, y).backward()
        net.zero_grad()
        try:
            loss_fn(net, x, y).backward()
            outcomes.append("ok")
        except ValueError as e:
            check("NaN or Inf" in str(e), f"native: {e}")
            outcomes.append("nan")
        if step != 2:
            ref.zero_grad()
            loss_fn(ref, x, y).backward()
            for p, q in zip(model.parameters(), ref_model.parameters()):
                check(torch.equal(p.grad, q.grad), f"native: step {step} gradients differ "
                      f"from DDP's by {max_diff(p.grad, q.grad):.3g}")
    check(outcomes == ["ok", "ok", "nan", "ok", "ok"], f"native: rank {RANK}: {outcomes}")
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    check(state.sgd.step == 4 and state.sgd.bytes_sent == 5 * -(-2 * n_bytes * (P - 1) // P),
          f"native: {state.sgd.stats()}")
    return 1


def case_broadcast() -> int:
    model = model_fn(seed=100 + RANK)
    model.train()
    model(torch.randn(5, 12) * (RANK + 1))   # BatchNorm running stats differ per rank
    at.broadcast_parameters(model)
    check(len(set(all_digests(model, buffers=True))) == 1,
          "broadcast_parameters left replicas different")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t() * (RANK + 1)  # non-contiguous
    at.broadcast_parameters([("t", t)])
    check(torch.equal(t, torch.arange(6, dtype=torch.float32).reshape(2, 3).t()),
          "broadcast_parameters: non-contiguous tensor not broadcast")
    return 2


def case_half() -> int:
    """A bfloat16 model (and a float16 one): its gradients are reduced in float32
    and rounded back; replicas stay identical and the parameters keep their dtype,
    through DistributedOptimizer (flat and per layer, with momentum correction) and
    the DDP hook."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    at.init_process_group("gloo")
    n = 0
    for dtype in (torch.bfloat16, torch.float16):
        for algorithm, flat, mc in (("dense", True, 0.0), ("oktopk", True, 0.0),
                                    ("oktopk", False, 0.0), ("topka", True, 0.9)):
            model = model_fn(seed=RANK).to(dtype)
            at.broadcast_parameters(model)
            start = at.state_digest(model)
            check(len(set(all_digests(model))) == 1, f"half {dtype}: broadcast failed")
            opt = at.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0 if mc else 0.9),
                named_parameters=model.named_parameters(), algorithm=algorithm,
                density=0.05, flat=flat, warmup_steps=1, momentum=mc,
                prefix=f"half.{dtype}.{algorithm}.{flat}.{mc}")
            for step in range(STEPS):
                x, y = batch(step, RANK)
                opt.zero_grad()
                loss_fn(model, x.to(dtype), y).backward()
                opt.step()
            what = f"half optimizer {dtype} {algorithm} flat={flat} momentum={mc}"
            check(all(p.dtype == dtype for p in model.parameters()), f"{what}: dtype changed")
            digests = all_digests(model)
            check(len(set(digests)) == 1, f"{what}: replicas differ: {digests}")
            check(digests[0] != start, f"{what}: nothing moved")
            n += 1
        if P > 1:   # a half model on rank 0 only: every rank raises, none hangs
            model = model_fn(seed=0).to(dtype if RANK == 0 else torch.float32)
            opt = at.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1),
                named_parameters=model.named_parameters(), algorithm="oktopk",
                density=0.05, prefix=f"half.mixed.{dtype}")
            x, y = batch(0, RANK)
            loss_fn(model, x.to(next(model.parameters()).dtype), y).backward()
            try:
                opt.step()
            except ValueError as e:
                check("differs across ranks" in str(e), f"half mixed {dtype}: {e}")
            else:
                raise AssertionError(f"half mixed {dtype}: no error")
            n += 1
        for algorithm in ("dense", "oktopk"):
            model = model_fn(seed=RANK).to(dtype)
            net = DDP(model, bucket_cap_mb=0.001)
            net.register_comm_hook(at.HookState(algorithm=algorithm, density=0.05,
                                                prefix=f"half.ddp.{dtype}.{algorithm}"),
                                   at.allreduce_hook)
            opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
            for step in range(STEPS):
                x, y = batch(step, RANK)
                opt.zero_grad()
                loss_fn(net, x.to(dtype), y).backward()
                opt.step()
            digests = all_digests(model)
            check(len(set(digests)) == 1, f"half ddp {dtype} {algorithm}: replicas differ")
            check(all(p.dtype == dtype for p in model.parameters()),
                  f"half ddp {dtype} {algorithm}: dtype changed")
            n += 1
    return n


CASES = {"optimizer": case_optimizer, "ddp": case_ddp, "native": case_native,
         "broadcast": case_broadcast, "half": case_half}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    return run_cases(COMM.comm, "torch_checks",
                     {name: CASES[name] for name in args.cases.split(",")})


if __name__ == "__main__":
    sys.exit(main())

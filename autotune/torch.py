"""PyTorch integration: a DDP communication hook and a Horovod-style optimizer.

Both send gradients through ``autotune.allreduce`` (dense during a warm-up,
then the chosen dense or sparse algorithm with error feedback, Algorithm 2
of Ok-Topk: see ``autotune.training``), average them by P and leave the
learning rate to the optimizer.  Every rank receives bitwise-identical
gradients, so replicas that start identical stay identical.

1. With ``torch.distributed`` and DistributedDataParallel::

       import autotune.torch as at
       at.init_process_group()                  # gloo over the MPI ranks
       ddp = torch.nn.parallel.DistributedDataParallel(model)
       state = at.register(ddp, algorithm="oktopk", density=0.01)

   ``register`` attaches the PowerSGD-style hook (``HookState`` +
   ``allreduce_hook``, also usable directly), or, where the algorithm is
   NCCL's own average, leaves DDP's native allreduce in place and adds only
   the checks (``register``'s docstring).

2. Without ``torch.distributed``, launched by ``mpiexec`` (Horovod-style)::

       import autotune.torch as at
       opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
       opt = at.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                     algorithm="oktopk", density=0.01, warmup_steps=50)
       at.broadcast_parameters(model)           # start from rank 0's weights
       for x, y in shard:
           opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

Half-precision models (bfloat16, float16) work with both: their gradients are
reduced in float32 (sparse residuals too) and rounded back to the parameters'
dtype (``autotune._convert``).

``import autotune`` never imports torch; this module does.
"""
# no ``from __future__ import annotations``: DDP checks the hook's return
# annotation against the real torch.futures.Future[torch.Tensor] object
import atexit
import contextlib
import functools
import hashlib
import os
import socket
import zlib

import numpy as np
import torch

from collectives import ALGORITHMS, NCCLCommunicator, agree, validate

from . import dispatch
from .training import SparseSGD

__all__ = [
    "DistributedOptimizer",
    "HookState",
    "allreduce_hook",
    "register",
    "broadcast_parameters",
    "current_lr",
    "init_process_group",
    "state_digest",
]


# -- torch.distributed on the MPI ranks ----------------------------------------------
def init_process_group(backend: str = "gloo", **kwargs) -> None:
    """Initialize ``torch.distributed`` with the MPI ranks (rank and world size
    from the Communicator).

    Rank 0 picks a free TCP port on ``MASTER_ADDR`` (default 127.0.0.1, i.e.
    all ranks on one host; set ``MASTER_ADDR`` to rank 0's address otherwise)
    and broadcasts it, unless ``MASTER_PORT`` is already set.  Idempotent.
    The group is destroyed at interpreter exit (gloo's worker threads must
    not outlive Python's finalization).

    Args:
        backend: "gloo" (CPU) or "nccl".
        kwargs: passed on to ``torch.distributed.init_process_group``.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    comm = dispatch.communicator()
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT")
    if port is None:
        port = comm.bcast_obj(_free_port(addr) if comm.rank == 0 else None, 0)
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}",
                            rank=comm.rank, world_size=comm.size, **kwargs)
    atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


# -- DDP communication hook ------------------------------------------------------------
class HookState:
    """State of ``allreduce_hook``: the algorithm choice and the step count.

    Args:
        algorithm: a name from ``collectives.ALGORITHMS`` or ``"auto"``.
        density: fraction of values a sparse algorithm sends.
        warmup_steps: iterations reduced densely first.  Keep it >= 1
            (the default): DDP rebuilds its buckets after the first
            iteration, and a bucket's state is keyed by its layout
            (``allreduce_hook``), so a residual left from a sparse first
            iteration would be orphaned (with momentum correction, a
            rebuilt bucket's velocity restarts from zero).
        prefix: tensor-name prefix (one per model in a process).
        momentum: momentum correction (``autotune.training``): the hook
            sends each bucket's velocity; the optimizer must then run
            without momentum.
        density_warmup: steps of falling density after the dense warm-up
            (``autotune.training.SparseSGD``).
        tau_prime, tau: the sparse algorithm's refresh intervals (``SparseSGD``).
        learning_rate: None, or a callable returning the optimizer's current
            rate (e.g. ``lambda: current_lr(opt)``): the residual
            accumulates lr x gradient as in the paper's Algorithm 2
            (``autotune.training``).

    ``sgd`` is the underlying ``autotune.training.SparseSGD`` (its
    statistics: steps, bytes sent, seconds in communication).  ``native``:
    True where ``register`` left DDP's own allreduce in place (no hook).
    """

    __slots__ = ("sgd", "native", "current", "auto_exact", "_names", "_lane")

    def __init__(self, *, algorithm: str = "auto", density: float | None = None,
                 warmup_steps: int = 1, prefix: str = "ddp", momentum: float = 0.0,
                 density_warmup: int = 0, tau_prime: int | None = None, tau: int | None = None,
                 learning_rate=None):
        self.sgd = SparseSGD(algorithm=algorithm, density=density,
                             warmup_steps=warmup_steps, flat=True, prefix=prefix,
                             momentum=momentum, density_warmup=density_warmup,
                             tau_prime=tau_prime, tau=tau, learning_rate=learning_rate)
        self.native = False     # register() left DDP's own allreduce in place
        self.current = _Step()  # the backward pass in flight
        self.auto_exact = None  # with "auto": whether its pick for the model is exact
        self._names: dict = {}  # (bucket index, numel, shapes) -> the bucket's name
        self._lane: dict = {}   # bucket name -> (its cupy view, checked across ranks once; tag)

    def close(self) -> list[str]:
        """Free the library's state for this hook's buckets (``SparseSGD.close``;
        collective), once the DDP model it is registered on is done with:
        every rank, after its last backward pass has completed."""
        self._names.clear()
        self._lane.clear()
        self.auto_exact = None
        return self.sgd.close()

    # -- used by allreduce_hook ---------------------------------------------------------
    def path(self, buf) -> str:
        """This step's path (``allreduce_hook``), decided at its first bucket."""
        sgd = self.sgd
        algorithm = sgd.current_algorithm
        warm = sgd.step < sgd.warmup_steps
        exact = warm or (algorithm == "auto" and self.auto_exact) or \
            (algorithm != "auto" and not ALGORITHMS[algorithm].lossy)
        if not exact:
            return "group"
        lane = (buf.is_cuda and not sgd.momentum and buf.dtype in (torch.float32, torch.float64)
                and (warm or algorithm in ("auto", "nccl"))
                and isinstance(dispatch.communicator(), NCCLCommunicator))
        return "lane" if lane else "each" if algorithm != "auto" or warm else "group"

    def bucket_name(self, bucket, buf) -> str:
        """``bucket<index>.n<numel>.<layout>``, cached per index and shapes."""
        key = (bucket.index(), buf.numel(), tuple(p.shape for p in bucket.parameters()))
        name = self._names.get(key)
        if name is None:
            layout = zlib.crc32(repr([tuple(s) for s in key[2]]).encode())
            name = self._names[key] = f"bucket{key[0]}.n{key[1]}.{layout:08x}"
        return name

    def lane(self, buf, name: str, stream) -> None:
        """The "lane" path: ``buf`` averaged in place on ``stream`` (cupy's handle
        of the library's stream); its layout checked across ranks the first time."""
        import cupy

        comm = dispatch.communicator()
        view, tag = self._lane.get(name, (None, None))
        if view is None or view.data.ptr != buf.data_ptr():
            view, tag = cupy.asarray(buf), f"str:{self.sgd.prefix}.{name}"
            validate(comm, view, check_finite=False, tag=tag, call="nccl/mean")
            self._lane[name] = view, tag
        self.sgd.bytes_sent += comm.mean_inplace(view, stream, tag=tag)
        self.sgd.last_algorithm = "nccl"

    def end_step(self) -> None:
        """After the last bucket: report NaN/Inf on every rank, count the step."""
        self.sgd.advance()


def register(ddp, state: HookState | None = None, **kwargs) -> HookState:
    """Attach the library to the DDP model ``ddp``; returns its ``HookState``
    (``state``, or one made from ``kwargs``: ``HookState``'s arguments).

    Collective (every rank, once, before the first backward pass).  Where the
    state's algorithm is NCCL's own average for the whole model (``"nccl"``,
    or ``"auto"`` when it picks ``nccl`` for the model's size: decided here,
    once, by rank 0 for every rank) on an NCCL process group, CUDA float32 /
    float64 parameters, no momentum correction, DDP's native allreduce stays:
    a comm hook written in Python costs the backward pass time per bucket
    that DDP's C++ path does not.  The library then only checks: at the end
    of every backward pass, after DDP's averaging, one read of the gradients
    (``torch._foreach_norm``, one device synchronize) raises ``ValueError`` on
    every rank if they hold NaN or Inf (an averaged gradient carries any
    rank's NaN / Inf to every rank; a gradient whose L1 norm overflows
    float32 is reported too), and the state counts steps and bytes as the hook
    would.  The check runs when the backward pass started from an output of
    ``ddp``'s forward (a hook on its first tensor that requires grad).

    Anything else registers ``allreduce_hook`` with ``state``.
    """
    problem = None
    if state is not None and kwargs:
        problem = TypeError(f"register: a HookState or its arguments, not both "
                            f"(got {sorted(kwargs)})")
    elif state is None:
        state = HookState(**kwargs)  # collective: bad arguments raise on every rank
    if _native_average(ddp, state, problem):
        _NativeChecks(ddp, state)
    else:
        ddp.register_comm_hook(state, allreduce_hook)
    return state


def _native_average(ddp, state: HookState | None, problem=None) -> bool:
    """Whether DDP's own allreduce is the state's algorithm for this model
    (``register``); the same answer on every rank, or ``problem`` (this
    rank's bad arguments, ``state`` then None) raised on every rank."""
    import torch.distributed as dist

    comm = dispatch.communicator()
    if problem is not None:
        agree(comm, problem)  # raises on every rank
    sgd = state.sgd
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    fits = (bool(params) and not sgd.momentum and isinstance(comm, NCCLCommunicator)
            and dist.get_backend(ddp.process_group) == "nccl"
            and all(p.is_cuda and p.dtype in (torch.float32, torch.float64) for p in params))
    agree(comm, value=(fits, sgd.algorithm), what="register's setup (process group, parameters' "
          "devices and dtypes, algorithm)")
    if not fits or sgd.algorithm not in ("nccl", "auto"):
        return False
    if sgd.algorithm == "nccl":
        return True
    n = sum(p.numel() for p in params)
    return dispatch.choose(n, name=f"{sgd.prefix}.model.n{n}",
                           density=sgd.density).algorithm == "nccl"


class _NativeChecks:
    """``register``'s native route: DDP averages; this checks and counts.

    A forward hook on ``ddp.module`` hooks its first output that requires
    grad; when backward reaches it, a callback is queued that queues the
    check behind DDP's own end-of-backward work (queued later, at DDP's first
    bucket), so the check reads the averaged gradients."""

    def __init__(self, ddp, state: HookState):
        self.ddp, self.state = ddp, state
        self.params = [p for p in ddp.module.parameters() if p.requires_grad]
        n, P = sum(p.numel() * p.element_size() for p in self.params), ddp.process_group.size()
        self.step_bytes = -(-2 * n * (P - 1) // P)  # DDP's ring allreduce of every bucket
        self.queued = False
        ddp.module.register_forward_hook(self._forward)
        state.native = True
        state.sgd.last_algorithm = "nccl"

    def _forward(self, module, args, out):
        self.queued = False
        if not getattr(self.ddp, "require_backward_grad_sync", True):
            return  # under ddp.no_sync(): DDP does not average this backward pass
        t = _first_grad_tensor(out)
        if t is not None:
            t.register_hook(self._backward_started)

    def _backward_started(self, grad):
        if not self.queued:
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._requeue)

    def _requeue(self):
        torch.autograd.Variable._execution_engine.queue_callback(self._check)

    def _check(self):
        self.queued = False
        sgd = self.state.sgd
        grads = [q.grad for q in self.params if q.grad is not None]
        if grads:
            norms = torch._foreach_norm(grads, 1)  # L1: NaN and Inf carry through
            if len({t.dtype for t in norms}) > 1:
                norms = [t.double() for t in norms]
            finite = bool(torch.isfinite(torch.stack(norms).sum()))  # the one device sync
        else:
            finite = True
        sgd.bytes_sent += self.step_bytes
        if finite:  # a failed step is not counted (as on the hook's paths)
            sgd.advance(report=False)
        else:
            raise ValueError(f"DDP gradients hold NaN or Inf after averaging in step "
                             f"{sgd.step} (some rank's backward pass produced one; every "
                             f"rank's average holds it)")


def _first_grad_tensor(out):
    """The first tensor requiring grad in a module's output (tensor, or nested
    tuple / list / dict values), or None."""
    if isinstance(out, torch.Tensor):
        return out if out.requires_grad else None
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) \
        else ()
    for item in items:
        t = _first_grad_tensor(item)
        if t is not None:
            return t
    return None


def allreduce_hook(state: HookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average each bucket through the library.

    Runs on DDP's own thread, in the order DDP hands buckets over (the same on
    every rank), and enqueues its work on a CUDA stream of the library's that
    first waits for the gradients' stream: no background thread, whose Python
    would hold the GIL the backward pass needs.  Each step takes one of three
    paths, the same on every rank:

    * exact steps on NCCL (the warm-up, ``algorithm="nccl"``, or ``"auto"``
      once it picked an exact algorithm for the model), float32 / float64
      buckets, no momentum correction: each bucket is averaged in place by
      ncclAllReduce as it becomes ready (overlapping the rest of backward),
      after a NaN/Inf scan into a device flag.  A bucket layout's agreement
      across ranks (``collectives.validate``) is checked the first time it
      is seen; after that a bucket costs a few launches and no host round
      trip (``NCCLCommunicator.mean_inplace``).
    * lossy steps (a sparse algorithm, or ``"auto"`` until it picked an exact
      one): the buckets are gathered and the whole model goes through one
      ``autotune.allreduce`` when the last bucket arrives, as one flat tensor
      named ``<prefix>.model.n<numel>.<layout>`` (as the Ok-Topk reference and
      ``DistributedOptimizer(flat=True)`` do: k = density x model size,
      chosen across layers, and one call's fixed cost per step instead of
      one per bucket).
    * other exact steps (``"dense"`` or ``"mpi"`` chosen, a CPU model, momentum
      correction during warm-up): each bucket through ``autotune.allreduce``
      under ``<prefix>.bucket<index>.n<numel>.<layout>``.

    Layout: a checksum of the parameters' shapes in order, the same on every
    rank; when DDP rebuilds its buckets after the first iteration, state
    (residuals, velocities) starts fresh instead of adding the old state to
    other coordinates.

    The returned future holds the average: the bucket itself (a reduction
    of the whole model is copied back into the buckets, since DDP reads a
    result tensor from its storage's start), or on the "each" path the new
    tensor of ``autotune.allreduce``.  On CUDA it is stream-ordered (DDP's
    wait makes its stream wait for the reduction, not the host).  An error
    is raised by DDP's wait at the end of backward, on every rank.  After the
    last bucket of a step the hook reports NaN/Inf found on the device on
    every rank (``autotune.synchronize``: one device synchronize per step).

    Use::

        ddp.register_comm_hook(HookState(algorithm="oktopk", density=0.01), allreduce_hook)
    """
    buf = bucket.buffer()
    lane = _lane(buf.device) if buf.is_cuda else None
    fut = torch.futures.Future(devices=[buf.device] if lane else None)
    step = state.current
    last = bucket.is_last()
    try:
        if step.path is None:
            step.path = state.path(buf)
        name = state.bucket_name(bucket, buf)
        step.layouts.append(name)
        current = lane.follow() if lane else None  # the library's stream waits for the gradients'
        if step.path == "lane":
            state.lane(buf, name, lane.cupy)
            if last:
                with lane.cupy:
                    state.end_step()
            lane.complete(fut, buf, current)
        elif step.path == "group":
            step.pending.append((buf, fut))
            if last:
                with _on(lane):
                    _reduce_group(state, step)
        else:
            with _on(lane):
                out = state.sgd.allreduce(buf, name)
                if last:
                    state.end_step()
                fut.set_result(out)   # on CUDA: records the completion on the stream
    except BaseException as e:  # noqa: BLE001 - raised by DDP's wait, on every rank
        for _, f in step.pending:
            if not f.done():
                f.set_exception(e)
        if not fut.done():
            fut.set_exception(e)
        state.current = _Step()
    else:
        if last:
            state.current = _Step()
    return fut


class _Step:
    """What the hook keeps during one backward pass."""

    __slots__ = ("path", "layouts", "pending")

    def __init__(self):
        self.path = None      # "lane", "group" or "each"
        self.layouts = []     # the buckets' names so far
        self.pending = []     # (bucket buffer, future), "group" path


def _reduce_group(state: HookState, step: _Step) -> None:
    """The "group" path at the last bucket: one allreduce of the whole model."""
    bufs = [b for b, _ in step.pending]
    flat = torch.cat(bufs) if len(bufs) > 1 else bufs[0]
    layout = zlib.crc32(" ".join(step.layouts).encode())
    out = state.sgd.allreduce(flat, f"model.n{flat.numel()}.{layout:08x}")
    if state.sgd.algorithm == "auto":
        state.auto_exact = not ALGORITHMS[state.sgd.last_algorithm].lossy
    state.end_step()
    off = 0
    for b, f in step.pending:  # DDP reads a result from its storage's start: no slices
        if len(step.pending) > 1 or out is not b:
            b.copy_(out[off:off + b.numel()].view_as(b))
        f.set_result(b)
        off += b.numel()


class _Lane:
    """The library's CUDA stream on one device, where reductions run: torch's
    and cupy's handles of it and an event to order it after another stream,
    through the CUDA runtime directly (the hook's per-bucket host cost is the
    backward pass's: torch's Python stream helpers cost more than the
    collective's launch)."""

    __slots__ = ("device", "torch", "ptr", "cupy", "event")

    def __init__(self, device):
        import cupy

        self.device = device
        self.torch = torch.cuda.Stream(device=device)
        self.ptr = self.torch.cuda_stream
        self.cupy = cupy.cuda.ExternalStream(self.ptr, device.index)
        self.event = cupy.cuda.Event(disable_timing=True)

    def follow(self):
        """Make this stream wait for the current one's work so far; returns that stream."""
        from cupy.cuda import runtime

        current = torch.cuda.current_stream(self.device)
        runtime.eventRecord(self.event.ptr, current.cuda_stream)
        runtime.streamWaitEvent(self.ptr, self.event.ptr, 0)
        return current

    def complete(self, fut, value, current) -> None:
        """Complete the CUDA future ``fut`` with ``value`` once this stream's
        work so far is done (its waiters wait on the device, not the host)."""
        torch.cuda.set_stream(self.torch)
        try:
            fut.set_result(value)
        finally:
            torch.cuda.set_stream(current)


class _On:
    """Context: torch's and cupy's current stream and device set to a lane's."""

    __slots__ = ("cms",)

    def __init__(self, lane: _Lane):
        import cupy

        self.cms = (cupy.cuda.Device(lane.device.index), torch.cuda.stream(lane.torch), lane.cupy)

    def __enter__(self):
        for cm in self.cms:
            cm.__enter__()

    def __exit__(self, *exc):
        for cm in reversed(self.cms):
            cm.__exit__(*exc)


def _on(lane):
    return contextlib.nullcontext() if lane is None else _On(lane)


@functools.cache
def _lane(device) -> _Lane:
    return _Lane(device)


# -- Horovod-style optimizer -------------------------------------------------------------
class _DistributedOptimizer:
    """Mixed in front of the wrapped optimizer's class (see DistributedOptimizer)."""

    def synchronize(self) -> None:
        """Average all gradients over the ranks now (e.g. before clipping
        them); the next ``step()`` then does not reduce again."""
        grads = []
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                if p.grad is None:
                    # every rank must send the same layout; a rank that did
                    # not touch p contributes zeros (as Horovod does)
                    p.grad = torch.zeros_like(p)
                if p.grad.is_sparse:
                    raise TypeError(f"DistributedOptimizer: sparse gradient of "
                                    f"{self._autotune_names[id(p)]!r} is not supported")
                grads.append((self._autotune_names[id(p)], p.grad))
        self.sparse_sgd.synchronize(grads)
        self._autotune_synchronized = True

    def step(self, closure=None):
        """Average the gradients over the ranks (unless ``synchronize()`` was
        called since the last step), then take the wrapped optimizer's step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._autotune_synchronized:
            self.synchronize()
        self._autotune_synchronized = False
        super().step()
        return loss


def DistributedOptimizer(optimizer, named_parameters=None, *, algorithm: str = "auto",
                         density: float | None = None, flat: bool = True,
                         warmup_steps: int = 0, prefix: str = "opt", momentum: float = 0.0,
                         density_warmup: int = 0, tau_prime: int | None = None,
                         tau: int | None = None, fold_lr: bool = False):
    """Wrap ``optimizer`` so that ``step()`` first averages gradients over the ranks.

    For training launched with ``mpiexec`` without ``torch.distributed``
    (Horovod's ``hvd.DistributedOptimizer``).  The returned object is an
    instance of a subclass of the optimizer's class sharing its parameter
    groups and state, so learning-rate schedulers and ``state_dict`` work
    unchanged; use it in place of the original.

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()`` (gives each gradient a
            stable name: its residual's key when ``flat=False``); when None,
            names are positions in the parameter groups.
        algorithm: a name from ``collectives.ALGORITHMS`` or ``"auto"``.
        density: fraction of values a sparse algorithm sends.
        flat: one flat buffer per dtype for the whole model (True; as the
            Ok-Topk reference code; half-precision gradients go into a float32
            buffer of their own) or one allreduce per parameter.
        warmup_steps: steps reduced densely first.
        prefix: tensor-name prefix (one per optimizer in a process).
        momentum: momentum correction (Deep Gradient Compression; see
            ``autotune.training``): the momentum factor, applied to each
            rank's gradient *before* the sparse allreduce, with the sent
            coordinates' momentum masked.  The wrapped optimizer must then
            have no momentum of its own, e.g. ``SGD(params, lr, momentum=0)``
            wrapped with ``momentum=0.9`` (plain heavy-ball momentum; weight
            decay, if any, is then applied by the optimizer outside it).
        density_warmup: steps over which the density falls from 1/4 to
            ``density`` after the dense warm-up (``SparseSGD``).
        tau_prime, tau: the sparse algorithm's threshold and region-boundary
            refresh intervals (``SparseSGD``; None: the algorithm's defaults).
        fold_lr: fold the optimizer's current learning rate into what the
            residual accumulates (lr x gradient, the paper's Algorithm 2; see
            ``autotune.training``), so that under a schedule every value is
            applied at its own step's rate.  All parameter groups must then
            share one rate.

    Returns:
        the wrapped optimizer; ``.sparse_sgd`` is its
        ``autotune.training.SparseSGD`` (statistics: steps, bytes sent,
        seconds in communication).

    Raises:
        ValueError: a parameter of the optimizer missing from
            ``named_parameters``, duplicate names, or momentum correction
            around an optimizer that has momentum itself, or ``fold_lr``
            with parameter groups of different learning rates.
    """
    names, problem = None, None
    try:
        names = _parameter_names(optimizer, named_parameters, momentum)
        if fold_lr:
            current_lr(optimizer)
    except ValueError as e:
        problem = e
    agree(dispatch.communicator(), problem)  # a bad argument on one rank raises on all
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedOptimizer, base), {"__module__": base.__module__})
    new = object.__new__(cls)
    new.__dict__.update(optimizer.__dict__)
    new._autotune_names = names
    new._autotune_synchronized = False
    new.sparse_sgd = SparseSGD(algorithm=algorithm, density=density,
                               warmup_steps=warmup_steps, flat=flat, prefix=prefix,
                               momentum=momentum, density_warmup=density_warmup,
                               tau_prime=tau_prime, tau=tau,
                               learning_rate=(lambda: current_lr(new)) if fold_lr else None)
    return new


def _parameter_names(optimizer, named_parameters, momentum) -> dict:
    """id(parameter) -> its name, for ``DistributedOptimizer`` (ValueError on a bad argument)."""
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("optimizer is already a DistributedOptimizer")
    if momentum and any(g.get("momentum", 0) or g.get("betas") for g in optimizer.param_groups):
        raise ValueError(f"momentum correction (momentum={momentum}) keeps the velocity "
                         "before the allreduce; the wrapped optimizer must not add its own: "
                         "use torch.optim.SGD(..., momentum=0)")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if named_parameters is None:
        names = {id(p): f"param{i}" for i, p in enumerate(params)}
    else:
        named = list(named_parameters)
        if len({n for n, _ in named}) != len(named):
            raise ValueError("named_parameters holds duplicate names")
        names = {id(p): n for n, p in named}
        missing = [i for i, p in enumerate(params) if id(p) not in names]
        if missing:
            raise ValueError(f"{len(missing)} optimizer parameter(s) are not in "
                             "named_parameters (pass model.named_parameters() of the "
                             "model the optimizer trains)")
    return names


def current_lr(optimizer) -> float:
    """The learning rate shared by all of ``optimizer``'s parameter groups now
    (what ``fold_lr`` / ``HookState(learning_rate=...)`` fold in).

    Raises:
        ValueError: the groups' rates differ.
    """
    rates = {float(g["lr"]) for g in optimizer.param_groups}
    if len(rates) != 1:
        raise ValueError(f"fold_lr needs one learning rate for all parameter groups, "
                         f"got {sorted(rates)}")
    return rates.pop()


def broadcast_parameters(params, root_rank: int = 0) -> None:
    """Overwrite parameters (and buffers) on every rank with ``root_rank``'s.

    Args:
        params: an ``nn.Module`` (its ``state_dict()``: parameters and
            buffers), a state dict, or an iterable of tensors or of
            ``(name, tensor)`` pairs, in the same order on every rank.
    """
    if isinstance(params, torch.nn.Module):
        tensors = list(params.state_dict().values())
    elif isinstance(params, dict):
        tensors = list(params.values())
    else:
        tensors = [t[1] if isinstance(t, tuple) else t for t in params]
    comm = dispatch.communicator()
    problem = None
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) \
            or not 0 <= root_rank < comm.size:
        problem = ValueError(f"broadcast_parameters: root_rank must be a rank in [0, "
                             f"{comm.size}), got {root_rank!r}")
    # what every rank is about to receive must match the root's, or Bcast would
    # truncate or wait for a message that never comes
    layout = (root_rank, [(tuple(t.shape), str(t.dtype)) for t in tensors])
    agree(comm, problem, value=layout, what="broadcast_parameters: root_rank or tensor layout")
    if comm.size == 1:
        return
    for t in tensors:
        with torch.no_grad():
            if t.device.type == "cpu" and t.is_contiguous():
                comm.bcast(_host_bytes(t.detach()), root_rank)
            else:
                host = t.detach().cpu().contiguous()
                comm.bcast(_host_bytes(host), root_rank)
                t.copy_(host)


def _host_bytes(t) -> np.ndarray:
    """A contiguous CPU tensor's storage as a flat numpy byte view (any dtype,
    bfloat16 included, which numpy cannot represent)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def state_digest(module, *, buffers: bool = False) -> str:
    """SHA-256 hex digest of a module's parameters (and buffers if asked), bytes as stored.

    Replicas must stay bitwise identical: compare the digests of all ranks to
    check.  Buffers are left out by default: BatchNorm's running statistics
    follow each rank's own data unless the training loop syncs them.
    """
    h = hashlib.sha256()
    items = module.state_dict().items() if buffers else module.named_parameters()
    for name, t in items:
        h.update(name.encode())
        h.update(_host_bytes(t.detach().cpu().contiguous()).tobytes())
    return h.hexdigest()

"""``register``: attach the library to a DDP model, keeping DDP's native
allreduce where that is the state's algorithm (then only checks and counts)."""
import torch

from collectives import NCCLCommunicator, NativeNCCL, agree

from .. import dispatch
from ._hook import HookState, allreduce_hook


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
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    if _native_average(ddp, params, state, problem):
        _NativeChecks(ddp, params, state)
    else:
        ddp.register_comm_hook(state, allreduce_hook)
    return state


def _native_average(ddp, params: list, state: HookState | None, problem=None) -> bool:
    """Whether DDP's own allreduce is the state's algorithm for this model
    (``register``); the same answer on every rank, or ``problem`` (this
    rank's bad arguments, ``state`` then None) raised on every rank."""
    import torch.distributed as dist

    comm = dispatch.communicator()
    if problem is not None:
        agree(comm, problem)  # raises on every rank
    sgd = state.sgd
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

    def __init__(self, ddp, params: list, state: HookState):
        self.ddp, self.params, self.state = ddp, params, state
        nbytes = sum(p.numel() * p.element_size() for p in params)
        # DDP's allreduce of every bucket, counted as the native one is
        self.step_bytes = NativeNCCL.traffic_bound(nbytes, ddp.process_group.size(), 0, 1)
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

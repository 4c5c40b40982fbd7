"""The DDP communication hook: ``HookState`` + ``allreduce_hook`` and the
CUDA stream its reductions run on."""
# no ``from __future__ import annotations``: DDP checks the hook's return
# annotation against the real torch.futures.Future[torch.Tensor] object
import contextlib
import functools
import zlib

import torch

from collectives import ALGORITHMS, NCCLCommunicator, agree, stream_ordered, validate

from .. import dispatch
from ..training import SparseSGD

#: the lossy path's default piece: at least this many elements per reduction
#: (``HookState(chunk=...)``)
CHUNK = 1 << 26


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
        chunk: lossy steps reduce the model in pieces of consecutive buckets
            of at least this many elements, each as soon as its last bucket
            is ready, so that its communication overlaps the rest of the
            backward pass (k = density x the piece's size).  None: the whole
            model in one reduction at the last bucket.
        learning_rate: None, or a callable returning the optimizer's current
            rate (e.g. ``lambda: current_lr(opt)``): the residual
            accumulates lr x gradient as in the paper's Algorithm 2
            (``autotune.training``).

    ``sgd`` is the underlying ``autotune.training.SparseSGD`` (its
    statistics: steps, bytes sent, seconds in communication).  ``native``:
    True where ``register`` left DDP's own allreduce in place (no hook).
    """

    __slots__ = ("sgd", "chunk", "native", "current", "auto_exact", "_names", "_views",
                 "_pieces")

    def __init__(self, *, algorithm: str = "auto", density: float | None = None,
                 warmup_steps: int = 1, prefix: str = "ddp", momentum: float = 0.0,
                 density_warmup: int = 0, tau_prime: int | None = None, tau: int | None = None,
                 learning_rate=None, chunk: int | None = CHUNK):
        bad = chunk is not None and not (isinstance(chunk, int) and not isinstance(chunk, bool)
                                           and chunk >= 1)
        agree(dispatch.communicator(), TypeError(f"chunk must be an int >= 1 or None, got "
                                                 f"{chunk!r}") if bad else None,
              value=chunk, what="HookState's chunk")  # collective, as DDP's constructor
        self.chunk = chunk
        self.sgd = SparseSGD(algorithm=algorithm, density=density,
                             warmup_steps=warmup_steps, flat=True, prefix=prefix,
                             momentum=momentum, density_warmup=density_warmup,
                             tau_prime=tau_prime, tau=tau, learning_rate=learning_rate)
        self.native = False     # register() left DDP's own allreduce in place
        self.current = _Step()  # the backward pass in flight
        self.auto_exact = None  # with "auto": whether its pick for the model is exact
        self._names: dict = {}  # (bucket index, numel, shapes) -> the bucket's name
        self._views: dict = {}  # bucket name -> (its cupy view, checked across ranks once; tag)
        self._pieces: set = set()  # lossy pieces reduced before (checked across ranks then)

    def close(self) -> list[str]:
        """Free the library's state for this hook's buckets (``SparseSGD.close``;
        collective), once the DDP model it is registered on is done with:
        every rank, after its last backward pass has completed."""
        self._names.clear()
        self._views.clear()
        self._pieces.clear()
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
        view, tag = self._views.get(name, (None, None))
        if view is None or view.data.ptr != buf.data_ptr():
            view, tag = cupy.asarray(buf), f"str:{self.sgd.prefix}.{name}"
            validate(comm, view, check_finite=False, tag=tag, call="nccl/mean")
            self._views[name] = view, tag
        self.sgd.bytes_sent += comm.mean_inplace(view, stream, tag=tag)
        self.sgd.last_algorithm = "nccl"

    def end_step(self) -> None:
        """After the last bucket: report NaN/Inf on every rank, count the step."""
        self.sgd.advance()


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
      one): consecutive buckets are gathered into pieces of at least
      ``HookState.chunk`` elements (2^26 by default), and each piece goes
      through one ``autotune.allreduce`` as soon as its last bucket arrives
      (its communication overlaps the rest of backward), as one flat tensor
      named ``<prefix>.model.c<i>.n<numel>.<layout>``; the last piece takes
      the buckets left (a model that fits in one piece: ``<prefix>.model.n...``).
      k = density x the piece's size, chosen across its layers, and one
      call's fixed cost per piece.  A piece's first reduction is checked
      across ranks (``validate``'s host exchange; with ``"auto"`` the
      decision's broadcast); later ones are not.  Selections run inside
      ``collectives.stream_ordered()``: exact top-k does not wait for the device,
      so TopkA's later calls have no host wait at all; Ok-Topk's and
      Gaussiank's thresholds and counts still read back.  ``chunk=None``: the
      whole model in one call at the last bucket, ``<prefix>.model.n<numel>.<layout>``
      (as the Ok-Topk reference and ``DistributedOptimizer(flat=True)`` do).
    * other exact steps (``"dense"`` or ``"mpi"`` chosen, a CPU model, momentum
      correction during warm-up): each bucket through ``autotune.allreduce``
      under ``<prefix>.bucket<index>.n<numel>.<layout>``.

    Layout: a checksum of the parameters' shapes in order, the same on every
    rank; when DDP rebuilds its buckets after the first iteration, state
    (residuals, velocities) starts fresh instead of adding the old state to
    other coordinates.

    An error in a bucket voids the rest of its step: later buckets are not
    reduced, their futures carry the same error, and the step is not counted.

    The returned future holds the average: the bucket itself (a piece's
    reduction is copied back into its buckets, since DDP reads a
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
    if step.failed is not None:  # an earlier bucket of this step raised: the rest is void
        fut.set_exception(step.failed)
        if last:
            state.current = _Step()
        return fut
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
            if last or (state.chunk is not None
                        and sum(b.numel() for b, _ in step.pending) >= state.chunk):
                with _on(lane), stream_ordered():  # exact top-k: no host read-back
                    _reduce_group(state, step, last)
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
        # the step's later buckets are not reduced (DDP's wait raises e) and it is not
        # counted; its pieces keep their names, so the next step finds them again
        step.failed, step.pending = e, []
    if last:
        state.current = _Step()
    return fut


class _Step:
    """What the hook keeps during one backward pass."""

    __slots__ = ("path", "layouts", "pending", "pieces", "exact", "failed")

    def __init__(self):
        self.path = None      # "lane", "group" or "each"
        self.layouts = []     # the buckets' names so far
        self.pending = []     # (bucket buffer, future) of the piece in the making, "group" path
        self.pieces = 0       # "group" path: pieces reduced so far
        self.exact = True     # "group" path with "auto": every piece's pick exact so far
        self.failed = None    # the error an earlier bucket of this step raised


def _reduce_group(state: HookState, step: _Step, last: bool) -> None:
    """The "group" path: one allreduce of the pending buckets (a piece of at
    least ``state.chunk`` elements, or the rest of the model at its last
    bucket), its result copied back into them."""
    bufs = [b for b, _ in step.pending]
    flat = torch.cat(bufs) if len(bufs) > 1 else bufs[0]
    layout = zlib.crc32(" ".join(step.layouts[-len(bufs):]).encode())
    piece = "model" if last and not step.pieces else f"model.c{step.pieces}"
    name = f"{piece}.n{flat.numel()}.{layout:08x}"
    # a piece's signature is checked across ranks at its first reduction; later ones
    # follow DDP's bucket order, the same on every rank, with no host exchange
    out = state.sgd.allreduce(flat, name, checked=name in state._pieces)
    state._pieces.add(name)
    step.pieces += 1
    step.exact = step.exact and not ALGORITHMS[state.sgd.last_algorithm].lossy
    if last:
        if state.sgd.algorithm == "auto":
            state.auto_exact = step.exact
        state.end_step()
    off = 0
    for b, f in step.pending:  # DDP reads a result from its storage's start: no slices
        if len(step.pending) > 1 or out is not b:
            b.copy_(out[off:off + b.numel()].view_as(b))
        f.set_result(b)
        off += b.numel()
    step.pending = []


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


@contextlib.contextmanager
def _on(lane):
    """torch's and cupy's current stream and device set to ``lane``'s (None: unchanged)."""
    if lane is None:
        yield
        return
    import cupy

    with cupy.cuda.Device(lane.device.index), torch.cuda.stream(lane.torch), lane.cupy:
        yield


@functools.cache
def _lane(device) -> _Lane:
    return _Lane(device)

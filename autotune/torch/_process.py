"""torch.distributed on the MPI ranks, parameters broadcast from one rank, replica digests."""
import atexit
import hashlib
import socket

import numpy as np
import torch

from collectives import agree

from .. import dispatch


def init_process_group(backend: str = "gloo", *, addr: str = "127.0.0.1",
                       port: int | None = None, **kwargs) -> None:
    """Initialize ``torch.distributed`` with the MPI ranks (rank and world size
    from the Communicator).  Idempotent.  The group is destroyed at interpreter
    exit (gloo's worker threads must not outlive Python's finalization).

    Args:
        backend: "gloo" (CPU) or "nccl".
        addr: rank 0's address for the TCP rendezvous (the default: all ranks
            on one host).
        port: its TCP port; None: rank 0 picks a free one and broadcasts it.
        kwargs: passed on to ``torch.distributed.init_process_group``.

    Raises:
        ValueError: backend, addr or port differ across ranks (on every rank,
            instead of a rendezvous that never completes).
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    comm = dispatch.communicator()
    agree(comm, value=(backend, addr, port), what="init_process_group's backend, addr and port")
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

"""A Horovod-style optimizer: gradients averaged through the library at ``step()``."""
import torch

from collectives import agree

from .. import dispatch
from ..training import SparseSGD


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

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
from ._hook import HookState, allreduce_hook
from ._native import register
from ._optimizer import DistributedOptimizer, current_lr
from ._process import broadcast_parameters, init_process_group, state_digest

__all__ = [
    "DistributedOptimizer",
    "HookState",
    "allreduce_hook",
    "broadcast_parameters",
    "current_lr",
    "init_process_group",
    "register",
    "state_digest",
]

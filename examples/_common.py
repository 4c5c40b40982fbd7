"""Shared by the training examples: command line, the data-parallel loop, JSON curves.

Each example supplies the data (a fixed train/test split, identical on every
rank), a model factory, and how to evaluate; this module runs one or more
(algorithm, density, seed) configurations in one launch (torch and MPI
start-up cost seconds per rank, so a grid shares one), sharding every global
batch over the ranks, and writes the curves as JSON.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time

import numpy as np
import torch

import autotune
import autotune.torch as at


def parser(description: str, *, epochs: int, batch_size: int, lr: float,
           warmup_steps: int, density_warmup: int = 0) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--algorithm", default="dense",
                   help="dense|oktopk|gtopk|topka|auto|... (comma list: several runs)")
    p.add_argument("--density", default="0.01", help="fraction sent (comma list)")
    p.add_argument("--seed", default="0", help="model/shuffle seed (comma list)")
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--batch-size", type=int, default=batch_size,
                   help="global batch (split over the ranks)")
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                   help="learning rate over the run: cosine decay to 0, or constant")
    p.add_argument("--warmup-steps", type=int, default=warmup_steps,
                   help="dense steps before the sparse algorithm takes over")
    p.add_argument("--density-warmup", type=int, default=density_warmup,
                   help="steps after the dense warm-up over which the density falls "
                        "geometrically from 1/4 to --density (Deep Gradient Compression)")
    p.add_argument("--momentum-correction", action="store_true",
                   help="keep the optimizer's momentum before the allreduce, per rank, with the "
                        "sent coordinates masked (Deep Gradient Compression); with "
                        "--integration optimizer gradients are then clipped on each rank before "
                        "they are sent (with ddp the hook reduces during backward, so the "
                        "reduced velocity is clipped)")
    p.add_argument("--fold-lr", action="store_true",
                   help="the residual accumulates lr x gradient (the paper's Algorithm 2), so a "
                        "value that waited is applied at its own step's learning rate")
    p.add_argument("--tau-prime", type=int, default=None,
                   help="sparse algorithms' threshold refresh interval tau' (default 32)")
    p.add_argument("--option", action="append", default=[], metavar="ALGO.KEY=VALUE",
                   help="an algorithm's constructor option, e.g. oktopk.residuals=owner "
                        "(repeatable; autotune.init(options=...))")
    p.add_argument("--layout", choices=("flat", "layer"), default="flat",
                   help="one flat buffer for the model (as the Ok-Topk reference) or per layer")
    p.add_argument("--integration", choices=("optimizer", "ddp"), default="optimizer",
                   help="autotune.torch.DistributedOptimizer (no torch.distributed) "
                        "or DistributedDataParallel with autotune.torch.allreduce_hook")
    p.add_argument("--max-steps-per-epoch", type=int, default=None,
                   help="cut every epoch short (smoke tests)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the model trains (cuda: one GPU per rank, local rank modulo GPUs)")
    p.add_argument("--backend", choices=("mpi", "nccl"), default="mpi",
                   help="gradient transport: MPI (host or CUDA-aware) or NCCL (needs --device cuda)")
    p.add_argument("--profile", metavar="FILE",
                   help="machine profile that --algorithm auto decides from "
                        "(autotune.init(profile=...); default: none, auto means dense)")
    p.add_argument("--out", help="write the curves as JSON here (rank 0)")
    p.add_argument("--quiet", action="store_true")
    return p


def setup(args) -> torch.device:
    """Start the communicator for ``--backend`` and pick this rank's ``--device``.

    Call once, before building tensors: returns the torch device the model and
    the data live on (pass it to :func:`run_grid`).  With NCCL, gradients stay
    on the GPU end to end (torch -> DLPack -> cupy -> ncclAllReduce / ncclSend /
    ncclRecv).
    """
    if args.backend == "nccl" and args.device != "cuda":
        raise SystemExit("--backend nccl needs --device cuda")
    try:
        options = autotune.dispatch.parse_options(args.option)
    except ValueError as e:
        raise SystemExit(f"--option: {e}")
    if args.backend == "nccl":
        import collectives

        comm = autotune.init(collectives.NCCLCommunicator(), profile=args.profile,
                             options=options)
    else:
        comm = autotune.init(profile=args.profile, options=options)
    if args.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    dev = getattr(comm, "device", None)
    if dev is None:
        dev = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", comm.rank)) % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    return torch.device("cuda", dev)


def configurations(args):
    algos = [a for a in args.algorithm.split(",") if a]
    dens = [float(d) for d in args.density.split(",") if d]
    seeds = [int(s) for s in args.seed.split(",") if s]
    return list(itertools.product(algos, dens, seeds))


def global_sum(values) -> np.ndarray:
    """Sum of small float64 statistics over the ranks (exact algorithm)."""
    return autotune.allreduce(np.asarray(values, dtype=np.float64), algorithm="dense")


def shard(batch: np.ndarray, rank: int, P: int) -> np.ndarray:
    """This rank's part of a global batch of sample indices."""
    return batch[rank::P]


def run_grid(args, *, name: str, device: torch.device, make_model, make_optimizer,
             train_step, evaluate, n_train: int, data_info: dict,
             clip: float | None = None) -> dict:
    """Train every configuration; returns (and on rank 0 writes) the curves.

    Args:
        device: where the model trains (from :func:`setup`, which also started
            the communicator).
        make_model(): a fresh model (after ``torch.manual_seed``).
        make_optimizer(model, lr): the local optimizer.
        train_step(model, idx, B): forward + backward on sample indices
            ``idx`` (this rank's share of a global batch of B); returns the
            sum of per-sample losses (float) and the number of samples.
            Losses must be scaled so that averaging gradients over ranks
            gives the global batch's mean gradient.
        evaluate(model, rank, P): (sums over this rank's test shard) as a
            dict of floats, plus a "count"; summed over ranks here.
        n_train: number of training samples (windows).
        clip: clip the averaged gradient to this global norm (None: no).
    """
    comm = autotune.init()
    rank, P = comm.rank, comm.size
    torch.set_num_threads(1)
    if args.batch_size < P:
        raise SystemExit(f"--batch-size {args.batch_size} < P={P}")
    if args.integration == "ddp":
        at.init_process_group("gloo")
    runs = []
    steps_per_epoch = n_train // args.batch_size
    if args.max_steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, args.max_steps_per_epoch)
    for algorithm, density, seed in configurations(args):
        torch.manual_seed(seed)
        model = make_model().to(device)
        at.broadcast_parameters(model)
        local_opt = make_optimizer(model, args.lr)
        mc = _take_momentum(local_opt) if args.momentum_correction else 0.0
        prefix = f"{name}.{algorithm}.{density}.{seed}.{len(runs)}"
        if args.integration == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            net = DDP(model)
            hook = at.HookState(algorithm=algorithm, density=density,
                                warmup_steps=max(1, args.warmup_steps), prefix=prefix,
                                momentum=mc, density_warmup=args.density_warmup,
                                tau_prime=args.tau_prime,
                                learning_rate=((lambda o=local_opt: at.current_lr(o))
                                               if args.fold_lr else None))
            at.register(net, hook)  # the hook, or DDP's own allreduce where that is the pick
            opt = local_opt
            sgd = hook.sgd
        else:
            net = model
            opt = at.DistributedOptimizer(
                local_opt, named_parameters=model.named_parameters(),
                algorithm=algorithm, density=density, flat=args.layout == "flat",
                warmup_steps=args.warmup_steps, prefix=prefix, momentum=mc,
                density_warmup=args.density_warmup, tau_prime=args.tau_prime,
                fold_lr=args.fold_lr)
            sgd = opt.sparse_sgd
        sched = None
        if args.schedule == "cosine":
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(
                opt, T_max=max(1, args.epochs * steps_per_epoch))
        curve = []
        wall = 0.0
        for epoch in range(args.epochs):
            comm.barrier()
            t0 = time.perf_counter()
            perm = np.random.default_rng([seed, epoch]).permutation(n_train)
            net.train()
            loss_sum = count = 0.0
            for s in range(steps_per_epoch):
                idx = shard(perm[s * args.batch_size:(s + 1) * args.batch_size], rank, P)
                opt.zero_grad(set_to_none=False)
                ls, c = train_step(net, idx, args.batch_size)
                if clip is not None:
                    if hasattr(opt, "synchronize") and not mc:
                        opt.synchronize()  # average first: clip the global gradient
                    torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
                opt.step()
                if sched is not None:
                    sched.step()
                loss_sum += ls
                count += c
            tot = global_sum([loss_sum, count])
            epoch_s = time.perf_counter() - t0
            wall += epoch_s
            net.eval()
            with torch.no_grad():
                ev = evaluate(net, rank, P)
            keys = sorted(ev)
            sums = dict(zip(keys, global_sum([ev[k] for k in keys])))
            point = {"epoch": epoch + 1, "step": sgd.step,
                     "train_loss": float(tot[0] / tot[1]),
                     "epoch_s": epoch_s, "wall_s": wall,
                     "comm_s": sgd.comm_seconds, "bytes_sent": int(sgd.bytes_sent)}
            for k in keys:
                if k != "count":
                    point[k] = float(sums[k] / sums["count"])
            if "loss" in point:
                point["val_loss"] = point.pop("loss")
                point["val_ppl"] = float(np.exp(point["val_loss"]))
            curve.append(point)
            if rank == 0 and not args.quiet:
                shown = " ".join(f"{k}={v:.4f}" for k, v in point.items()
                                 if isinstance(v, float) and k not in ("comm_s",))
                print(f"[{name} P={P} {algorithm} d={density} seed={seed}] "
                      f"epoch {epoch + 1}/{args.epochs} {shown}", flush=True)
        digest = at.state_digest(model)
        digests = _gather_obj(comm, digest)
        if len(set(digests)) != 1:
            raise SystemExit("replicas diverged: parameter digests differ across ranks")
        runs.append({"algorithm": algorithm, "density": density, "seed": seed,
                     "curve": curve, "final": curve[-1], "stats": sgd.stats(),
                     "params": int(sum(p.numel() for p in model.parameters()))})
        del opt, net, model
    result = {
        "example": name, "P": P, "argv": [os.path.relpath(sys.argv[0])] + sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.platform(), "torch": torch.__version__,
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
        "backend": getattr(comm, "backend", "mpi"),
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "quiet")},
        "steps_per_epoch": steps_per_epoch, "data": data_info, "runs": runs,
    }
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _take_momentum(opt) -> float:
    """Move an SGD optimizer's momentum out of it (for momentum correction):
    returns the momentum and sets the optimizer's to 0."""
    ms = {g.get("momentum") for g in opt.param_groups}
    if (len(ms) != 1 or not isinstance(opt, torch.optim.SGD) or not ms.pop()
            or any(g.get("nesterov") or g.get("dampening") for g in opt.param_groups)):
        raise SystemExit("--momentum-correction needs SGD with one momentum > 0 for all groups, "
                         "no Nesterov, no dampening")
    m = opt.param_groups[0]["momentum"]
    for g in opt.param_groups:
        g["momentum"] = 0.0
    return float(m)


def _gather_obj(comm, obj):
    """Every rank's ``obj`` on every rank (small control data)."""
    out = []
    for r in range(comm.size):
        out.append(comm.bcast_obj(obj if comm.rank == r else None, r))
    return out

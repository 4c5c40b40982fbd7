"""Training-step benchmark (issue #25): a transformer LM step under DDP with each gradient
communication a PyTorch user can pick, side by side, one launch per network.

    # GPU machine, repository root: one launch per network, a JSON each, a markdown table
    python -m benchmarks.train_step run -n 2 --networks nvlink,sockets --out DIR [OPTIONS]
    python -m benchmarks.train_step table DIR/train_step_*.json      # redraw the table
    # one launch by hand (here a CPU smoke test)
    autotune launch -n 2 -m benchmarks.train_step --device cpu --layers 1 --d-model 64 \\
        --vocab 500 --seq 16 --batch 2 --warmup 1 --steps 2 --variants compute,ddp,at:oktopk

Model: pre-norm transformer encoder LM, causal mask (default 12 layers, d_model 1024, 16
heads, FFN 4 x d_model, vocabulary 32000, 16 x 128 tokens per rank: 216.9M parameters),
next-token cross-entropy on seeded random tokens (different per rank), SGD; on GPUs
float32 with TF32 matmuls (``--amp``: bfloat16 autocast).  Variants: ``compute`` (a hook
returning the bucket unreduced: compute and DDP's bookkeeping, no communication), ``ddp``
(DDP's default allreduce), ``fp16`` (fp16_compress_hook), ``allreduce`` (torch's
allreduce_hook: DDP's allreduce from a Python hook, what any Python hook costs at
least), ``powersgdR`` (powerSGD_hook at
rank R from step max(2, warmup // 2)), ``at:ALG`` (``autotune.torch.register(ddp,
HookState(algorithm=ALG, density=--density))``: the hook, or for NCCL's own average DDP's
native allreduce plus the library's checks), ``hook:ALG`` (that state through
``allreduce_hook`` whatever the algorithm; either with ``@c<N>`` for ``chunk=2**N`` or
``@whole`` for ``chunk=None``, the lossy path's pieces), ``spin:US`` / ``idle:US`` (no communication:
a background thread holds each bucket US microseconds spinning in Python, holding the GIL,
or sleeping; what Python on a hook's thread costs the backward pass).  Rank 0's host time in
``backward()`` is reported per variant too.  On CPUs ``at:nccl`` is skipped, and
``powersgdR`` where the model spans several DDP buckets (gloo mismatches its allreduces).
Each variant: a fresh model (same seed on every rank, checked, so DDP's broadcast is
skipped) in a fresh DDP; ``--warmup`` steps, then ``--steps`` timed ones between
``torch.cuda.synchronize()`` calls, a step's time being the slowest rank's; ``--rounds``
passes in alternating order, median/p10/p90 over all of a variant's timed steps; after its
first round the ranks compare ``autotune.torch.state_digest`` (``identical``).  With
``--interleave`` every variant's model is built once and the variants take one step each in
turn (the order rotating every step), so a host or GPU drifting during the run moves all of
them alike, and each ratio is the median of the step-by-step ratios (paired).  A hook's
state is freed after each run (``HookState.close``), so every round starts afresh.  ``at:auto`` uses ``--profile`` ({network} and {P} are filled in), by default the
shipped ``profiles/gpu_<h100|h200>_<network>_p<P>.json`` (none: dense; the JSON says so).

``run`` launches the ranks per network through ``autotune.launch.mpiexec_argv`` (plus
``--bind-to none``), always with ``NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
NVSHMEM_DISABLE_NVLS=1``, for ``sockets`` with NCCL on TCP over loopback; it writes
``DIR/train_step_<network>_P<P>.json`` (machine, config, per variant median/p10/p90 ms,
ratios to ``compute`` and ``ddp``, ``identical``, hook statistics, auto's pick per bucket)
and prints the table (cells: median ms (x vs ddp)) with issue #25's checks.
"""
import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
import autotune.torch as at
import collectives
import profiles
from autotune.launch import mpiexec_argv, one_host_env
from benchmarks import NCCL_SOCKETS_ENV, NVLS_OFF_ENV

NETWORK_ENV = {"nvlink": {}, "cpu": {}, "sockets": NCCL_SOCKETS_ENV}
VARIANTS = ("compute", "ddp", "fp16", "powersgd1", "powersgd4") + tuple(
    f"at:{a}" for a in ("nccl", "dense", "auto", "topka", "oktopk", "gtopk"))


class EncoderLM(torch.nn.Module):
    """Token and position embeddings, pre-norm encoder layers under a causal mask,
    a final LayerNorm and an untied output projection."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                                 batch_first=True, norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab)

    def forward(self, x):
        n = x.shape[1]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n, device=x.device)
        h = self.encoder(self.tok(x) + self.pos.weight[:n], mask=mask, is_causal=True)
        return self.head(self.norm(h))


def _no_comm(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """The ``compute`` variant's hook: the bucket comes back unreduced."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _thread_only(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """``spin:US`` / ``idle:US``: no communication either; a background thread
    holds each bucket US microseconds, spinning in Python (holding the GIL) or
    sleeping (GIL released), then returns it unreduced: what Python on a hook's
    thread costs the backward pass, apart from any communication."""
    how, seconds = state
    buf = bucket.buffer()
    fut = torch.futures.Future(devices=[buf.device] if buf.is_cuda else None)

    def hold():
        t0 = time.perf_counter()
        if how == "spin":
            while time.perf_counter() - t0 < seconds:
                pass
        else:
            time.sleep(seconds)
        fut.set_result(buf)

    _HOLDER.submit(hold)
    return fut


_HOLDER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="train_step-hold")
HOLDS = ("spin:", "idle:")  # the variants of _thread_only


def _communicates(variant: str) -> bool:
    return variant != "compute" and not variant.startswith(HOLDS)


def _attach(ddp, variant: str, args):
    """Register ``variant``'s hook on ``ddp``; returns the library's HookState or None."""
    if variant == "compute":
        ddp.register_comm_hook(None, _no_comm)
    elif variant.startswith(HOLDS):
        ddp.register_comm_hook((variant[:4], int(variant[5:]) * 1e-6), _thread_only)
    elif variant == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif variant == "allreduce":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif variant.startswith("powersgd"):
        ddp.register_comm_hook(powerSGD_hook.PowerSGDState(
            None, matrix_approximation_rank=int(variant[8:]),
            start_powerSGD_iter=max(2, args.warmup // 2)), powerSGD_hook.powerSGD_hook)
    elif variant.startswith(("at:", "hook:")):
        alg, extra = _hook_variant(variant)
        state = at.HookState(algorithm=alg, density=args.density, **extra,
                             prefix=f"train_step.{variant.replace(':', '.').replace('@', '.')}")
        if variant.startswith("at:"):
            at.register(ddp, state)  # what a user calls: the hook, or DDP's native allreduce
        else:
            ddp.register_comm_hook(state, at.allreduce_hook)
        return state
    return None


def _hook_variant(variant: str):
    """``at:ALG[@c<N>|@whole]`` / ``hook:...``: (ALG, HookState's chunk argument as a
    dict: none, 2**N or None), or None where it is not such a variant."""
    kind, _, rest = variant.partition(":")
    alg, _, piece = rest.partition("@")
    if kind not in ("at", "hook") or alg not in ("auto", *collectives.ALGORITHMS):
        return None
    if not piece:
        return alg, {}
    if piece == "whole":
        return alg, {"chunk": None}
    return (alg, {"chunk": 1 << int(piece[1:])}) if piece[:1] == "c" and piece[1:].isdigit() \
        else None


def _variants(text: str) -> list:
    out = [v for v in text.split(",") if v]
    for v in out:
        if not (v in ("compute", "ddp", "fp16", "allreduce")
                or (v[:8] == "powersgd" and v[8:].isdigit())
                or (v.startswith(HOLDS) and v[5:].isdigit())
                or _hook_variant(v) is not None):
            raise argparse.ArgumentTypeError(f"unknown variant {v!r}: {', '.join(VARIANTS)}, "
                                             "powersgdR, at:<a registered algorithm>, "
                                             "hook:<one> (either with @c<log2 chunk> or "
                                             "@whole), spin:US or idle:US")
    return list(dict.fromkeys(out))


def worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.train_step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="cuda: one GPU per rank, NCCL; cpu: gloo and MPI (auto: cuda if seen)")
    p.add_argument("--variants", type=_variants, default=",".join(VARIANTS),
                   help="comma list (default: all; at:nccl is skipped on CPU)")
    p.add_argument("--density", type=float, default=0.01, help="of the at: variants")
    for opt, default, hlp in (
            ("--layers", 12, None), ("--d-model", 1024, None), ("--heads", 16, None),
            ("--vocab", 32000, None), ("--seq", 128, "tokens per sequence"),
            ("--batch", 16, "sequences per rank"), ("--seed", 0, None),
            ("--warmup", 10, "untimed steps per variant and round"),
            ("--steps", 30, "timed steps per variant and round"),
            ("--rounds", 2, "passes over the variants, in alternating order")):
        p.add_argument(opt, type=int, default=default, help=hlp)
    p.add_argument("--interleave", action="store_true",
                   help="every variant's model at once, one step of each in turn (--rounds "
                        "unused): no drift between variants, ratios paired step by step")
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast (default float32/TF32)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--network", choices=sorted(NETWORK_ENV),
                   help="label and default profile (default: cpu, sockets if NCCL_NET=Socket, "
                        "else nvlink)")
    p.add_argument("--profile", help="for at:auto; {network} and {P} are replaced (default: "
                   "the shipped profiles/gpu_<card>_<network>_p<P>.json if there is one)")
    p.add_argument("--out", help="result JSON (written by rank 0)")
    return p


def _setup(args):
    """Library communicator, device and process group: (comm, device, profile as shown)."""
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.network is None:
        socket = os.environ.get("NCCL_NET", "").lower() == "socket"
        args.network = "cpu" if args.device == "cpu" else "sockets" if socket else "nvlink"
    if args.device == "cuda":
        comm = collectives.NCCLCommunicator(collectives.MPICommunicator())
        dev = torch.device("cuda", comm.device)
        torch.cuda.set_device(dev)
        torch.set_float32_matmul_precision("high")  # TF32 matmuls
    else:
        comm, dev = collectives.MPICommunicator(), torch.device("cpu")
        torch.set_num_threads(1)
    profile = shown = args.profile and args.profile.format(network=args.network, P=comm.size)
    if profile is None and dev.type == "cuda":
        name = torch.cuda.get_device_name().lower()
        card = "h200" if "h200" in name else "h100" if "h100" in name else "unknown"
        shipped = Path(profiles.__file__).parent / f"gpu_{card}_{args.network}_p{comm.size}.json"
        if shipped.exists():
            profile, shown = str(shipped), f"profiles/{shipped.name}"
    comm = autotune.init(comm, profile=profile)
    at.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return comm, dev, shown


def _digests_agree(model) -> bool:
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, at.state_digest(model))
    return len(set(digests)) == 1


class _Run:
    """One variant: its fresh model (the same seed on every rank), DDP, hook and
    optimizer; ``step()`` runs one training step, ``finish()`` its record."""

    def __init__(self, variant, args, dev, batches, *, check_init: bool):
        self.variant, self.args, self.batches = variant, args, batches
        torch.manual_seed(args.seed)
        with dev:
            self.model = EncoderLM(args.vocab, args.d_model, args.layers, args.heads, args.seq)
        if check_init and not _digests_agree(self.model):
            raise SystemExit("the seeded model differs across ranks (DDP's broadcast is skipped)")
        self.ddp = DDP(self.model, device_ids=[dev.index] if dev.type == "cuda" else None,
                       bucket_cap_mb=args.bucket_mb, init_sync=False)
        self.state = _attach(self.ddp, variant, args)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr)
        self.dev, self.taken, self.backward = dev, 0, []

    def step(self) -> None:
        x = self.batches[self.taken % len(self.batches)]
        self.taken += 1
        self.opt.zero_grad()
        with torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=self.args.amp):
            logits = self.ddp(x[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())
        t0 = time.perf_counter()
        loss.backward()  # returns once DDP's futures are done on the host (not the device)
        self.backward.append(time.perf_counter() - t0)
        self.opt.step()

    def finish(self, *, check: bool) -> dict:
        """The record (this rank's backward() times of the timed steps, replicas
        identical if ``check``, hook statistics, auto's picks); frees the hook's state."""
        rec = {"backward_ms": [round(1e3 * b, 3) for b in self.backward[self.args.warmup:]]}
        if check and _communicates(self.variant):
            rec["identical"] = _digests_agree(self.model)
        state = self.state
        if state is not None:
            rec["hook"] = {**state.sgd.stats(), "native": state.native}
            rec["auto_decisions"] = {
                k.name: {"algorithm": c.algorithm, "density": c.density, "calls": c.calls,
                         "predicted_ms": c.predicted_s and 1e3 * c.predicted_s,
                         "measured_ms": c.measured_s and 1e3 * c.measured_s}
                for k, c in autotune.decisions().items()
                if self.variant.endswith(":auto")
                and (k.name or "").startswith(state.sgd.prefix + ".")}
            state.close()  # the residuals go: the next round's fresh model starts afresh
        return rec


def _slowest(times: list, dev) -> list:
    """Per step, the slowest rank's time."""
    t = torch.tensor(times, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _one_variant(variant, args, dev, batches, *, check: bool, check_init: bool):
    """Build, warm up and time one variant: (the slowest rank's step seconds, record);
    ``check``: compare the replicas after the steps, ``check_init``: before them."""
    run = _Run(variant, args, dev, batches, check_init=check_init)
    # each step ends with a device synchronize; this rank's times (the max is taken below)
    times = collectives.timeit(run.step, warmup=args.warmup, repeat=args.steps,
                               sync=torch.cuda.synchronize if dev.type == "cuda" else None)
    return _slowest(times, dev), run.finish(check=check)


def _interleaved(variants, args, dev, batches) -> tuple[dict, dict]:
    """``--interleave``: every variant's model at once, one step of each in turn
    (the order rotating every step): ({variant: slowest rank's step seconds}, records)."""
    runs = {v: _Run(v, args, dev, batches, check_init=i == 0) for i, v in enumerate(variants)}
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times = {v: [] for v in variants}
    for s in range(args.warmup + args.steps):
        k = s % len(variants)
        for v in variants[k:] + variants[:k]:
            sync()
            t0 = time.perf_counter()
            runs[v].step()
            sync()
            if s >= args.warmup:
                times[v].append(time.perf_counter() - t0)
    return ({v: _slowest(t, dev) for v, t in times.items()},
            {v: runs[v].finish(check=True) for v in variants})


def _release(dev) -> None:
    """After a variant (its model, DDP and optimizer gone with its frame): free
    the device memory it cached, then wait for every rank."""
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        if "cupy" in sys.modules:
            sys.modules["cupy"].get_default_memory_pool().free_all_blocks()
    dist.barrier(device_ids=[dev.index] if dev.type == "cuda" else None)


def bench(argv) -> int:
    args = worker_parser().parse_args(argv)
    comm, dev, profile = _setup(args)
    rank, P = comm.rank, comm.size
    with torch.device("meta"):
        params = sum(p.numel() for p in EncoderLM(args.vocab, args.d_model, args.layers,
                                                  args.heads, args.seq).parameters())
    skipped = {}
    for v in args.variants if dev.type == "cpu" else ():
        if v in ("at:nccl", "hook:nccl"):
            skipped[v] = "the nccl algorithm needs an NCCL communicator (GPUs)"
        if v[:8] == "powersgd" and 4 * params > min(1, args.bucket_mb) * 2**20:  # a bucket
            skipped[v] = ("over gloo with several DDP buckets PowerSGD's allreduces, issued "
                          "from gloo's threads, come in different orders on the ranks")
    variants = [v for v in args.variants if v not in skipped]
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    batches = [torch.randint(args.vocab, (args.batch, args.seq + 1), generator=g).to(dev)
               for _ in range(4)]
    label = f"[train_step {args.network} P={P}]"
    if rank == 0:
        print(f"{label} profile {profile}; variants {','.join(variants)}; skipped "
              f"{skipped or 'none'}", flush=True)
    times, recs = {v: [] for v in variants}, {v: {} for v in variants}
    bwd = {v: [] for v in variants}  # this rank's host time in backward(), per timed step
    if args.interleave:
        times, recs = _interleaved(variants, args, dev, batches)
        for v in variants:
            bwd[v] = recs[v].pop("backward_ms")
    for r in range(0 if args.interleave else args.rounds):
        for i, v in enumerate(variants if r % 2 == 0 else variants[::-1]):
            t0 = time.perf_counter()
            t, rec = _one_variant(v, args, dev, batches, check=r == 0, check_init=r + i == 0)
            _release(dev)
            times[v] += t
            bwd[v] += rec.pop("backward_ms")  # rank 0's is what goes into the JSON
            recs[v].update(rec)
            if rank == 0:
                print(f"{label} round {r + 1}/{args.rounds} {v}: median {1e3 * np.median(t):.1f} "
                      f"ms/step ({time.perf_counter() - t0:.0f} s)", flush=True)
    out = {}
    for v in variants:
        ms = 1e3 * np.asarray(times[v])
        out[v] = {"median_ms": float(np.median(ms)), "p10_ms": float(np.percentile(ms, 10)),
                  "backward_median_ms": float(np.median(bwd[v])), "backward_ms": bwd[v],
                  "p90_ms": float(np.percentile(ms, 90)), "steps": len(ms),
                  **recs[v], "step_ms": [round(float(x), 3) for x in ms]}
    for v in variants:
        out[v]["vs_compute"] = _ratio(out, v, "compute", args.interleave)
        out[v]["vs_ddp"] = _ratio(out, v, "ddp", args.interleave)
    result = {"benchmark": "train_step", "network": args.network, "P": P,
              "interleaved": bool(args.interleave),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": [os.path.basename(a) if a.startswith("/") else a for a in sys.argv[1:]],
              "machine": _machine(comm, dev), "params": params,
              "config": {k: v for k, v in vars(args).items() if k not in ("out", "network")},
              "profile": profile, "profile_note": None if profile else "none: at:auto is dense",
              "variants": out, "skipped": skipped}
    if rank == 0:
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
        print(table([result]), flush=True)
    return 0


def _machine(comm, dev) -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "mpi": comm.library_version(), "device": "cpu",
            "env": {k: v for k, v in os.environ.items()
                    if k.startswith(("NCCL_", "TORCH_SYMM", "NVSHMEM_"))}}
    if dev.type == "cuda":
        import cupy

        info.update(device=torch.cuda.get_device_name(dev), cupy=cupy.__version__,
                    nccl_torch=str(torch.cuda.nccl.version()),
                    nccl_cupy=cupy.cuda.nccl.get_version())
    return info


def _ratio(variants: dict, a: str, b: str, paired: bool):
    """Variant ``a``'s step time over ``b``'s: the median of the step-by-step
    ratios when the steps were interleaved (paired), else of the medians."""
    if a not in variants or b not in variants:
        return None
    x, y = variants[a], variants[b]
    if paired:
        return float(np.median(np.asarray(x["step_ms"]) / np.asarray(y["step_ms"])))
    return x["median_ms"] / y["median_ms"]


def table(results: list) -> str:
    """Markdown: a row per variant, a column per result (network, P), cells 'median ms
    (x vs ddp)'; below it auto's picks, replicas that diverged and issue #25's checks."""
    results = sorted(results, key=lambda r: (r["P"], r["network"] != "nvlink", r["network"]))
    names = list(dict.fromkeys([v for v in VARIANTS if any(v in r["variants"] for r in results)]
                               + [v for r in results for v in r["variants"]]))
    r0, c = results[0], results[0]["config"]
    lines = [f"{r0['machine']['device']}, {r0['params'] / 1e6:.1f}M parameters ({c['layers']} "
             f"layers, d_model {c['d_model']}, vocabulary {c['vocab']}, {c['batch']} x {c['seq']} "
             f"tokens per rank, {'bf16 autocast' if c['amp'] else 'fp32'}), density "
             f"{c['density']}: median ms per step (x vs ddp) of " + (
                 f"{c['steps']} steps, the variants interleaved step by step (x: paired)"
                 if r0.get("interleaved") else f"{c['steps']} x {c['rounds']}"), "",
             "| variant | " + " | ".join(f"{r['network']} P={r['P']}" for r in results) + " |",
             "|---|" + "---|" * len(results)]
    for v in names:
        lines.append(f"| {v} | " + " | ".join(_cell(r["variants"].get(v)) for r in results) + " |")
    lines.append("")
    for r in results:
        where = f"{r['network']} P={r['P']}"
        for v in ("at:auto", "hook:auto"):
            rec = r["variants"].get(v)
            if rec is None:
                continue
            picks = [d["algorithm"] for d in rec["auto_decisions"].values()]
            shown = ", ".join(f"{a} x{picks.count(a)}" for a in sorted(set(picks))) or "nothing"
            if rec.get("hook", {}).get("native"):
                shown = "nccl for the model (DDP's native allreduce, register())"
            lines.append(f"- {where}: {v} picked {shown} (profile {r['profile']})")
        lines += [f"- {where}: {v} skipped: {why}" for v, why in r.get("skipped", {}).items()]
        bwd = [f"{v} {x['backward_median_ms']:.1f}" for v, x in r["variants"].items()
               if "backward_median_ms" in x]
        if bwd:
            lines.append(f"- {where}: backward() on the host, rank 0, median ms: {', '.join(bwd)}")
        bad = [v for v, x in r["variants"].items() if x.get("identical") is False]
        if bad:
            lines.append(f"- {where}: replicas NOT bitwise identical after {', '.join(bad)}")
        lines += [f"- {where}: {s}" for s in _checks(r)]
    return "\n".join(lines)


def _cell(x) -> str:
    if x is None:
        return "-"
    return f"{x['median_ms']:.1f} ms" + ("" if x["vs_ddp"] is None else f" ({x['vs_ddp']:.2f}x)")


def _checks(r: dict) -> list:
    """Issue #25's targets on a GPU network, where this result has what they compare."""
    vs = r["variants"]
    ms = {v: x["median_ms"] for v, x in vs.items()}

    def ratio(a, b):
        return _ratio(vs, a, b, r.get("interleaved", False))

    hooks = {v: t for v, t in ms.items() if v[:3] == "at:"}
    algos = collectives.ALGORITHMS
    sparse = {v: t for v, t in hooks.items() if v[3:] in algos and algos[v[3:]].lossy}
    out = []
    if r["network"] == "nvlink" and "ddp" in ms:
        out += [(ratio(v, "ddp") <= 1.05, f"{v} {ratio(v, 'ddp'):.3f}x ddp (<= 1.05)")
                for v in ("at:nccl", "at:auto") if v in ms]
    if r["network"] == "sockets" and sparse:
        b = min(sparse, key=sparse.get)
        if "compute" in ms:
            out.append((ratio(b, "compute") <= 1.3,
                        f"best sparse hook {b} {ratio(b, 'compute'):.2f}x compute (<= 1.3)"))
        if "powersgd1" in ms:
            out.append((ratio(b, "powersgd1") < 1,
                        f"{b} {sparse[b]:.1f} ms faster than powersgd1 {ms['powersgd1']:.1f} ms"))
    others = {v: t for v, t in hooks.items() if v != "at:auto"}
    if r["network"] in ("nvlink", "sockets") and "at:auto" in hooks and others:
        b = min(others, key=others.get)
        out.append((ratio("at:auto", b) <= 1.05,
                    f"at:auto {ratio('at:auto', b):.3f}x the best hook {b} (<= 1.05)"))
    return [f"{'PASS' if ok else 'FAIL'} {text}" for ok, text in out]


def run(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.train_step run",
                                 description="launch the ranks once per network; other options "
                                 "go to the ranks (python -m benchmarks.train_step --help)")
    ap.add_argument("-n", "--np", type=int, default=2, help="ranks (one GPU each)")
    ap.add_argument("--networks", default="nvlink,sockets",
                    help=f"comma list of {', '.join(sorted(NETWORK_ENV))}")
    ap.add_argument("--out", required=True, help="directory for train_step_<network>_P<P>.json")
    args, rest = ap.parse_known_args(argv)
    worker_parser().parse_args(rest)  # a bad option fails here, not on every rank
    nets = [n for n in args.networks.split(",") if n]
    if any(n not in NETWORK_ENV for n in nets):
        ap.error(f"--networks: choose from {', '.join(sorted(NETWORK_ENV))}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    # the ranks inherit this environment: no NCCL setting of ours leaks into another network
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    done, rc = [], 0
    for net in nets:
        path = Path(args.out) / f"train_step_{net}_P{args.np}.json"
        path.unlink(missing_ok=True)
        cmd = mpiexec_argv(args.np, [sys.executable, "-u", "-m", "mpi4py", "-m",
                                     "benchmarks.train_step", *rest, "--network", net,
                                     "--out", str(path)], env={**NVLS_OFF_ENV, **NETWORK_ENV[net]})
        cmd[1:1] = ["--bind-to", "none"]  # a core per rank starves NCCL's proxy threads
        print(f"=== {net}: {' '.join(cmd)}", flush=True)
        t0 = time.perf_counter()
        code = subprocess.call(cmd, env=one_host_env(clean))
        print(f"=== {net}: exit {code} after {time.perf_counter() - t0:.0f} s", flush=True)
        if code == 0 and path.exists():
            done.append(json.loads(path.read_text()))
        else:
            rc = code or 1
    if done:
        print("\n" + table(done), flush=True)
    return rc


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["run"]:
        return run(argv[1:])
    if argv[:1] == ["table"]:
        ap = argparse.ArgumentParser(prog="python -m benchmarks.train_step table",
                                     description="redraw the markdown table from result JSON")
        ap.add_argument("files", nargs="+")
        print(table([json.loads(Path(f).read_text()) for f in ap.parse_args(argv[1:]).files]))
        return 0
    return bench(argv)


if __name__ == "__main__":
    raise SystemExit(main())

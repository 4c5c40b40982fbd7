"""Estimate: Ok-Topk's bytes per rank if its index arrays were delta-coded.

    mpiexec -n 16 --oversubscribe python tools/index_coding.py [--n 1048576]
        [--density 0.01] [--iters 80] [--warmup 16] [--algorithm oktopk]

Runs the algorithm on the traffic study's gradient stream and wraps the
Communicator's ``isend`` and ``allgatherv``: every int32 array sent (Ok-Topk's
index messages: the reduce step's per-partner indices, the balance moves and
the allgathered block) is costed three ways, the rest of the call's bytes
(values, control) as measured:

  raw    4 bytes per index (what is sent today);
  u16    the first index in 4 bytes, then each gap to the previous index in
         2 bytes, or 6 (an escape word and 4 bytes) when it is 65535 or more;
  varint the first index and each gap in LEB128 (7 bits a byte).

The allgathered block is costed sorted (its order does not matter to the
receivers, who scatter it).  Prints, like the traffic study, the steady-state
mean over calls of the busiest rank's bytes (sent / received) over the lower
bound 2k(P-1)/P words.  An estimate: nothing is encoded, and the encode and
decode work (a diff and a prefix sum over the indices) is not timed.
"""
from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import collectives
import kernels
from autotune.dispatch import parse_spec
from autotune.studies import gradient_stream
from collectives import ALGORITHMS

CODINGS = ("raw", "u16", "varint")


def coded_bytes(idx) -> dict[str, int]:
    """Bytes of one sorted int32 index array under each coding."""
    m = int(idx.size)
    if m == 0:
        return dict.fromkeys(CODINGS, 0)
    a = np.sort(np.asarray(idx, dtype=np.int64))
    gaps = np.diff(a)
    u16 = 4 + 2 * gaps.size + 4 * int(np.count_nonzero(gaps >= 0xFFFF))
    vals = np.concatenate([a[:1], gaps])
    var = int(np.sum(1 + (vals >= 1 << 7) + (vals >= 1 << 14) + (vals >= 1 << 21)
                     + (vals >= 1 << 28)))
    return {"raw": 4 * m, "u16": u16, "varint": var}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--iters", type=int, default=80)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--algorithm", default="oktopk")
    args = ap.parse_args(argv)
    world = MPI.COMM_WORLD
    comm = collectives.MPICommunicator(world)
    P, rank = comm.size, comm.rank
    k = kernels.k_from_density(args.n, args.density)
    lower = 2 * k * (P - 1) / P * 4
    name, kw = parse_spec(args.algorithm)
    algo = ALGORITHMS[name](comm, check_finite=False, **kw)

    p2p = {c: np.zeros(P, np.int64) for c in CODINGS}    # this call: index bytes to each rank
    block = dict.fromkeys(CODINGS, 0)                      # this call: allgathered index bytes
    isend, allgatherv = comm.isend, comm.allgatherv

    def isend_costed(buf, dest, tag=0):
        if buf.dtype == np.int32:
            for c, b in coded_bytes(buf).items():
                p2p[c][dest] += b
        return isend(buf, dest, tag)

    def allgatherv_costed(sendbuf, counts=None):
        if sendbuf.dtype == np.int32:
            for c, b in coded_bytes(sendbuf).items():
                block[c] += b
        return allgatherv(sendbuf, counts)

    comm.isend, comm.allgatherv = isend_costed, allgatherv_costed
    stream = gradient_stream(args.n, rank, seed=0)
    ratios = {c: [] for c in CODINGS}
    for it in range(args.iters):
        for c in CODINGS:
            p2p[c][:] = 0
            block[c] = 0
        algo(next(stream), name="grad", density=args.density)
        tot = algo.last_traffic.total()
        mine = np.array([tot.bytes_sent, tot.bytes_recv] +
                        [v for c in CODINGS for v in (*p2p[c], block[c])], dtype=np.int64)
        table = np.array(world.allgather(mine))              # P x (2 + 3 (P + 1))
        if it < args.warmup:
            continue
        sent, recv = table[:, 0], table[:, 1]
        for j, c in enumerate(CODINGS):
            cols = table[:, 2 + j * (P + 1): 2 + (j + 1) * (P + 1)]
            mat, blk = cols[:, :P], cols[:, P]
            isent = mat.sum(axis=1) + blk * (P - 1)
            irecv = mat.sum(axis=0) + (blk.sum() - blk)
            if j == 0:
                raw_sent, raw_recv = isent, irecv
            s = sent - raw_sent + isent
            r = recv - raw_recv + irecv
            ratios[c].append((s.max() / lower, r.max() / lower))
    if rank == 0:
        print(f"{args.algorithm} P={P} n={args.n} k={k}: busiest rank over the lower bound, "
              f"sent / received, steady-state mean (calls {args.warmup}..{args.iters - 1})")
        for c in CODINGS:
            a = np.array(ratios[c])
            print(f"  {c:7s} {a[:, 0].mean():.3f} / {a[:, 1].mean():.3f} "
                  f"(worst call {a.max():.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

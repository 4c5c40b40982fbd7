"""Studies and benchmark scripts behind docs/BENCHMARKS.md: not installed, not library API.

Run from the repository root (``python -m benchmarks.<script> --help``);
benchmarks/README.md says which section of docs/BENCHMARKS.md each reproduces.

- ``traffic``: bytes per rank of every algorithm against the sparse lower
  bound 2k(P-1)/P words, on heavy-tailed gradient-like data with error
  feedback (``mpiexec -n P python -m benchmarks.traffic``).
- ``quality``: how much of the exact global top-k each sparse algorithm
  delivers over 200 error-feedback iterations, and how Ok-Topk's threshold
  reuse interval tau' changes that (``mpiexec -n 4 python -m
  benchmarks.quality``).
- ``regret``: the selector's regret on measurements held out of its training.
- ``scaling``: weak scaling P = 2..32 measured (plain and 1 Gbit/s), the cost
  model's error on those points, Piz Daint projection to P = 256
  (``python -m benchmarks.scaling measure|model|project|plot|report``).

Traffic and quality draw the same kind of data (``gradient_stream``) so their
numbers can be read together.
"""
from __future__ import annotations

import argparse

import numpy as np

__all__ = ["NCCL_SOCKETS_ENV", "NVLS_OFF_ENV", "gradient_stream", "json_files", "load_json",
           "study_parser"]

def load_json(path):
    """A JSON result or profile, gzip-compressed (``.json.gz``: docs/data/offprofile
    stores its files so) or not."""
    from autotune.profile import Profile

    return Profile.read_json(path)


def json_files(directory, pattern: str) -> list:
    """The files ``pattern`` + ``.json`` in ``directory``, plain or gzip-compressed."""
    from pathlib import Path

    d = Path(directory)
    return sorted([*d.glob(f"{pattern}.json"), *d.glob(f"{pattern}.json.gz")])


#: the lent GPU machines' rule (NVLink multicast off), for every NCCL launch there;
#: benchmarks/gpu_suite.sh sets the same in bash
NVLS_OFF_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
#: NCCL over TCP sockets on loopback between GPUs of one host: the "slow network"
NCCL_SOCKETS_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket",
                    "NCCL_SOCKET_IFNAME": "lo"}


def study_parser(module: str, doc: str, *, n: int, iters: int, warmup: int,
                 warmup_help: str | None = None) -> argparse.ArgumentParser:
    """The options every error-feedback study shares: --n, --density, --iters, --warmup."""
    ap = argparse.ArgumentParser(prog=f"python -m benchmarks.{module}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=n)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--iters", type=int, default=iters)
    ap.add_argument("--warmup", type=int, default=warmup, help=warmup_help)
    return ap


def gradient_stream(n: int, rank: int, *, seed: int = 0, layers: int = 16,
                    shared: float = 0.7, drift: float = 0.97, df: float = 2.0,
                    dtype=np.float32):
    """Yield gradient-like vectors for one rank, one per iteration, forever.

    g_r(t) = scale_layer * (shared * s(t) + noise_r(t)) where
      * the n entries are cut into ``layers`` equal blocks, each with its own
        log-normal scale (sigma 1): layers differ by orders of magnitude, as
        in real networks;
      * s(t) is one signal shared by all ranks (the true gradient), drifting
        slowly: s(t) = drift s(t-1) + sqrt(1 - drift^2) e(t);
      * e and noise are Student-t with ``df`` degrees of freedom (heavy
        tails; Z / sqrt(chi2_df / df)), fresh per iteration, the noise also
        per rank (the minibatch noise).  df = 2 has infinite variance: fine
        for counting bytes, but a norm-based quality metric is then decided
        by a handful of outliers, so the quality study uses df = 3.
    Identical on every run for the same (n, rank, seed): all algorithms of a
    study see the same data.
    """
    shared_rng = np.random.default_rng([seed, 10**6])
    own_rng = np.random.default_rng([seed, rank])
    bounds = np.linspace(0, n, layers + 1).astype(np.int64)
    scales = np.exp(shared_rng.normal(0.0, 1.0, layers)).astype(dtype)
    scale = np.repeat(scales, np.diff(bounds))

    half = np.float32(df / 2.0)

    def t2(rng):   # Student-t(df): chi2_df / df = Gamma(df/2) / (df/2)
        return (rng.standard_normal(n, dtype=np.float32)
                / np.sqrt(rng.standard_gamma(half, n, dtype=np.float32) / half + np.float32(1e-12)))

    s = t2(shared_rng)
    c = np.float32(np.sqrt(1.0 - drift * drift))
    while True:
        g = scale * (np.float32(shared) * s + t2(own_rng))
        yield np.ascontiguousarray(g, dtype=dtype)
        s = np.float32(drift) * s + c * t2(shared_rng)

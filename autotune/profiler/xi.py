"""xi, the gap of Li & Hoefler's Assumption 1, on real gradients: a short
data-parallel training run of a NumPy MLP (hand-written backprop) on
load_digits, or gradient snapshots from ``--gradients DIR``."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

import kernels

from .common import ProfilerError


def _topk_dense(v: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros_like(v)
    idx = kernels.topk_indices(v, k)
    out[idx] = v[idx]
    return out


def assumption1_gap(accs: np.ndarray, k: int):
    """The gap of Li & Hoefler's Assumption 1 for one step.

    With acc_i = alpha*G_i + eps_i the accumulator of rank i (gradient times
    learning rate, plus error-feedback residual), Assumption 1 bounds

        || Topk( (1/P) sum_i acc_i ) - Topk( (1/P) sum_i Topk(acc_i) ) ||
            <= xi * || alpha * G ||,      G = (1/P) sum_i G_i,

    i.e. how far the top-k of the averaged accumulators (what an exact
    global top-k would send) is from the top-k of the averaged local top-k's
    (what Ok-Topk computes).  Returns (the left-hand norm, the index set
    Ok-Topk selects); the caller divides by ||alpha*G|| to get xi.
    """
    P = accs.shape[0]
    exact = _topk_dense(accs.mean(axis=0, dtype=np.float64).astype(accs.dtype), k)
    local = np.stack([_topk_dense(accs[i], k) for i in range(P)])
    approx = _topk_dense(local.mean(axis=0, dtype=np.float64).astype(accs.dtype), k)
    gap = float(np.linalg.norm((exact - approx).astype(np.float64)))
    return gap, np.flatnonzero(approx), local


class _XiTracker:
    """Error-feedback residuals per density, and the xi of every measured step.

    ``values`` is xi as the paper defines it (Assumption 1's right-hand side
    is xi * ||lr * G_t||, G_t the step's averaged stochastic gradient, no
    residuals); ``values_acc`` divides the same gap by ||mean_i acc_i||, the
    averaged accumulators (gradient plus residuals) an exact allreduce would
    select from: a relative selection error, at most about 1 in practice,
    comparable to what :class:`autotune.tuner.OnlineDensityGuard` observes.
    ``captured`` is the share of the step's averaged gradient's L2 norm in its
    own top-k entries: it rises with the density on every step (so do its
    medians), unlike xi, which is why the tuner can use it as a guard.
    """

    def __init__(self, densities):
        self.densities = list(densities)
        self.res: dict = {}
        self.values: dict = {d: [] for d in self.densities}
        self.values_acc: dict = {d: [] for d in self.densities}
        self.captured: dict = {d: [] for d in self.densities}

    def step(self, grads: np.ndarray, lr: float, measure: bool) -> None:
        """``grads``: (P, n) per-rank gradients of one step."""
        P, n = grads.shape
        mean = grads.mean(axis=0, dtype=np.float64)
        mean_norm = float(np.linalg.norm(mean))
        denom = abs(lr) * mean_norm
        for d in self.densities:
            k = kernels.k_from_density(n, d)
            if measure and denom > 0:
                self.captured[d].append(float(np.linalg.norm(_topk_dense(mean, k))) / mean_norm)
            res = self.res.get(d)
            if res is None or res.shape != grads.shape:
                res = np.zeros_like(grads)
            acc = lr * grads + res
            gap, selected, local = assumption1_gap(acc, k)
            # Ok-Topk's residual: a value leaves the accumulator only if this
            # rank selected it locally and it made the global selection
            sent = np.zeros_like(acc, dtype=bool)
            sent[:, selected] = True
            sent &= local != 0
            self.res[d] = np.where(sent, 0, acc)
            if measure and denom > 0:
                self.values[d].append(gap / denom)
                acc_norm = float(np.linalg.norm(acc.mean(axis=0, dtype=np.float64)))
                if acc_norm > 0:
                    self.values_acc[d].append(gap / acc_norm)

    @staticmethod
    def _summary(values: dict) -> tuple[dict, float | None]:
        by = {str(d): (float(np.median(v)) if v else None) for d, v in values.items()}
        allv = [x for v in values.values() for x in v]
        return by, (float(np.median(allv)) if allv else None)

    def record(self, source: str, **extra) -> dict:
        by, med = self._summary(self.values)
        by_acc, med_acc = self._summary(self.values_acc)
        by_cap, _ = self._summary(self.captured)
        return {"source": source, "by_density": by, "median": med,
                "samples": {str(d): [float(x) for x in v] for d, v in self.values.items()},
                "definition": "||Topk(mean_i acc_i) - Topk(mean_i Topk(acc_i))||"
                              " / ||lr*mean_i G_i||, acc_i = lr*G_i + residual_i"
                              " (Li & Hoefler PPoPP'22, Assumption 1: the right-hand side is"
                              " xi*||alpha*G_t(w_t)||, the step's learning-rate-scaled"
                              " averaged stochastic gradient, without residuals)",
                "relative_to_accumulator": {
                    "by_density": by_acc, "median": med_acc,
                    "definition": "the same gap / ||mean_i acc_i|| (averaged accumulators,"
                                  " residuals included): a relative selection error, not the"
                                  " paper's xi"},
                "captured_norm": {
                    "by_density": by_cap,
                    "definition": "||Topk(mean_i G_i)|| / ||mean_i G_i||: the share of the step's"
                                  " averaged gradient's L2 norm in its own top-k entries (median"
                                  " over the measured steps); rises with the density"},
                **extra}


def xi_from_training(comm, plan, *, seed: int = 0, lr: float = 0.1, batch: int = 32,
                     hidden: int = 64, progress=None) -> dict:
    """Train a small MLP on load_digits, data-parallel over the ranks, and
    measure xi on its real per-rank gradients every few steps."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    mine = np.arange(comm.rank, len(y), comm.size)  # this rank's shard
    Xs, ys = X[mine], y[mine]
    rng = np.random.default_rng([seed, 7])  # same initial weights on every rank
    d_in, d_out = X.shape[1], 10
    shapes = [(d_in, hidden), (hidden,), (hidden, d_out), (d_out,)]
    sizes = [int(np.prod(s)) for s in shapes]
    w = np.concatenate([rng.standard_normal(sizes[0]) * math.sqrt(2 / d_in), np.zeros(hidden),
                        rng.standard_normal(sizes[2]) * math.sqrt(2 / hidden), np.zeros(d_out)]
                       ).astype(np.float32)
    bounds = np.cumsum([0] + sizes)

    def unpack(v):
        return [v[bounds[i]:bounds[i + 1]].reshape(shapes[i]) for i in range(4)]

    def grad(v, xb, yb):
        W1, b1, W2, b2 = unpack(v)
        h = np.maximum(xb @ W1 + b1, 0)
        z = h @ W2 + b2
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(yb)), yb] -= 1
        p /= len(yb)
        gW2, gb2 = h.T @ p, p.sum(0)
        dh = (p @ W2.T) * (h > 0)
        gW1, gb1 = xb.T @ dh, dh.sum(0)
        return np.concatenate([gW1.ravel(), gb1, gW2.ravel(), gb2]).astype(np.float32)

    track = _XiTracker(plan["xi_densities"])
    brng = np.random.default_rng([seed, comm.rank])
    for step in range(plan["xi_steps"]):
        pick = brng.choice(len(ys), size=min(batch, len(ys)), replace=False)
        g = grad(w, Xs[pick], ys[pick])
        grads = comm.allgather(g)  # (P, n): every rank sees every gradient
        track.step(grads, lr, measure=(step + 1) % plan["xi_every"] == 0)
        w -= lr * grads.mean(axis=0)
        if progress:
            progress.step(f"xi training step {step + 1}")
    W1, b1, W2, b2 = unpack(w)
    acc = float(np.mean(np.argmax(np.maximum(X @ W1 + b1, 0) @ W2 + b2, axis=1) == y))
    return track.record(
        "training", model=f"MLP {d_in}-{hidden}-{d_out} (ReLU, softmax) on scikit-learn "
                          f"load_digits, {comm.size} shards, batch {batch}/rank, SGD lr {lr}",
        n_params=int(w.size), steps=plan["xi_steps"], measured_every=plan["xi_every"],
        train_accuracy=acc)


def load_gradient_dir(path) -> list[tuple[str, np.ndarray]]:
    """Gradient snapshots: every ``*.npy`` in DIR (sorted by name) is one step,
    a 2-D float array (workers, n) of the workers' gradients at that step.
    Loaded with ``allow_pickle=False``: a file holding objects is refused."""
    d = Path(path)
    if not d.is_dir():
        raise ProfilerError(f"--gradients {path}: not a directory")
    files = sorted(d.glob("*.npy"))
    if not files:
        raise ProfilerError(f"--gradients {path}: no .npy files in it")
    out = []
    for f in files:
        try:
            a = np.load(f, allow_pickle=False)
        except ValueError as e:
            raise ProfilerError(f"{f}: cannot load without pickle ({e})") from None
        except OSError as e:
            raise ProfilerError(f"{f}: not a readable .npy file ({e})") from None
        if a.ndim != 2 or a.shape[0] < 2 or not np.issubdtype(a.dtype, np.floating):
            raise ProfilerError(f"{f}: expected a 2-D float array (workers >= 2, n), got "
                                f"shape {a.shape} dtype {a.dtype}")
        if not np.isfinite(a).all():
            raise ProfilerError(f"{f}: holds NaN or Inf")
        out.append((f.name, a.astype(np.float32, copy=False)))
    return out


def xi_from_files(snapshots, densities) -> dict:
    track = _XiTracker(densities)
    for _, a in snapshots:
        track.step(a, 1.0, measure=True)  # files hold lr-scaled gradients or raw: xi is scale-free
    return track.record("gradients", files=[name for name, _ in snapshots])

"""Data-parallel training of a small CNN on scikit-learn's 8x8 digits, any allreduce.

    .venv/bin/autotune launch -n 4 examples/digits_cnn.py --algorithm oktopk --density 0.01 \
        --seed 0 --epochs 40 --out digits.json

The data ship with scikit-learn (1797 images, 10 classes; no download); the
train/test split is fixed (30% test, stratified, random_state=0) whatever
the seed.  Every global batch (--batch-size, default 64) is cut into P
shards, one per rank; gradients are averaged by
``autotune.torch.DistributedOptimizer`` (or the DDP hook with
--integration ddp), dense for --warmup-steps steps and then with the chosen
algorithm and density.  Rank 0 prints each epoch and writes the curves
(train loss, test accuracy and loss, wall time per epoch) as JSON.
Comma lists in --algorithm/--density/--seed run the whole grid in one launch.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import autotune
from _common import parser, run_grid, setup


def load():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    return (torch.from_numpy(Xtr), torch.from_numpy(ytr.astype(np.int64)),
            torch.from_numpy(Xte), torch.from_numpy(yte.astype(np.int64)))


def make_model(width: int = 8) -> nn.Module:
    """Two 3x3 conv blocks and two linear layers (53k parameters at width 32)."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),           # w x 4 x 4
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 2w x 2 x 2
        nn.Flatten(), nn.Linear(8 * width, 4 * width), nn.ReLU(), nn.Linear(4 * width, 10))


def main(argv=None):
    ap = parser(__doc__.split("\n")[0], epochs=40, batch_size=64, lr=0.1, warmup_steps=100,
                density_warmup=76)
    ap.add_argument("--width", type=int, default=32, help="channels of the first conv layer")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--clip", type=float, default=1.0, help="clip the averaged gradient's norm")
    args = ap.parse_args(argv)
    device = setup(args)
    Xtr, ytr, Xte, yte = (t.to(device) for t in load())
    P = autotune.init().size

    def train_step(net, idx, B):
        idx = torch.from_numpy(idx).to(Xtr.device)
        loss = F.cross_entropy(net(Xtr[idx]), ytr[idx], reduction="sum")
        # sum / B * P: the average over ranks is the global batch's mean gradient
        (loss * (P / B)).backward()
        return float(loss.detach()), len(idx)

    def evaluate(net, rank, P):
        x, y = Xte[rank::P], yte[rank::P]
        out = net(x)
        return {"count": float(len(y)),
                "test_acc": float((out.argmax(1) == y).sum()),
                "test_loss": float(F.cross_entropy(out, y, reduction="sum"))}

    run_grid(args, device=device, name="digits_cnn",
             make_model=lambda: make_model(args.width),
             make_optimizer=lambda m, lr: torch.optim.SGD(m.parameters(), lr=lr,
                                                          momentum=args.momentum),
             clip=args.clip,
             train_step=train_step, evaluate=evaluate, n_train=len(ytr),
             data_info={"dataset": "sklearn.datasets.load_digits", "n_train": len(ytr),
                        "n_test": len(yte), "split": "test_size=0.3, stratify, random_state=0"})


if __name__ == "__main__":
    main()

"""Data-parallel training of a small character-level LSTM language model, any allreduce.

    .venv/bin/autotune launch -n 4 examples/lstm_lm.py --algorithm oktopk --density 0.01 \
        --seed 0 --out lstm.json

The corpus is real text that every Python installation carries offline: a
fixed list of the standard library's own modules, read from
``sysconfig.get_paths()["stdlib"]``.  Training text: TRAIN_MODULES;
validation text: VAL_MODULES (whole held-out files, so the split is fixed
whatever the seed).  Characters map to a fixed vocabulary (newline, printable
ASCII, one "other" symbol).  The training text is cut into non-overlapping
windows of --bptt characters; each epoch shuffles them and every global
batch of windows is cut into P shards, one per rank.  Gradients are averaged
by ``autotune.torch.DistributedOptimizer`` (or the DDP hook), dense for
--warmup-steps steps, then with the chosen algorithm and density; the
averaged gradient is clipped to norm --clip before the SGD (momentum) step,
and the learning rate follows a cosine decay.  Rank 0
prints each epoch and writes the curves (train loss, validation loss and
perplexity per character, wall time per epoch) as JSON.
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import autotune
from _common import parser, run_grid, setup

TRAIN_MODULES = ("textwrap", "string", "shlex", "fnmatch", "glob", "bisect", "heapq",
                 "queue", "colorsys", "copy", "reprlib", "abc", "graphlib", "getopt",
                 "numbers", "operator")
VAL_MODULES = ("csv",)
VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))  # + 1: any other character


def encode(text: str) -> np.ndarray:
    lut = np.full(256, len(VOCAB), dtype=np.int64)
    for i, ch in enumerate(VOCAB):
        lut[ord(ch)] = i
    codes = np.frombuffer(text.encode("latin-1", errors="replace"), dtype=np.uint8)
    return lut[codes]


def load(modules) -> tuple[np.ndarray, dict]:
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, info = [], {}
    for m in modules:
        raw = (root / f"{m}.py").read_bytes()
        info[f"{m}.py"] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()[:16]}
        texts.append(raw.decode("utf-8"))
    return encode("\n".join(texts)), info


class CharLSTM(nn.Module):
    """Embedding, one LSTM layer, linear decoder (about 100k parameters at hidden 128)."""

    def __init__(self, vocab: int, emb: int = 32, hidden: int = 128):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x):
        h, _ = self.lstm(self.emb(x))
        return self.out(h)


def main(argv=None):
    ap = parser(__doc__.split("\n")[0], epochs=8, batch_size=32, lr=0.5, warmup_steps=300,
                density_warmup=600)
    ap.add_argument("--bptt", type=int, default=32, help="characters per training window")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--clip", type=float, default=0.5, help="clip the averaged gradient's norm")
    ap.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    args = ap.parse_args(argv)
    device = setup(args)
    P = autotune.init().size
    train, train_info = load(TRAIN_MODULES)
    val, val_info = load(VAL_MODULES)
    T = args.bptt
    n_win = (len(train) - 1) // T
    X = torch.from_numpy(train[:n_win * T].reshape(n_win, T))
    Y = torch.from_numpy(train[1:n_win * T + 1].reshape(n_win, T))
    v_win = (len(val) - 1) // T
    VX = torch.from_numpy(val[:v_win * T].reshape(v_win, T))
    VY = torch.from_numpy(val[1:v_win * T + 1].reshape(v_win, T))
    X, Y, VX, VY = (t.to(device) for t in (X, Y, VX, VY))
    V = len(VOCAB) + 1

    def train_step(net, idx, B):
        idx = torch.from_numpy(idx).to(X.device)
        logits = net(X[idx])
        loss = F.cross_entropy(logits.reshape(-1, V), Y[idx].reshape(-1), reduction="sum")
        (loss * (P / (B * T))).backward()  # averaged over ranks: the global mean per character
        return float(loss.detach()), len(idx) * T

    def evaluate(net, rank, P):
        x, y = VX[rank::P], VY[rank::P]
        logits = net(x)
        return {"count": float(y.numel()),
                "loss": float(F.cross_entropy(logits.reshape(-1, V), y.reshape(-1),
                                              reduction="sum"))}

    def make_optimizer(m, lr):
        if args.optimizer == "adam":
            return torch.optim.Adam(m.parameters(), lr=lr)
        return torch.optim.SGD(m.parameters(), lr=lr, momentum=args.momentum)

    run_grid(args, device=device, name="lstm_lm",
             make_model=lambda: CharLSTM(V, hidden=args.hidden),
             make_optimizer=make_optimizer, train_step=train_step, evaluate=evaluate,
             n_train=n_win, clip=args.clip,
             data_info={"corpus": "Python standard library sources (sysconfig stdlib path)",
                        "train_files": train_info, "val_files": val_info,
                        "train_chars": int(len(train)), "val_chars": int(len(val)),
                        "vocab": V, "bptt": T})


if __name__ == "__main__":
    main()

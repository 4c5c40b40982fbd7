"""The Piz Daint projection of the scaling study: the paper's models at P = 16..256
priced by the cost model on ``profiles/piz_daint.json`` (published figures, not
measured), with an error band from a measured profile's held-out errors.
``python -m benchmarks.scaling project`` prints it (benchmarks/scaling.py)."""
from __future__ import annotations

import math
from pathlib import Path

import profiles
from autotune import costmodel
from autotune.profile import Profile

PROJECT_P = (16, 32, 64, 128, 256)
DAINT = str(Path(profiles.__file__).parent / "piz_daint.json")  # shipped with the package
# Order of columns everywhere; native MPI_Allreduce first, then Table 1's order.
ALGO_ORDER = ("mpi", "dense", "topka", "gaussiank", "gtopk", "topkdsa", "oktopk", "topka2a")

# The paper's three models (Li & Hoefler, PPoPP'22, arXiv:2201.07598).  n is the
# number of trainable parameters of the model as the public reference code
# (github.com/Shigangli/Ok-Topk) builds it, counted here layer by layer; the
# density is the one its Ok-Topk job scripts pass.  The paper's own table of
# model sizes and densities was NOT found in the text available to us.
PAPER_MODELS = {
    "VGG-16 (Cifar-10)": dict(
        n=14_728_266, density=0.02,
        n_source="VGG-16 for 32x32 inputs (13 conv3x3 + BatchNorm, one 512x10 linear), "
                 "counted with torch.nn: 14,728,266 (the 14.7M of the issue)",
        density_source="VGG/vgg16_oktopk.sh: density=0.02"),
    "LSTM (AN4)": dict(
        n=27_569_568, density=0.02,
        n_source="reference LSTM/models/lstman4.py: DeepSpeech, 2 conv + 5 unidirectional "
                 "LSTM layers of 800, lookahead 20, 29 labels; counted with torch.nn: 27,569,568",
        density_source="LSTM/lstm_oktopk.sh: density=0.02"),
    "BERT (Wikipedia)": dict(
        n=110_106_428, density=0.01,
        n_source="reference BERT/bert/bert_oktopk.sh trains bert-base-uncased "
                 "(configs/bert_config_bert-base-uncased.json): BERT-base with the "
                 "pre-training heads, 110,106,428 (Devlin et al.: 'BERT-BASE ... 110M')",
        density_source="BERT/bert/bert_oktopk.sh: --density 0.01"),
}
# What the paper reports that we could read (its abstract, arXiv:2201.07598):
# {model: {P: (low, high, text)}}.  Whole training steps, not the allreduce alone.
PAPER_REPORTED = {
    "BERT (Wikipedia)": {
        256: (3.29, 12.95, "3.29x-12.95x training throughput over dense and the sparse "
                           "baselines (abstract; whole training step; per-baseline split not found)")},
}



def machine_at(prof: dict, *, runs: bool = True) -> costmodel.Machine:
    """The cost model's Machine of a profile (it prices any P itself, see
    ``costmodel.Machine.at``); ``runs=False``: Table 1's terms alone, nothing
    fitted from the profile's runs."""
    return costmodel.Machine.from_profile(prof if runs else {**prof, "runs": []})


# A model built from published point-to-point and single-GPU figures sits at this P.
BAND_REF_P = 2


def project(prof: dict, models=PAPER_MODELS, Ps=PROJECT_P, algorithms=ALGO_ORDER,
            tau_prime: int = 32, band_from: dict | None = None) -> list[dict]:
    """Predicted seconds per allreduce of every algorithm, per model and P,
    and each one's speedup over dense (Rabenseifner).  With ``band_from`` (a
    measured profile) each prediction gets a band [pred / f, pred * f], f =
    exp(held-out error in range + per octave x log2(P / BAND_REF_P)), that
    profile's errors per algorithm (``costmodel.heldout_errors``)."""
    Profile(prof)
    M = machine_at(prof)
    errs = {}
    if band_from is not None:
        errs = costmodel.heldout_errors(machine_at(band_from), band_from.get("runs") or [])
    out = []
    for model, spec in models.items():
        for P in Ps:
            t = {a: costmodel.predict(M, a, spec["n"], P, spec["density"], tau_prime=tau_prime)
                 for a in algorithms}
            row = {"model": model, "n": spec["n"], "density": spec["density"], "P": P,
                   "pred_s": t, "speedup_vs_dense": {a: t["dense"] / v for a, v in t.items()}}
            if errs:
                octaves = max(0.0, math.log2(P / BAND_REF_P))
                f = {a: math.exp(costmodel.expected_error(errs[a], octaves_P=octaves))
                     for a in algorithms if a in errs}
                row["band_s"] = {a: (t[a] / v, t[a] * v) for a, v in f.items()}
            out.append(row)
    return out


def projection_table(proj) -> str:
    algos = list(proj[0]["pred_s"])
    sparse = [a for a in algos if a != "dense"]
    lines = ["Projected time per allreduce with profiles/piz_daint.json (ms) and the speedup "
             "over dense (Rabenseifner); [band] where an error band was asked for", "",
             "| model (n, density) | P | dense ms | " + " | ".join(sparse) + " | paper reports |",
             "|---|---|---|" + "---|" * len(sparse) + "---|"]
    for r in proj:
        paper = PAPER_REPORTED.get(r["model"], {}).get(r["P"], (0, 0, ""))[2]
        band = r.get("band_s", {})
        cells = [f"{1e3 * r['pred_s'][a]:.2f} ({r['speedup_vs_dense'][a]:.2f}x)"
                 + (f" [{1e3 * band[a][0]:.3g}-{1e3 * band[a][1]:.3g}]" if a in band else "")
                 for a in sparse]
        dband = (f" [{1e3 * band['dense'][0]:.3g}-{1e3 * band['dense'][1]:.3g}]"
                 if "dense" in band else "")
        lines.append(f"| {r['model']} ({r['n'] / 1e6:.2f}M, {100 * r['density']:g}%) | {r['P']} | "
                     f"{1e3 * r['pred_s']['dense']:.2f}{dband} | " + " | ".join(cells) + f" | {paper} |")
    return "\n".join(lines)

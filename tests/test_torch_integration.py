"""PyTorch integration (autotune.torch) and the framework-neutral core (autotune.training).

In-process tests (P = 1) cover the wrappers' contracts; the MPI runner
tests/mpi/torch_checks.py trains a few steps at P = 2 and 3 with the DDP
hook and with DistributedOptimizer and checks that every rank's parameters
stay bitwise identical (SHA-256 of all parameters compared across ranks).
Tests that need torch skip cleanly without it.
"""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import support
from autotune.training import SparseSGD


def test_importing_autotune_does_not_import_torch():
    code = ("import sys, autotune, autotune.training, collectives; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the core, numpy, one process ------------------------------------------------------
def test_sparse_sgd_refuses_bad_configuration():
    with pytest.raises(ValueError, match="registered"):
        SparseSGD(algorithm="nope")
    with pytest.raises(ValueError, match="density"):
        SparseSGD(algorithm="gtopk", density=0.0)
    with pytest.raises(ValueError, match="warmup"):
        SparseSGD(algorithm="gtopk", warmup_steps=-1)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="tau_prime"):
            SparseSGD(algorithm="oktopk", tau_prime=bad)
        with pytest.raises(ValueError, match="tau "):
            SparseSGD(algorithm="oktopk", tau=bad)


def test_sparse_sgd_sets_the_refresh_intervals():
    """tau' and tau given to SparseSGD reach the sparse algorithm's per-tensor state."""
    import autotune

    sgd = SparseSGD(algorithm="oktopk", density=0.05, tau_prime=3, tau=7, prefix="taus")
    g = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    sgd.synchronize([("w", g)])
    st = autotune.algorithm_instance("oktopk").state("taus.flat.float32")
    assert (st.tau_prime, st.tau) == (3, 7)


@pytest.mark.parametrize("flat", [True, False])
def test_sparse_sgd_warmup_then_sparse_conserves_mass(flat):
    """At P = 1 the average is the input during warm-up; afterwards the sparse
    algorithm sends part of it and keeps the rest: outputs + residual = inputs."""
    rng = np.random.default_rng(0)
    sgd = SparseSGD(algorithm="topka", density=0.1, warmup_steps=2, flat=flat,
                    prefix=f"core.{flat}")
    total_in = {"w": np.zeros((4, 5)), "b": np.zeros(5)}
    total_out = {"w": np.zeros((4, 5)), "b": np.zeros(5)}
    for step in range(6):
        w = rng.standard_normal((4, 5)).astype(np.float32)
        b = rng.standard_normal(5).astype(np.float32)
        orig = {"w": w.copy(), "b": b.copy()}
        assert sgd.current_algorithm == ("dense" if step < 2 else "topka")
        sgd.synchronize([("w", w), ("b", b)])
        if step < 2:
            np.testing.assert_array_equal(w, orig["w"])
        else:
            assert np.count_nonzero(w) + np.count_nonzero(b) < 25
        for k, g in (("w", w), ("b", b)):
            total_in[k] += orig[k]
            total_out[k] += g
    assert (sgd.step, sgd.dense_steps, sgd.sparse_steps) == (6, 2, 4)
    import autotune

    algo = autotune.algorithm_instance("topka")
    if flat:
        res = algo.state(f"core.{flat}.flat.float32").residual
        res = {"w": res[:20].reshape(4, 5), "b": res[20:]}
    else:
        res = {k: algo.state(f"core.{flat}.{k}").residual.reshape(total_in[k].shape)
               for k in total_in}
    for k in total_in:
        np.testing.assert_allclose(total_out[k] + res[k], total_in[k], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algorithm", ["topka", "oktopk"])
def test_folded_learning_rate_applies_each_value_at_its_own_rate(algorithm):
    """learning_rate (the paper's eps + lr G): under a schedule, what the
    optimizer applies (rate x output) plus the residual equals the sum of
    rate x gradient over the steps (P = 1, a lossy algorithm; what a rate-0
    step delivers is applied at rate 0, as without folding); a constant
    rate gives the unfolded outputs (up to rounding); dense steps are exact."""
    rng = np.random.default_rng()
    rates = [0.5, 0.5, 0.4, 0.25, 0.1, 0.0, 0.05, 0.02]
    now = {"lr": 0.0}
    sgd = SparseSGD(algorithm=algorithm, density=0.05, warmup_steps=1,
                    learning_rate=lambda: now["lr"], prefix=f"fold.{algorithm}")
    const = SparseSGD(algorithm=algorithm, density=0.05, learning_rate=lambda: 0.37,
                      prefix=f"fold.c.{algorithm}")
    plain = SparseSGD(algorithm=algorithm, density=0.05, prefix=f"fold.p.{algorithm}")
    with pytest.raises(ValueError, match="callable"):
        SparseSGD(algorithm=algorithm, learning_rate=0.1)
    import autotune

    applied, fed, lost = np.zeros(500), np.zeros(500), np.zeros(500)
    for i, lr in enumerate(rates):
        now["lr"] = lr
        g = rng.standard_t(3, 500).astype(np.float32)
        out = sgd.allreduce(g, "x")
        if sgd.step == 0:
            np.testing.assert_array_equal(out, g)       # dense warm-up: not folded
        sgd.advance()
        applied += lr * np.asarray(out, np.float64)
        if lr == 0:       # delivered, divided by the last positive rate, applied at 0
            lost += rates[i - 1] * np.asarray(out, np.float64)
        fed += lr * g.astype(np.float64)
        a, b = const.allreduce(g, "x"), plain.allreduce(g, "x")
        const.advance()
        plain.advance()
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    res = autotune.algorithm_instance(algorithm).state(f"fold.{algorithm}.x").residual
    np.testing.assert_allclose(applied + res + lost, fed, rtol=1e-4, atol=1e-5)


def test_momentum_correction_masks_what_was_sent():
    """u = m u + g is sent; after a lossy step u is zero exactly where this
    rank's value reached the result (at P = 1: where the result is non-zero)
    and unchanged elsewhere; what left the residual is what reached the
    output."""
    rng = np.random.default_rng()
    m = 0.9
    sgd = SparseSGD(algorithm="topka", density=0.05, momentum=m, prefix="mc.mask")
    with pytest.raises(ValueError, match="momentum"):
        SparseSGD(algorithm="topka", momentum=1.0)
    import autotune

    u = np.zeros(400)
    for step in range(5):
        g = rng.standard_normal(400).astype(np.float32)
        u_sent = m * u + g
        res_before = (autotune.algorithm_instance("topka").state("mc.mask.x").residual.copy()
                      if step else np.zeros(400, np.float32))
        out = sgd.allreduce(g, "x")
        sgd.advance()
        res = autotune.algorithm_instance("topka").state("mc.mask.x").residual
        hit = out != 0
        assert 0 < hit.sum() <= 20
        np.testing.assert_allclose(out + res, res_before + u_sent, rtol=1e-5, atol=1e-5)
        vel = sgd._velocity["mc.mask.x"]
        assert not vel[hit].any()
        np.testing.assert_allclose(vel[~hit], u_sent[~hit], rtol=1e-5, atol=1e-6)
        u = np.where(hit, 0.0, u_sent)


def test_density_warmup_falls_geometrically_to_the_density():
    sgd = SparseSGD(algorithm="topka", density=0.001, warmup_steps=2, density_warmup=4,
                    prefix="dw")
    seen = []
    for _ in range(8):
        seen.append((sgd.current_algorithm, sgd.current_density))
        sgd.advance()
    assert [a for a, _ in seen] == ["dense"] * 2 + ["topka"] * 6
    d = [x for _, x in seen[2:]]
    assert d[0] == pytest.approx(0.25) and d[4:] == [0.001, 0.001]
    ratios = np.array(d[1:5]) / np.array(d[:4])
    np.testing.assert_allclose(ratios, (0.001 / 0.25) ** 0.25)
    with pytest.raises(ValueError, match="density_warmup"):
        SparseSGD(algorithm="topka", density_warmup=3)      # needs an explicit density
    assert SparseSGD(algorithm="topka", density=0.5, density_warmup=3).current_density == 0.5


def test_sparse_sgd_flat_layout_must_not_change():
    sgd = SparseSGD(algorithm="dense", prefix="layout")
    sgd.synchronize([("a", np.ones(3, np.float32))])
    with pytest.raises(ValueError, match="differ from the first step"):
        sgd.synchronize([("a", np.ones(4, np.float32))])
    with pytest.raises(ValueError, match="unique"):
        sgd.synchronize([("a", np.ones(3, np.float32)), ("a", np.ones(3, np.float32))])


# -- torch, one process ------------------------------------------------------------------
def test_distributed_optimizer_wraps_and_schedulers_work():
    torch = pytest.importorskip("torch")
    import autotune.torch as at

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = at.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                  algorithm="gtopk", density=0.5, warmup_steps=1, prefix="p1")
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    before = at.state_digest(model)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        sched.step()
    assert at.state_digest(model) != before
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 3)
    assert opt.sparse_sgd.stats()["sparse_steps"] == 2
    assert opt.state_dict()["state"], "momentum buffers live in the wrapped optimizer's state"
    with pytest.raises(ValueError, match="already"):
        at.DistributedOptimizer(opt)
    # fold_lr follows the scheduler's rate: it needs one rate for all groups
    two = torch.optim.SGD([{"params": model[0].parameters()},
                           {"params": model[2].parameters(), "lr": 0.01}], lr=0.1)
    with pytest.raises(ValueError, match="one learning rate"):
        at.DistributedOptimizer(two, named_parameters=model.named_parameters(), fold_lr=True)
    folded = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                     named_parameters=model.named_parameters(), fold_lr=True,
                                     algorithm="gtopk", density=0.5, prefix="p2")
    sched = torch.optim.lr_scheduler.StepLR(folded, step_size=1, gamma=0.5)
    for _ in range(2):
        folded.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        folded.step()
        sched.step()
    assert folded.sparse_sgd.learning_rate() == at.current_lr(folded) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="one learning rate"):
        at.current_lr(two)   # what a DDP hook's learning_rate callable would hit


def test_distributed_optimizer_needs_every_parameter_named():
    torch = pytest.importorskip("torch")
    import autotune.torch as at

    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.1)
    with pytest.raises(ValueError, match="not in named_parameters"):
        at.DistributedOptimizer(opt, named_parameters=a.named_parameters())
    dup = [("w", p) for p in a.parameters()]
    with pytest.raises(ValueError, match="duplicate"):
        at.DistributedOptimizer(torch.optim.SGD(a.parameters(), lr=0.1), named_parameters=dup)


def test_momentum_correction_with_dense_is_momentum_sgd():
    """Dense steps with momentum correction around plain SGD take exactly the
    steps of SGD with momentum (P = 1: the average is the input); an optimizer
    that has momentum itself is refused."""
    torch = pytest.importorskip("torch")
    import autotune.torch as at

    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    b = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    b.load_state_dict(a.state_dict())
    ref = torch.optim.SGD(a.parameters(), lr=0.05, momentum=0.9)
    with pytest.raises(ValueError, match="momentum=0"):
        at.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.05, momentum=0.9),
                                named_parameters=b.named_parameters(), momentum=0.9)
    opt = at.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.05),
                                  named_parameters=b.named_parameters(), algorithm="dense",
                                  momentum=0.9, prefix="mcdense")
    for _ in range(6):
        x = torch.randn(5, 6)
        for model, o in ((a, ref), (b, opt)):
            o.zero_grad()
            model(x).square().sum().backward()
            o.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_synchronize_then_step_reduces_once():
    torch = pytest.importorskip("torch")
    import autotune.torch as at

    model = torch.nn.Linear(3, 1)
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(), prefix="p2")
    model(torch.randn(2, 3)).sum().backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    assert opt.sparse_sgd.step == 1


def test_hook_signature_accepted_by_ddp_checks():
    torch = pytest.importorskip("torch")
    import inspect

    import autotune.torch as at

    sig = inspect.signature(at.allreduce_hook)
    assert sig.return_annotation == torch.futures.Future[torch.Tensor]
    with pytest.raises(ValueError, match="registered"):
        at.HookState(algorithm="nope")
    for chunk in (0, 2.5, True):
        with pytest.raises(TypeError, match="chunk"):
            at.HookState(chunk=chunk)


# -- under mpiexec -----------------------------------------------------------------------
@pytest.mark.mpi
def test_torch_integrations_keep_replicas_identical(mpirun):
    """One launch (torch's import is most of a launch): DDP (gloo on the MPI
    ranks) + allreduce_hook, every algorithm, several buckets; DistributedOptimizer
    without torch.distributed, every algorithm, flat and per layer;
    broadcast_parameters; bfloat16 and float16 models (flat, per layer, momentum
    correction, the DDP hook): replicas identical, dtypes kept.  At P = 3, an odd
    P; P = 2 runs both integrations end to end in test_examples_write_curves and
    every algorithm in the conformance suite."""
    pytest.importorskip("torch")
    nprocs = 3
    cases = ["ddp", "native", "broadcast", "optimizer", "half"]
    out = mpirun(nprocs, "tests.mpi.torch_checks", "--cases", ",".join(cases), timeout=300)
    assert f"torch_checks P={nprocs}:" in out
    for case in cases:
        assert f"  {case:10s} ok" in out, case


@pytest.mark.mpi
@pytest.mark.parametrize("example,integration", [("digits_cnn", "optimizer"),
                                                 ("lstm_lm", "ddp")])
def test_examples_write_curves(tmp_path, example, integration):
    """The training examples run end to end at P = 2 (a few steps per epoch),
    with momentum correction, a density warm-up and the folded learning
    rate, and write the curves:
    per-epoch loss, the metric and wall time."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    import json

    from autotune.launch import mpiexec_argv

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "curves.json"
    argv = mpiexec_argv(2, [sys.executable, str(root / "examples" / f"{example}.py"),
                            "--algorithm", "gtopk,dense", "--density", "0.05", "--seed", "3",
                            "--epochs", "2", "--max-steps-per-epoch", "3",
                            "--warmup-steps", "2", "--momentum-correction",
                            "--density-warmup", "2", "--fold-lr",
                            "--integration", integration, "--out", str(out)])
    p = support.run(argv, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["P"] == 2 and [r["algorithm"] for r in d["runs"]] == ["gtopk", "dense"]
    metric = "test_acc" if example == "digits_cnn" else "val_loss"
    for r in d["runs"]:
        assert len(r["curve"]) == 2 and r["curve"][-1]["step"] == 6
        for pt in r["curve"]:
            assert {"train_loss", metric, "epoch_s", "wall_s", "bytes_sent"} <= set(pt)
    sparse, dense = d["runs"]
    # 2 dense steps, then 4 sparse ones (2 of them under the density warm-up)
    assert sparse["stats"]["dense_steps"] == 2 and sparse["stats"]["sparse_steps"] == 4
    assert sparse["stats"]["last_algorithm"] == "gtopk"
    assert sparse["final"]["bytes_sent"] < dense["final"]["bytes_sent"]

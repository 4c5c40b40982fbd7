"""The public surface: registry, CLI, allreduce on one process (P = 1)."""
import subprocess
import sys

import numpy as np
import pytest

import autotune
import collectives


def test_registry_has_the_family():
    for name in ("dense", "mpi", "topka", "topkdsa", "gtopk", "gaussiank"):
        assert name in collectives.ALGORITHMS
        assert collectives.ALGORITHMS[name].name == name


def test_cli_help_and_version():
    out = subprocess.run([sys.executable, "-m", "autotune.cli", "--version"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("autotune ")
    out = subprocess.run([sys.executable, "-m", "autotune.cli", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "bench" in out


def test_allreduce_single_process_keeps_type_and_shape():
    x = np.random.default_rng().standard_normal((3, 5)).astype(np.float32)
    out = autotune.allreduce(x, algorithm="dense")
    assert out.shape == x.shape and out.dtype == x.dtype
    np.testing.assert_array_equal(out, x)
    m = autotune.allreduce(x, algorithm="mpi", op="mean")
    np.testing.assert_array_equal(m, x)


def test_sparse_without_name_is_refused():
    x = np.random.default_rng().standard_normal(100).astype(np.float32)
    with pytest.raises(ValueError, match="name"):
        autotune.allreduce(x, algorithm="topka", density=0.1)


def test_unknown_algorithm():
    with pytest.raises(ValueError, match="registered"):
        autotune.allreduce(np.ones(4, np.float32), algorithm="nope")


def test_torch_roundtrip():
    torch = pytest.importorskip("torch")
    t = torch.randn(4, 6)
    out = autotune.allreduce(t, name="t", algorithm="topka", density=0.5)
    assert isinstance(out, torch.Tensor) and out.shape == t.shape and out.dtype == t.dtype


def test_algorithm_options_single_process():
    autotune.init(options={"oktopk": {"residuals": "owner"}})
    try:
        assert autotune.algorithm_instance("oktopk").residuals == "owner"
        with pytest.raises(ValueError, match="unknown algorithms"):
            autotune.init(options={"nope": {}})
        with pytest.raises(ValueError, match="residuals"):
            autotune.init(options={"oktopk": {"residuals": "everyone"}})
        with pytest.raises(TypeError):
            autotune.init(options={"oktopk": {"no_such_option": 1}})
        # a rejected call leaves the options in force
        assert autotune.algorithm_instance("oktopk").residuals == "owner"
    finally:
        autotune.init(options={})
    assert autotune.algorithm_instance("oktopk").residuals == "contributor"


def test_parse_options():
    from autotune.dispatch import parse_options

    assert parse_options(["oktopk.residuals=owner", "oktopk.tau=16", "oktopk.budget=2.0",
                          "oktopk.adaptive_step=True", "topka2a.x=false"]) == \
        {"oktopk": {"residuals": "owner", "tau": 16, "budget": 2.0, "adaptive_step": True},
         "topka2a": {"x": False}}
    for bad in ("oktopk", "residuals=owner", ".tau=1", "oktopk.=1"):
        with pytest.raises(ValueError, match="ALGO.KEY=VALUE"):
            parse_options([bad])


def test_library_talks_on_its_own_communicator():
    from mpi4py import MPI

    comm = autotune.communicator()
    assert comm.comm != MPI.COMM_WORLD
    assert MPI.Comm.Compare(comm.comm, MPI.COMM_WORLD) == MPI.CONGRUENT


def test_init_warns_once_for_a_profile_from_another_machine(tmp_path):
    import json
    import warnings

    from autotune.profile import cpu_model

    data = json.loads(open("profiles/cpu_shm_p4.json").read())
    data["fingerprint"]["cpu_model"] = "Some Other CPU " + str(cpu_model())
    path = tmp_path / "foreign.json"
    path.write_text(json.dumps(data))
    try:
        with pytest.warns(UserWarning, match="another machine"):
            autotune.init(profile=str(path))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            autotune.init(profile=str(path))  # once per profile
    finally:
        autotune.dispatch._CTX.use_profile(None, None)


def test_decisions_print_readably(capsys):
    autotune.init(profile="profiles/cpu_shm_p4.json")
    try:
        x = np.random.default_rng(3).standard_normal(1 << 12).astype(np.float32)
        autotune.allreduce(x, name="readable")
        (key, choice), = [(k, c) for k, c in autotune.decisions().items() if k.name == "readable"]
        assert key.shape == (1 << 12,) and key.P == 1 and key.device == "cpu"
        for text in (str(choice), repr(choice), repr(autotune.decisions())):
            assert "\n" not in text and choice.algorithm in text
        assert "predicted" in str(choice) and "measured" in str(choice)
        autotune.print_decisions()
        line, = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("readable")]
        assert choice.algorithm in line and "P=1" in line
    finally:
        autotune.dispatch._CTX.use_profile(None, None)


def test_choose_without_a_tensor_is_what_resolve_decides():
    """dispatch.choose(n) (autotune.torch.register's question for a whole model): the
    decision resolve() makes for a tensor of that size, not cached."""
    autotune.init(profile="profiles/cpu_tcp1gbit_p4.json")
    try:
        for n, name in ((1 << 12, "small"), (1 << 22, "large"), (1 << 22, None)):
            choice = autotune.dispatch.choose(n, name=name, density=0.01)
            x = np.zeros(n, np.float32)
            assert choice.algorithm == autotune.dispatch.resolve(x, name=name,
                                                                  density=0.01).algorithm
        assert not collectives.ALGORITHMS[autotune.dispatch.choose(1 << 22, name=None).algorithm].lossy
        before = len(autotune.decisions())
        autotune.dispatch.choose(1 << 20, name="not.cached")
        assert len(autotune.decisions()) == before
    finally:
        autotune.dispatch._CTX.use_profile(None, None)

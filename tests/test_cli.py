"""The command line: ``autotune launch``, option checks and help, ``tune``'s
comparison with the exact algorithms, the profiler's progress under mpiexec,
and the agreement of every rank's arguments."""
import argparse
import io
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autotune import cli, launch as launcher
from autotune.launch import mpiexec_argv, mpmd_argv
from support import run

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "profiles"

RANKS_SCRIPT = """\
import sys
from mpi4py import MPI
w = MPI.COMM_WORLD
print(f"rank {w.rank} of {w.size} args {sys.argv[1:]}", flush=True)
if len(sys.argv) > 2 and sys.argv[1] == "fail-on":
    if w.rank == int(sys.argv[2]):
        sys.exit(int(sys.argv[3]))
"""


def _cli(*args, cwd=ROOT, timeout=60):
    return run([sys.executable, "-m", "autotune.cli", *args], cwd=cwd, timeout=timeout)


def _failed_job(cmd, cwd=ROOT):
    """A job whose rank fails on purpose: Open MPI 5.0.11's mpiexec (prterun) now and
    then dies of SIGSEGV (139) or never exits as it ends such a job (BENCHMARKS,
    "Performance regression tracking"); that, and only that, is tried once more."""
    for attempt in (1, 2):
        try:
            p = run(cmd, cwd=cwd, timeout=30)  # such a job ends in 1-5 s
        except subprocess.TimeoutExpired:
            if attempt == 2:
                raise
            continue
        if p.returncode != 139 or attempt == 2:
            return p


def _ranks(stdout: str) -> list[str]:
    return sorted(line for line in stdout.splitlines() if line.startswith("rank "))


# -- 1. the launcher -----------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])  # 3: more ranks than this 2-core machine's cores
def test_launch_runs_a_script_on_every_rank(tmp_path, nprocs):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    # the script's own options (even ones launch has) go to the script
    p = _cli("launch", "-n", str(nprocs), str(script), "-n", "7", "-m", "x")
    assert p.returncode == 0, p.stderr
    assert _ranks(p.stdout) == [f"rank {r} of {nprocs} args ['-n', '7', '-m', 'x']"
                                for r in range(nprocs)]


@pytest.mark.mpi
def test_launch_runs_a_module(tmp_path):
    (tmp_path / "ranks_mod.py").write_text(RANKS_SCRIPT)
    p = _cli("launch", "--np", "2", "-m", "ranks_mod", "--flag", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert _ranks(p.stdout) == [f"rank {r} of 2 args ['--flag']" for r in range(2)]


@pytest.mark.mpi
def test_launch_passes_the_exit_status_through(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    p = _failed_job([sys.executable, "-m", "autotune.cli", "launch", "-n", "2", str(script),
                     "fail-on", "1", "3"])
    assert p.returncode == 3 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    # the public API alike
    p = _failed_job([sys.executable, "-c", "import sys; from autotune.launch import launch; "
                     f"sys.exit(launch(2, [{str(script)!r}, 'fail-on', '0', '5']))"])
    assert p.returncode == 5 and "rank 0 of 2" in p.stdout, (p.returncode, p.stderr)


@pytest.mark.mpi
def test_launch_leaves_out_ofi_unless_the_caller_chooses(tmp_path):
    """Ranks of one host start without the OFI byte-transfer layer (its start cost
    1 s a job here); a caller's own OMPI_MCA_btl is kept as it is."""
    script = tmp_path / "btl.py"
    script.write_text("import os\nfrom mpi4py import MPI\n"
                      "print('rank', MPI.COMM_WORLD.rank, 'btl', os.environ.get('OMPI_MCA_btl'))\n")
    cmd = [sys.executable, "-m", "autotune.cli", "launch", "-n", "2", str(script)]
    for btl, expect in ((None, "^ofi"), ("self,sm,tcp", "self,sm,tcp")):
        env = {k: v for k, v in os.environ.items() if k != "OMPI_MCA_btl"}
        p = subprocess.run(cmd, env=env | ({"OMPI_MCA_btl": btl} if btl else {}), cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert _ranks(p.stdout) == [f"rank {r} btl {expect}" for r in range(2)], p.stdout
    assert launcher.one_host_env({"OMPI_MCA_btl": "tcp,self"}) == {"OMPI_MCA_btl": "tcp,self"}
    assert launcher.one_host_env({}) == launcher.ONE_HOST_MCA


def test_launch_ends_the_job_when_one_rank_raises(tmp_path):
    """An exception nobody catches on one rank aborts every rank (the launcher runs
    ``python -m mpi4py``), where a plain ``python`` would leave the others waiting in
    a collective until killed."""
    script = tmp_path / "one_raises.py"
    script.write_text("from mpi4py import MPI\n"
                      "if MPI.COMM_WORLD.Get_rank() == 1:\n"
                      "    raise ValueError('bad input on rank 1')\n"
                      "MPI.COMM_WORLD.Barrier()\n")
    t0 = time.monotonic()
    p = _cli("launch", "-n", "3", str(script), timeout=60)
    assert p.returncode != 0 and "bad input on rank 1" in p.stderr
    assert time.monotonic() - t0 < 30


def test_mpiexec_argv_and_env(monkeypatch):
    exe = launcher.find_mpiexec()
    monkeypatch.setattr(launcher.os, "geteuid", lambda: 1000)
    assert mpiexec_argv(2, ["prog"]) == [exe, "--oversubscribe", "-n", "2", "prog"]
    assert mpiexec_argv(3, ["prog", "a"], oversubscribe=False) == [exe, "-n", "3", "prog", "a"]
    assert mpiexec_argv(2, ["prog"], env={"X_EXTRA": "1"}) == [
        exe, "--oversubscribe", "-x", "X_EXTRA=1", "-n", "2", "prog"]
    assert mpmd_argv([(1, ["a", "1"]), (2, ["b"])]) == [
        exe, "--oversubscribe", "-n", "1", "a", "1", ":", "-n", "2", "b"]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="ranks"):
            mpiexec_argv(bad, ["prog"])
    monkeypatch.setattr(launcher.os, "geteuid", lambda: 0)  # root: allowed by an option
    assert mpiexec_argv(2, ["prog"])[:3] == [exe, "--allow-run-as-root", "--oversubscribe"]
    assert mpmd_argv([(1, ["a"])])[:2] == [exe, "--allow-run-as-root"]


def test_launch_splits_its_options_from_the_program():
    split = cli._split_launch
    assert split(["-n", "2", "s.py", "-n", "3"]) == (["-n", "2"], ["s.py", "-n", "3"])
    assert split(["--np=2", "-m", "pkg.mod", "-m", "x"]) == (["--np=2", "-m", "pkg.mod"],
                                                             ["-m", "x"])
    assert split(["-n2", "--", "-weird.py"]) == (["-n2"], ["-weird.py"])


# -- 2. option checks and help --------------------------------------------------------------
SHM4 = str(PROFILES / "cpu_shm_p4.json")

BAD = [
    ("select", ["--profile", SHM4, "--n", "1024", "--P", "4", "--density", "0"], "--density"),
    ("select", ["--profile", SHM4, "--n", "1024", "--P", "4", "--density", "2"], "--density"),
    ("select", ["--profile", SHM4, "--n", "1024", "--P", "4", "--density", "nan"], "--density"),
    ("select", ["--profile", SHM4, "--n", "0", "--P", "4"], "--n"),
    ("select", ["--profile", SHM4, "--n", "1e3", "--P", "4"], "--n"),
    ("select", ["--profile", SHM4, "--n", "1024", "--P", "0"], "--P"),
    ("select", ["--n", "1024", "--P", "4"], "--profile"),
    ("tune", ["--profile", SHM4, "--n", "1024", "--P", "-2"], "--P"),
    ("tune", ["--profile", SHM4, "--n", "1024", "--P", "4", "--density-min", "0"],
     "--density-min"),
    ("tune", ["--profile", SHM4, "--n", "1024", "--P", "4", "--density-max", "1.5"],
     "--density-max"),
    ("tune", ["--profile", SHM4, "--n", "1024", "--P", "4", "--density-min", "0.2",
              "--density-max", "0.1"], "--density-min 0.2 is above --density-max 0.1"),
    ("tune", ["--profile", SHM4, "--n", "1024", "--P", "4", "--xi-max", "0"], "--xi-max"),
    ("tune", ["--profile", SHM4, "--n", "1024", "--P", "4", "--capture-min", "1.1"],
     "--capture-min"),
    ("tune", ["--profile", SHM4, "--n", "1024", "--P", "4", "--tau-prime-max", "0"],
     "--tau-prime-max"),
    ("tune", ["--profile", SHM4, "--n", "1024", "--P", "4", "--trials", "0"], "--trials"),
    ("tune", ["--profile", SHM4, "--n", "1024", "--P", "4", "--seed", "-1"], "--seed"),
    ("tune", ["--profile", SHM4, "--n", "1024", "--P", "4", "--algorithm", "dense"],
     "sparse algorithm"),
    ("bench", ["--log2n", "24:16"], "--log2n"),
    ("bench", ["--log2n", "16-24"], "--log2n"),
    ("bench", ["--log2n", "0:40"], "--log2n"),
    ("bench", ["--sizes", "3001,x"], "--sizes"),
    ("bench", ["--sizes", "0"], "--sizes"),
    ("bench", ["--density", "0"], "--density"),
    ("bench", ["--repeat", "0"], "--repeat"),
    ("bench", ["--warmup", "-1"], "--warmup"),
    ("bench", ["--gap-ms", "-5"], "--gap-ms"),
    ("bench", ["--gap-ms", "inf"], "--gap-ms"),
    ("bench", ["--np", "0"], "--np"),
    ("profile", ["--np", "two"], "--np"),
    ("profile", ["--max-bytes", "lots"], "--max-bytes"),
    ("profile", ["--max-bytes", "1.2.3M"], "--max-bytes"),
    ("profile", ["--max-bytes", "16"], "--max-bytes"),
    ("profile", ["--seed", "-3"], "--seed"),
    ("launch", ["-n", "0", "x.py"], "--np"),
    ("launch", ["-n", "2"], "script"),
]


@pytest.mark.parametrize("cmd,args,says", BAD, ids=[f"{c}{'_'.join(a[-2:])}" for c, a, _ in BAD])
def test_bad_values_exit_2_with_one_line(capsys, cmd, args, says):
    with pytest.raises(SystemExit) as e:
        cli.main([cmd, *args])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"autotune {cmd}: error: "), err
    assert says in lines[0] and "Traceback" not in err and not out


def test_density_zero_is_one_line_not_a_traceback():
    """The issue's case: it ended in a math-domain traceback."""
    p = _cli("select", "--profile", SHM4, "--n", "1024", "--P", "4", "--density", "0")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == [
        "autotune select: error: argument --density: must be in (0, 1], got 0 "
        "(see autotune select --help)"]


def test_good_values_parse():
    p = cli.build_parser()
    a = p.parse_args(["bench", "--log2n", "20", "--warmup", "0", "--gap-ms", "0",
                      "--density", "1"])
    assert (a.log2n, a.warmup, a.density) == ("20:20", 0, 1.0)
    assert p.parse_args(["bench", "--sizes", "3001, 250007"]).sizes == "3001,250007"
    a = p.parse_args(["profile", "--max-bytes", "64KiB", "--np", "2"])
    assert a.max_bytes == "64KiB" and a.np == 2


def _parsers(parser):
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_option_of_every_command_has_help():
    parser = cli.build_parser()
    seen = set()
    for prog, p in _parsers(parser):
        seen.add(prog)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                names = [c.dest for c in action._choices_actions]
                assert set(names) == set(action.choices), prog  # every command has help
                assert all(c.help for c in action._choices_actions), prog
                continue
            name = action.option_strings or [action.dest]
            assert action.help and action.help != argparse.SUPPRESS, (prog, name)
        p.format_help()  # every %(default)s and %% renders
    assert {f"autotune {c}" for c in ("launch", "bench", "profile", "show", "plot", "select",
                                      "tune")} <= seen
    quick = cli.build_parser().commands["profile"].format_help()
    assert "about a minute" not in quick and "15 s" in quick


# -- 3. tune against the exact algorithms ------------------------------------------------------
def _tune_out(capsys, profile, n, P):
    assert cli.main(["tune", "--profile", str(PROFILES / profile), "--n", str(n), "--P", str(P),
                     "--trials", "8"]) == 0
    return capsys.readouterr().out


def test_tune_says_when_sparse_does_not_pay(capsys):
    pytest.importorskip("optuna")
    from autotune.profile import Profile
    from autotune.selector import Selector

    out = _tune_out(capsys, "cpu_shm_p4.json", 1 << 24, 4)
    exact = Selector(Profile.load(PROFILES / "cpu_shm_p4.json").data).choose(
        1 << 24, 4, lossy_ok=False)
    m = re.search(r"best exact algorithm: (\w+), predicted ([0-9.]+) ms", out)
    assert m and m[1] == exact.algorithm == "dense", out
    assert float(m[2]) == pytest.approx(1e3 * exact.predicted_s["dense"], abs=1e-3)
    tuned = float(re.search(r"oktopk n=16777216 P=4: .* predicted ([0-9.]+) ms", out)[1])
    assert tuned > float(m[2])
    assert "sparse does not pay on this profile" in out and "algorithm='dense'" in out


def test_tune_says_when_sparse_pays(capsys):
    pytest.importorskip("optuna")
    out = _tune_out(capsys, "cpu_tcp1gbit_p4.json", 1 << 24, 4)
    assert re.search(r"best exact algorithm: \w+, predicted [0-9.]+ ms", out), out
    assert "sparse pays: oktopk is predicted" in out
    assert "use: autotune.allreduce(tensor, name=..., algorithm='oktopk'" in out


# -- 4. progress ------------------------------------------------------------------------------
class _Rank:
    def __init__(self, rank):
        self.rank = rank


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_lines_off_a_terminal():
    from autotune.profiler import _Progress

    clock, s = _Clock(), io.StringIO()
    p = _Progress(_Rank(0), 10, stream=s, clock=clock)
    assert s.getvalue() == "autotune profile: [0/10]   0%    0.0 s  starting\n"
    for i in range(9):
        clock.t += 0.5
        p.step(f"step {i + 1}")
    lines = s.getvalue().splitlines()
    # the start, then at most one line per 2 s: after steps 4 and 8 (2 s and 4 s)
    assert [ln.split("]")[0] for ln in lines] == ["autotune profile: [0/10",
                                                   "autotune profile: [4/10",
                                                   "autotune profile: [8/10"]
    assert lines[1] == "autotune profile: [4/10]  40%    2.0 s  step 4"
    p.close()  # step 9 was held back: written at the end
    assert s.getvalue().splitlines()[-1] == "autotune profile: [9/10]  90%    4.5 s  step 9"
    for quiet, rank in ((True, 0), (False, 1)):
        s = io.StringIO()
        p = _Progress(_Rank(rank), 10, quiet, stream=s)
        p.step("x")
        p.close()
        assert s.getvalue() == ""


def test_progress_is_a_bar_on_a_terminal():
    from autotune.profiler import _Progress

    clock, s = _Clock(), _Tty()
    p = _Progress(_Rank(0), 4, stream=s, clock=clock)
    for i in range(4):
        clock.t += 1
        p.step(f"s{i}")
    assert "\n" not in s.getvalue() and s.getvalue().count("\r") == 5
    assert "|####################| [4/4] 100%" in s.getvalue()
    p.close()
    assert s.getvalue().endswith("\n")


@pytest.mark.mpi
def test_profile_progress_arrives_while_it_runs(tmp_path):
    """Under mpiexec (stderr a pipe) the progress lines come as it runs, not at the end."""
    out = tmp_path / "p2.json"
    with open(tmp_path / "stdout", "w+") as so:
        proc = subprocess.Popen([sys.executable, "-m", "autotune.cli", "profile", "--np", "2",
                                 "--sizes", "tiny", "--out", str(out)], cwd=ROOT,
                                stdout=so, stderr=subprocess.PIPE, text=True)
        arrivals = []

        def read():
            for line in proc.stderr:
                arrivals.append((time.monotonic(), line.rstrip("\n")))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        ended = time.monotonic()
        reader.join(10)
        so.seek(0)
        stdout = so.read()
    progress = [(t, ln) for t, ln in arrivals if ln.startswith("autotune profile: [")]
    assert proc.returncode == 0 and out.exists(), (stdout, arrivals)
    assert len(progress) >= 2, arrivals
    # the first line came as the measuring began (~1.5 s of it on an idle 2-core machine),
    # not with the rest at the end
    assert progress[-1][0] - progress[0][0] > 0.5 and ended - progress[0][0] > 0.5, arrivals
    done, total = map(int, re.search(r"\[(\d+)/(\d+)\]", progress[-1][1]).groups())
    assert done == total > 10


# -- 5. every rank must get the same arguments --------------------------------------------------
BENCH = [sys.executable, "-m", "autotune.cli", "bench", "--algorithms", "mpi", "--repeat", "1",
         "--warmup", "0"]


def _two_ranks(argv0, argv1) -> subprocess.CompletedProcess:
    """One job of two ranks, rank 0 running ``argv0`` and rank 1 ``argv1``."""
    return run(mpmd_argv([(1, argv0), (1, argv1)]), timeout=60)


@pytest.mark.mpi
def test_ranks_with_different_arguments_all_fail_alike():
    p = _two_ranks(BENCH + ["--log2n", "10:10"], BENCH + ["--log2n", "11:11"])
    assert p.returncode == 2, (p.stdout, p.stderr)
    msg = ('autotune bench: error: every rank must be started with the same arguments, but rank 1 '
           'has --log2n "11:11" where rank 0 has "10:10"')
    assert p.stderr.splitlines().count(msg) == 2, p.stderr  # one line from each rank
    assert "Traceback" not in p.stderr and "median ms" not in p.stdout


@pytest.mark.mpi
def test_a_different_command_on_one_rank_does_not_hang():
    p = _two_ranks(BENCH + ["--log2n", "10"], [sys.executable, "-m", "autotune.cli", "--version"])
    assert p.returncode != 0 and "rank(s) 1 printed help or the version" in p.stderr, p.stderr


@pytest.mark.mpi
def test_a_bad_value_on_one_rank_does_not_hang():
    p = _two_ranks(BENCH + ["--log2n", "10"], BENCH + ["--log2n", "10", "--density", "0"])
    assert p.returncode == 2 and "argument --density: must be in (0, 1]" in p.stderr
    assert "Traceback" not in p.stderr

"""The regression gate's mechanism against a deliberate slowdown (issue #22).

Real timed runs of ``python -m tests.benchmarks`` at the timed sizes, into a
temporary baseline folder, on one kernel (``threshold_select``) and one
collective (``gtopk``, under mpiexec at P = 2), selected with ``-k``:

  1. ``--save``: record a baseline, then the confirming compare (an unchanged
     run) must pass;
  2. the same compare with ``--bench-slowdown kernels.threshold_select=2.5
     --bench-slowdown collectives.gtopk=2.5`` (conftest.py: each call of that
     kernel / of that algorithm is followed by a busy wait of 1.5x its own
     duration, a test-only hook of this folder) must fail, naming exactly
     those two benchmarks.  ``--retries 0``: the slowdown has to show in one
     run (a compare re-runs what fails, by default twice, to wait out bursts
     of noise; a real slowdown fails each time).

Both compares run at ``--fail min:50%`` and ``--rounds 50``, not the default
+15% and 200 rounds: this case tests that the gate records, re-runs, keeps the
faster run and names exactly what slowed, with a margin on both sides of the
limit that CI's 2-core VMs keep.  On 2026-11-29's Intel VM, unchanged
compares (8 runs, no retries) read 0.98-1.04 (threshold_select) and 0.85-1.21
(gtopk); the 2.5x slowdown read 1.81-2.42 (6 runs).  How small a slowdown
the default +15% catches is a property of the machine, measured and kept in
docs/BENCHMARKS.md ("Performance regression tracking"), not asserted here: at
+15% a 30% slowdown of these two failed in every one of 9 runs on 2026-11-27's
AMD EPYC VM, and went unseen in 1 of 5 runs (plus once in CI) on 2026-11-29's
Intel Xeon VM.

Noise, and the default threshold chosen from it.  Measured on the 2-core CPU
machine (AMD EPYC family 25 model 17 under KVM, Python 3.11, Open MPI 5 from the
wheel), 2026-11-27 16:05-16:45 UTC, with other agents' test runs on the same 2
cores most of the time (1-minute load average 1-12).  Spread = the largest
ratio between two runs of unchanged code (max/min over consecutive full runs
of ``python -m tests.benchmarks --save --no-confirm``) of the ratio the gate
uses (benchmark over its reference, on its statistic).  The final setup, 5 runs
at load 7-8 (in brackets: earlier sets of 6-10 runs with the same references):

  host   kth_magnitude 1.03, topk_indices 1.04, topk_select 1.07, coo_sum 1.01,
         threshold_select 1.10 (1.03-1.08), gaussian_select 1.19 (1.06-1.11),
         to_dense (median) 1.04, scatter_add (median) 1.26 (1.07-1.20),
         selector decisions 1.01-1.03, training 1.14 (1.06-1.11)
  mpi    topka 1.07, topkdsa 1.06, gaussiank 1.07, topka2a 1.09,
         gtopk 1.10 (1.03-1.04), oktopk (median) 1.15, dense 1.30 (1.16);
         the native allreduce's own median 1.55 (gated at +100% only)

What did not work, on the same machine: wall time (kernels' min 1.02-2.0:
topk_indices 14.4 vs 29.1 ms a minute apart; collectives' medians relative to
the native allreduce 1.5-13.6, ranks preempted at load 11), 50 rounds instead
of 200 (to_dense's and sampled_threshold's fastest rounds 1.3-1.46), glibc's
moving mmap threshold (the native allreduce 1.2 <-> 2.5-5 ms depending on what
the process freed before), the native allreduce as the reference of the sparse
algorithms (1.3-1.6: it is bimodal on this VM, they are selection-bound) and a
memory pass timed as a separate benchmark instead of inside each benchmark's
rounds (1.6-2.0: a 16 MiB copy alone is half cache-resident).

So +15% by default: above the spread of most benchmarks in one run, and a
compare re-runs what fails (twice by default) and fails only what fails every
time, and ``--save`` keeps the faster of the recording and the confirming run
per benchmark.  The case takes about 15 s on the 2-core machine, with no
other case beside it (marked ``quiet``, tests/conftest.py).
"""
from __future__ import annotations

import re

import pytest

from autotune.launch import under_mpi
from support import bench_tool as tool

KERNEL, ALGORITHM = "threshold_select", "gtopk"
SELECT = f"{KERNEL} and not ef or {ALGORITHM}-"
FACTOR, LIMIT = 2.5, "min:50%"  # the slowdown injected, the gate's limit in both compares

pytestmark = [pytest.mark.mpi, pytest.mark.quiet,
              pytest.mark.skipif(under_mpi(), reason="launches its own mpiexec")]


def failures(out: str) -> list[str]:
    """The lines of the tool's closing FAILED: list."""
    if "\nFAILED:\n" not in out:
        return []
    return [line.strip() for line in out.split("\nFAILED:\n", 1)[1].splitlines() if line.strip()]


def test_gate_names_exactly_the_slowed_kernel_and_algorithm(tmp_path):
    common = ["--machine", "ci-gate", "--storage", str(tmp_path), "--suites", "host,mpi",
              "--np", "2", "--fail", LIMIT, "--rounds", "50"]
    select = ["--", "-k", SELECT, "--color=no"]

    rc, out = tool(*common, "--save", *select)  # record, then an unchanged compare
    assert rc == 0, out[-6000:]
    assert "baseline recorded for" in out
    saved = sorted(p.name for p in tmp_path.glob("ci-gate/*/*/*.json"))
    assert [n.split("_", 1)[1] for n in saved] == ["host.json", "mpi-p2.json"], saved

    rc, out = tool(*common, "--retries", "0", *select,
                   "--bench-slowdown", f"kernels.{KERNEL}={FACTOR}",
                   "--bench-slowdown", f"collectives.{ALGORITHM}={FACTOR}")
    assert rc == 1, out[-6000:]
    failed = failures(out)
    print("\n".join(failed))  # shown with -s / -rP
    assert len(failed) == 2, failed
    assert re.match(rf"suite host: test_{KERNEL}\[numpy\] min \d\.\d\dx the baseline relative",
                    failed[0]), failed
    assert re.match(rf"suite mpi: test_allreduce\[{ALGORITHM}-P2-\S+\] min \d\.\d\dx the "
                    "baseline relative", failed[1]), failed

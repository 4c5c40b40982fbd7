"""Scripts in benchmarks/ that have no test module of their own (in process, no MPI:
launching ranks costs more than these checks are worth)."""
import pytest


def test_train_step_table_and_issue_checks():
    """benchmarks/train_step.py: the markdown table and issue #25's checks from results."""
    pytest.importorskip("torch")
    from benchmarks import train_step

    def result(network, ms, picks=()):
        variants = {v: {"median_ms": t, "vs_ddp": t / ms["ddp"], "identical": v != "at:gtopk"}
                    for v, t in ms.items()}
        variants["at:auto"]["auto_decisions"] = {f"b{i}": {"algorithm": a}
                                                 for i, a in enumerate(picks)}
        return {"network": network, "P": 2, "params": 216_855_808, "profile": "p.json",
                "machine": {"device": "NVIDIA H200"}, "variants": variants,
                "config": {"layers": 12, "d_model": 1024, "vocab": 32000, "batch": 16,
                           "seq": 128, "amp": False, "density": 0.01, "steps": 30, "rounds": 2}}

    sockets = result("sockets", {"compute": 58, "ddp": 300, "powersgd1": 85, "at:nccl": 320,
                                 "at:topka": 70, "at:gtopk": 90, "at:auto": 72},
                     picks=["topka"] * 3)
    nvlink = result("nvlink", {"compute": 58, "ddp": 63, "at:nccl": 64, "at:topka": 80,
                               "at:gtopk": 90, "at:auto": 70}, picks=["nccl", "nccl"])
    nvlink["variants"]["compute"]["backward_median_ms"] = 16.9
    nvlink["variants"]["at:nccl"]["backward_median_ms"] = 30.1
    text = train_step.table([sockets, nvlink])
    lines = text.splitlines()
    assert lines[2] == "| variant | nvlink P=2 | sockets P=2 |"   # NVLink first
    assert "| ddp | 63.0 ms (1.00x) | 300.0 ms (1.00x) |" in lines
    assert "| powersgd1 | - | 85.0 ms (0.28x) |" in lines
    assert "- nvlink P=2: at:auto picked nccl x2 (profile p.json)" in lines
    assert "- sockets P=2: replicas NOT bitwise identical after at:gtopk" in lines
    assert "- nvlink P=2: backward() on the host, rank 0, median ms: compute 16.9, at:nccl 30.1" \
        in lines
    assert not any("sockets P=2: backward()" in ln for ln in lines)   # not measured there
    checks = [ln for ln in lines if "PASS" in ln or "FAIL" in ln]
    assert checks == [
        "- nvlink P=2: PASS at:nccl 1.016x ddp (<= 1.05)",
        "- nvlink P=2: FAIL at:auto 1.111x ddp (<= 1.05)",
        "- nvlink P=2: FAIL at:auto 1.094x the best hook at:nccl (<= 1.05)",
        "- sockets P=2: PASS best sparse hook at:topka 1.21x compute (<= 1.3)",
        "- sockets P=2: PASS at:topka 70.0 ms faster than powersgd1 85.0 ms",
        "- sockets P=2: PASS at:auto 1.029x the best hook at:topka (<= 1.05)"]

    # --interleave: ratios are paired step by step (here the median of the ratios, 1.25,
    # is not the ratio of the medians, 1.0), and the table says so
    paired = result("nvlink", {"compute": 40, "ddp": 40, "at:nccl": 40, "at:auto": 40})
    paired["interleaved"] = True
    paired["variants"]["ddp"]["step_ms"] = [40, 40, 40, 50, 50]
    paired["variants"]["at:nccl"]["step_ms"] = [50, 50, 50, 40, 40]
    paired["variants"]["at:auto"]["step_ms"] = [40, 40, 40, 50, 50]
    text = train_step.table([paired])
    assert "interleaved step by step (x: paired)" in text
    assert "- nvlink P=2: FAIL at:nccl 1.250x ddp (<= 1.05)" in text
    assert "- nvlink P=2: PASS at:auto 1.000x ddp (<= 1.05)" in text

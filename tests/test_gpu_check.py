"""scripts/gpu_check.sh dry-run on the CPU (``DEVICE=cpu``): every step it runs on a GPU runs here at toy sizes,
through the same command lines, and writes its result file as it ends; one scheme, one DDP configuration
(gloo), one fp16 overflow run, the fp32 speed benchmark."""
import json
import re
import subprocess
import sys

import pytest

from conftest import REPO, cli_env


@pytest.mark.slow
def test_gpu_check_dry_run_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_out"
    env = cli_env()
    # the dry run's defaults (toy sizes, fp32, CPU time limits), one scheme
    env.update(DEVICE="cpu", OUT=str(out), PYTHON=sys.executable, SCHEMES="resi_dual")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:]
    steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
    assert [s[0] for s in steps] == ["device", "ddp", "precision", "overflow", "bench_fp32"]
    assert all(rc == "0" for _, rc, _ in steps), steps

    device = json.loads((out / "device.json").read_text())["results"]
    assert set(device) == {"resi_dual"} and device["resi_dual"]["passed"], device
    ddp = json.loads((out / "ddp.json").read_text())
    assert ddp["complete"] and ddp["results"]["resi_dual"]["legacy_ddp"]["ranks_equal"]
    precision = json.loads((out / "precision.json").read_text())["results"]["resi_dual"]["2"]
    assert precision["init"]["peak"] > 0 and precision["trained"]["peak"] > 0, precision
    overflow = json.loads((out / "overflow.json").read_text())["results"]["resi_dual"]
    assert [r["update"] for r in overflow] == [1, 2] and all(r["forward_peak"] > 0 for r in overflow), overflow
    bench = json.loads((out / "bench_fp32.json").read_text())
    assert "resi_dual" in json.dumps(bench)
    assert "resi_dual" in (out / "summary.txt").read_text()


@pytest.mark.slow
def test_gpu_ranking_dry_run_on_the_cpu(tmp_path, corpus_head):
    """scripts/gpu_ranking.sh at toy sizes on the CPU: Pre-LN at the rate the committed CPU ranking chose, two
    growing budgets, each with its ranking written before the next (the second continues the first's cell)."""
    sys.path.insert(0, str(REPO / "scripts"))
    from residual_studies.claims import chosen_rates

    out = tmp_path / "ranking"
    env = cli_env()
    env.update(DEVICE="cpu", OUT=str(out), PYTHON=sys.executable, SCHEMES="pre_ln",
               EXTRA=f"--heads 2 --vocab-size 200 --bleu-sentences 5 --max-tokens 512 --warmup 3 "
                     f"--data {corpus_head(300, 20, 20)}")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_ranking.sh")], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert [line.split("\t")[:2] for line in (out / "budgets.tsv").read_text().splitlines()] == [["2", "0"],
                                                                                                ["4", "0"]]
    assert "2 updates per cell" in (out / "ranking-u2.md").read_text()
    assert "4 updates per cell" in (out / "ranking-u4.md").read_text()
    saved = json.loads((out / "ranking.json").read_text())
    (row,) = saved["rows"]
    condition, committed = chosen_rates(REPO / "docs" / "results" / "2026-12-04-ranking" / "ranking.json")
    assert row["row"] == "pre_ln" and row["lr"] == committed["pre_ln"] and row["seeds"] == 1
    assert saved["condition"] == condition == "warm12"
    (cell,) = saved["cells"]
    assert cell["settings"]["width"] == 16 and cell["settings"]["lr"] == committed["pre_ln"]
    assert len(list((out / "cells").iterdir())) == 1  # the larger budget continued the same cell


def test_the_default_step_limits_fit_ten_minutes():
    """The per-step limits of a default run (3 dtypes) add up to at most the shared budget, and the budget
    leaves 30 s of the 600 for the summary and the kill grace of a step cut short."""
    text = (REPO / "scripts" / "gpu_check.sh").read_text()
    value = {m.group(1): int(m.group(2)) for m in re.finditer(r'^(\w+)="\$\{\1:-(\d+)\}"', text, re.M)}
    limits = value["DEVICE_S"] + value["DDP_S"] + value["PREC_S"] + value["OVERFLOW_S"] + 3 * value["SPEED_S"]
    assert limits <= value["BUDGET_S"] <= 570, (limits, value["BUDGET_S"])

"""Smoke test of the speed benchmark (``scripts/speed_benchmark.py`` -> ``residual_studies.speed``).

Runs the benchmark in this process on the ``tiny`` shape (2+2 layers, width 64) with one repetition and
checks the JSON it writes: every model present, positive throughputs and memory, the ratios and goals of the
plugin models against the right stock baselines, and the goals' verdicts against their targets. No timing
assertions: the machine is shared.
"""
import contextlib
import io
import json
import logging
import math
import statistics
import warnings

import pytest

from fairseq_residual.schemes import SCHEME_NAMES, SCHEMES
from residual_studies import speed
from residual_studies.speed_compare import GOALS, goals_text

pytestmark = pytest.mark.slow

MODELS = ("transformer_post_ln", "transformer_pre_ln") + SCHEME_NAMES  # every registered scheme
# each scheme races the stock transformer it builds on (``builds_on``; not its own normalize_before: Peri-LN,
# Mix-LN, ... build on Pre-LN without fairseq's Pre-LN flag)
BASELINES = {s.name: "transformer_pre_ln" if s.builds_on == "pre_ln" else "transformer_post_ln" for s in SCHEMES}
assert BASELINES["post_ln"] == "transformer_post_ln" and BASELINES["pre_ln"] == "transformer_pre_ln"
assert BASELINES["resi_dual"] == "transformer_post_ln"


def _positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "results.json"
    argv = ["--device", "cpu", "--shapes", "tiny", "--repeats", "1", "--warmup", "0", "--threads", "1",
            "--batch-tokens", "128", "--gen-sentences", "2", "--gen-len", "4", "--out", str(out), "--quiet"]
    stdout = io.StringIO()
    filters = list(warnings.filters)
    with contextlib.redirect_stdout(stdout):
        speed.main(argv)
    # the benchmark quiets logging and warnings while it runs, and gives them back
    assert logging.root.manager.disable == logging.NOTSET and warnings.filters == filters
    with open(out) as f:
        return json.load(f), stdout.getvalue()


def test_json_has_every_model_with_positive_numbers(run):
    results, _ = run
    meta = results["meta"]
    assert meta["device"] == "cpu" and meta["dtype"] == "fp32" and meta["threads"] == 1
    assert meta["complete"] is True
    assert "profiler" in meta["memory_measure"]  # says what the CPU memory number is
    assert list(results["shapes"]) == ["tiny"]
    res = results["shapes"]["tiny"]
    assert set(res["models"]) == set(MODELS)
    assert res["batch"]["target_tokens"] > 0 and res["generation"]["beam"] == 5
    for name, m in res["models"].items():
        assert m["params"] > 0, name
        for key in ("train_tokens_per_s", "train_tokens_per_s_wall", "gen_sentences_per_s",
                    "gen_sentences_per_s_wall", "peak_train_mem_bytes"):
            assert m[key]["n"] == 1, (name, key)
            assert _positive(m[key]["median"]), (name, key, m[key])
            assert all(_positive(v) for v in m["samples"][key]), (name, key)
        # memory = parameters + Adam state (3 x 4 bytes per parameter) + the step's peak
        assert m["peak_train_mem_bytes"]["median"] > 12 * m["params"], name


def test_models_are_the_right_ones(run):
    res = run[0]["shapes"]["tiny"]["models"]
    assert res["transformer_post_ln"]["arch"] == "transformer"
    assert res["transformer_post_ln"]["normalize_before"] is False
    assert res["transformer_pre_ln"]["normalize_before"] is True
    for scheme in ("post_ln", "pre_ln", "resi_dual"):
        assert res[scheme]["arch"] == "residual_transformer"
        assert res[scheme]["residual_scheme"] == scheme
    assert res["resi_dual"]["resi_dual_scale"] == 1.0
    # same shape: post_ln has stock Post-LN's parameters; pre_ln and resi_dual add the two final LNs
    assert res["post_ln"]["params"] == res["transformer_post_ln"]["params"]
    assert res["pre_ln"]["params"] == res["transformer_pre_ln"]["params"]
    assert res["resi_dual"]["params"] == res["transformer_post_ln"]["params"] + 2 * 2 * 64


def test_ratios_and_goals(run):
    results, stdout = run
    res = results["shapes"]["tiny"]
    assert set(res["ratios"]) == set(BASELINES)
    for name, base in BASELINES.items():
        r = res["ratios"][name]
        assert r["baseline"] == base
        for metric in ("train", "memory", "generate"):
            assert _positive(r[metric]["paired_median"]) and _positive(r[metric]["of_medians"])
            if name not in GOALS:  # a scheme without a speed goal: its ratios are reported, not judged
                assert res["goals"][name] == {}
                continue
            goal = res["goals"][name][metric]
            assert goal["value"] == r[metric]["paired_median"] and goal["target"] == GOALS[name][metric]
            ceiling = metric == "memory"
            assert goal["comparison"] == ("<=" if ceiling else ">=")
            assert goal["met"] is (goal["value"] <= goal["target"] if ceiling else goal["value"] >= goal["target"])
        # the ratio is the paired one: this model's sample over its baseline's (one repetition)
        mine = res["models"][name]["samples"]["train_tokens_per_s"]
        theirs = res["models"][base]["samples"]["train_tokens_per_s"]
        assert r["train"]["paired_median"] == pytest.approx(statistics.median(a / b for a, b in zip(mine, theirs)))
    assert res["goals"]["resi_dual"]["train"]["target"] == 0.97
    assert res["goals"]["post_ln"]["train"]["target"] == 0.99
    assert res["goals"]["pre_ln"]["memory"]["target"] == 1.05
    assert set(res["aa_noise"]) == {"train", "generate"}
    # the printed table has one row per model, and the goals as GOALS holds them
    for name in MODELS:
        assert f"tiny     {name} " in stdout
    assert f"goals: {goals_text()}" in stdout and "resi_dual" in goals_text()


def test_block_benchmark_prints_ratios_against_the_plain_block(capsys):
    """scripts/block_benchmark.py at a toy size: a row per block with its time, peak-memory and saved-bytes
    ratios to the plain Pre-LN block (1 for the plain block itself), the A/A control among them."""
    import block_benchmark

    block_benchmark.main(["--schemes", "hyper_connections,mhc", "--embed", "16", "--ffn", "32", "--heads", "2",
                          "--tokens", "4", "--batch", "2", "--rounds", "2", "--warmup", "0"])
    rows = {line[:22].strip(): line[22:].split() for line in capsys.readouterr().out.splitlines()
            if line and not line.startswith(("#", "block"))}
    assert list(rows) == ["plain", "plain (A/A)", "hyper_connections", "mhc"]
    assert rows["plain"][1] == "1.000" and rows["plain"][-2:] == ["1.00", "1.00"]
    for name in ("hyper_connections", "mhc"):  # n = 4 streams keep more for the backward than one stream
        assert float(rows[name][-1]) > 1

"""Study options that would give a wrong result and report it as right are refused before anything is made,
and a grown budget reaches every cell that can grow.

* extra fairseq-train options that contradict a cell's own settings (the cell would be filed under one scheme,
  depth, seed or recipe and trained as another);
* duplicates in list options (one run counted twice);
* numbers out of range (a negative learning rate, dropout 1, ...);
* ``--device cuda`` / ``--gpu`` without a GPU (the run would go to the CPU and be reported as a GPU run);
* a cell marked diverged only because its valid loss was above the uniform guess after a short budget is
  continued by a larger budget; a NaN/Inf stop is not; the report says which cells did not reach the budget;
* the error for a study folder prepared with other settings names what the user can do.

The budget tests run the real cell logic on a stand-in for fairseq-train (it writes fairseq's log lines and
a checkpoint for the budget it is asked for).
"""
import argparse
import json
import math
import os
import re
import shlex

import pytest

from conftest import write_corpus_head
from residual_studies import cell, claims, claims_report, demo, depth_study, grid
from residual_studies.data import DEFAULT_CORPUS
from residual_studies.runner import ToolError


def claims_args(*argv):
    return claims.parse_args([str(a) for a in argv])


# --------------------------------------------------------------------------------------------------------------
# extra fairseq-train options


@pytest.mark.parametrize("extra, option, instead", [
    ("--residual-scheme pre_ln", "--residual-scheme", "--schemes"),
    ("--arch transformer", "--arch", "--schemes"),
    ("--encoder-layers 3", "--encoder-layers", "--conditions"),
    ("--decoder-embed-dim=32", "--decoder-embed-dim", "--width"),
    ("--encoder-ffn-embed-dim 64", "--encoder-ffn-embed-dim", "--ffn-dim"),
    ("--decoder-attention-heads 2", "--decoder-attention-heads", "--heads"),
    ("--activation-fn gelu --seed 7", "--seed", "--seeds"),
    ("--lr 0.1", "--lr", "--lr"),
    ("--warmup-updates 10", "--warmup-updates", "--warmup"),
    ("--max-tokens 100", "--max-tokens", "--max-tokens"),
    ("--max-update 9", "--max-update", "--updates"),
    ("--dropout 0.3", "--dropout", "--dropout"),
    ("--clip-norm 1", "--clip-norm", "--clip-norm"),
    ("--save-dir /tmp/elsewhere", "--save-dir", "--out"),
])
def test_extra_train_args_that_contradict_the_cell_are_refused(extra, option, instead, tmp_path):
    args = claims_args("--out", tmp_path / "study", f"--extra-train-args={extra}")
    with pytest.raises(ToolError) as err:
        grid.start(args, print)
    message = str(err.value)
    assert f"--extra-train-args sets {option}" in message and f"use {instead}" in message
    assert not (tmp_path / "study").exists()  # refused before anything is made


def test_extra_train_args_name_the_depth_study_s_own_options(tmp_path):
    args = depth_study.build_parser().parse_args(["--out", str(tmp_path), "--extra-train-args=--seed 3"])
    with pytest.raises(ToolError, match=r"sets --seed, .*use --seed instead"):
        grid.start(args, print)
    args = depth_study.build_parser().parse_args(["--out", str(tmp_path), "--extra-train-args=--decoder-layers 2"])
    with pytest.raises(ToolError, match=r"use --depths instead"):
        grid.start(args, print)


def test_extra_train_args_that_do_not_touch_the_cell_pass():
    for extra in ("", "--activation-fn gelu", "--resi-dual-start-from zeros", "--adam-eps 1e-6 --weight-decay 0"):
        cell.check_extra_args(extra, claims.STUDY_OPTIONS)


def test_the_demo_refuses_extra_train_args_that_contradict_its_runs(tmp_path):
    with pytest.raises(ToolError, match=r"sets --residual-scheme, .*use --schemes instead"):
        demo.main(["--tiny", "--out", str(tmp_path), "--extra-train-args=--residual-scheme post_ln"])
    assert not (tmp_path / "data").exists()


# --------------------------------------------------------------------------------------------------------------
# duplicates and ranges


@pytest.mark.parametrize("argv, option", [
    (["--seeds", "1,1"], "--seeds"),
    (["--seeds", "1,2,1"], "--seeds"),
    (["--schemes", "post_ln,post_ln"], "--schemes"),
    (["--conditions", "warm6,warm6"], "--conditions"),
    (["--ablations", "zeros,zeros"], "--ablations"),
])
def test_duplicates_in_list_options_are_refused(argv, option, capsys):
    with pytest.raises(SystemExit):
        claims_args(*argv)
    err = capsys.readouterr().err
    assert option in err and "twice" in err


def test_duplicate_depths_and_demo_schemes_are_refused(capsys):
    with pytest.raises(SystemExit):
        depth_study.build_parser().parse_args(["--depths", "6,12,6"])
    assert "--depths" in capsys.readouterr().err
    with pytest.raises(ToolError, match="twice"):
        demo.main(["--schemes", "resi_dual,resi_dual", "--tiny"])


@pytest.mark.parametrize("argv", [
    ["--lr", "-1"], ["--lr", "0"], ["--lr", "nan"], ["--lr", "inf"], ["--warmup", "0"], ["--dropout", "1"],
    ["--dropout", "-0.1"], ["--clip-norm", "-1"], ["--width", "0"], ["--heads", "0"], ["--ffn-dim", "0"],
    ["--max-tokens", "0"], ["--vocab-size", "3"], ["--bleu-sentences", "0"], ["--beam", "0"], ["--updates", "0"],
    ["--log-interval", "0"], ["--checkpoint-every", "0"], ["--jobs", "0"], ["--threads", "-1"],
    ["--analyze-batches", "0"], ["--curve-every", "0"],
])
def test_numbers_out_of_range_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        claims_args(*argv)
    assert f"argument {argv[0]}" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--lr", "-1e-3"], ["--dropout", "1.5"], ["--max-update", "0"], ["--threads", "-2"]])
def test_the_demo_refuses_numbers_out_of_range(argv, capsys):
    with pytest.raises(SystemExit):
        demo.build_parser().parse_args(argv)
    assert f"argument {argv[0]}" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------------------
# the device


def _no_gpu():
    import torch

    return not torch.cuda.is_available()


@pytest.mark.skipif(not _no_gpu(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):  # at parsing, as every tool's --device (residual_studies.options.device)
        claims_args("--out", tmp_path / "study", "--device", "cuda")
    assert "argument --device: cuda: torch sees no such CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "study").exists()
    with pytest.raises(ToolError, match=r"--gpu.*no CUDA GPU"):
        demo.main(["--tiny", "--gpu", "--out", str(tmp_path / "demo")])


# --------------------------------------------------------------------------------------------------------------
# a study folder prepared with other settings


@pytest.mark.slow
def test_a_study_folder_prepared_with_other_settings_says_what_to_do(tmp_path):
    corpus = write_corpus_head(tmp_path / "corpus", 60, 10, 10)
    base = ["--data", corpus, "--out", tmp_path / "study", "--bleu-sentences", "5"]
    grid.start(claims_args(*base, "--vocab-size", "100"), print)
    with pytest.raises(ToolError) as err:
        grid.start(claims_args(*base, "--vocab-size", "120"), print)
    message = str(err.value)
    assert "vocab_size: 100 -> 120" in message
    assert "--overwrite" not in message  # no study has it
    assert "another --out" in message and "--vocab-size 100" in message


# --------------------------------------------------------------------------------------------------------------
# budgets: what a larger --updates continues


class FakeFairseq:
    """Stands in for fairseq-train (and -generate) in ``run_logged``: writes the log lines of a run to
    ``--max-update`` (one train_inner line per update from where the save dir's checkpoint stands, then the
    validation) and a checkpoint, with the valid nll ``outcomes[max_update]``; ``"nan"`` stops at the first
    update with fairseq's FloatingPointError (exit status 1)."""

    def __init__(self, outcomes):
        self.outcomes, self.calls = outcomes, []

    def __call__(self, cmd, log_path, threads, append=False):
        max_update = int(cmd[cmd.index("--max-update") + 1])
        save_dir = cmd[cmd.index("--save-dir") + 1]
        last = os.path.join(save_dir, "checkpoint_last.pt")
        start = int(open(last).read()) if os.path.exists(last) else 0
        self.calls.append((start, max_update))
        outcome = self.outcomes[max_update]
        with open(log_path, "a" if append else "w", encoding="utf-8") as log:
            log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
            if outcome == "nan":
                log.write(f'| train_inner | {{"num_updates": "{start + 1}", "loss": "nan"}}\n')
                log.write("FloatingPointError: gradients are Nan/Inf\n")
                return 1, 1.0
            for u in range(start + 1, max_update + 1):
                log.write(f'| train_inner | {{"num_updates": "{u}", "loss": "{outcome + 1}"}}\n')
            log.write(f'| valid | {{"valid_loss": "{outcome + 0.5}", "valid_nll_loss": "{outcome}", '
                      f'"valid_ppl": "{2 ** outcome}", "valid_num_updates": "{max_update}"}}\n')
        with open(last, "w") as f:
            f.write(str(max_update))
        return 0, 1.0


@pytest.fixture
def fake_cells(tmp_path, monkeypatch):
    """A study's options and data for cells run by :class:`FakeFairseq` (vocabulary 200: log2 = 7.64 bits)."""
    def install(outcomes):
        fake = FakeFairseq(outcomes)
        monkeypatch.setattr(cell, "run_logged", fake)
        monkeypatch.setattr(cell, "translate_and_score", lambda *a, **k: {"bleu": 1.0, "chrf": 10.0})
        return fake

    args = depth_study.build_parser().parse_args(["--out", str(tmp_path), "--schemes", "post_ln", "--depths", "2"])
    data = dict(bin="bin", fingerprint="f", bleu_sentences=5, vocab=200)
    return args, data, install


def test_a_cell_diverged_only_by_its_loss_at_a_short_budget_continues(fake_cells):
    args, data, install = fake_cells
    fake = install({4: 9.0, 8: 6.0})  # above log2(200) = 7.64 bits after 4 updates, below after 8
    args.updates = 4
    first = cell.run(args, data, "post_ln", 2)
    assert first["status"] == "diverged" and "loss exploded" in first["reason"] and first["reached"] == 4
    args.updates = 8
    grown = cell.run(args, data, "post_ln", 2)
    assert fake.calls == [(0, 4), (4, 8)]  # trained on from its checkpoint at 4 updates
    assert grown["status"] == "ok" and grown["reached"] == 8 and grown["stats"]["valid_nll_loss"] == 6.0


def test_a_cell_stopped_by_nan_is_not_continued_and_says_where_it_stopped(fake_cells):
    args, data, install = fake_cells
    fake = install({4: "nan", 8: 6.0})
    args.updates = 4
    first = cell.run(args, data, "post_ln", 2)
    assert first["status"] == "diverged" and "FloatingPointError" in first["reason"]
    args.updates = 8
    grown = cell.run(args, data, "post_ln", 2)
    assert fake.calls == [(0, 4)]
    assert grown["status"] == "diverged" and grown["budget"] == 8 and grown["reached"] == 1
    assert "not trained further" in grown["reason"]


def _fake_result(scheme, condition, seed, nll, status="ok", reached=1000, budget=1000):
    depth = claims.CONDITIONS[condition][0]
    return dict(scheme=scheme, condition=condition, seed=seed, status=status, reason="", cell=f"{scheme}-{seed}",
                stats={"valid_nll_loss": nll}, scores={"bleu": 1.0, "chrf": 10.0}, diagnostics=None,
                train_cpu_s=10.0, budget=budget, reached=reached, train_s=10.0,
                settings=dict(scheme=scheme, depth=depth, width=64, ffn_dim=128, heads=4, dropout=0.1, lr=2e-3,
                              max_tokens=2048, updates=budget, beam=4, bleu_sentences=5, warmup=300,
                              clip_norm=0.0, seed=seed))


def test_reports_say_which_cells_did_not_reach_the_budget(tmp_path):
    results = [_fake_result("post_ln", "warm6", 1, 6.0), _fake_result("pre_ln", "warm6", 1, None, "diverged", 37)]
    args = claims.parse_args(["--out", str(tmp_path), "--conditions", "warm6", "--seeds", "1"])
    text = claims_report.write_report(args, results, wall_s=1)
    assert "1000 updates per cell" in text and "1 of 2 cells stopped before 1000 updates" in text
    assert re.search(r"\| pre_ln warm6 seed 1 \| diverged \| 37 \|", text)
    full = claims_report.write_report(args, results[:1], wall_s=1)
    assert "stopped before" not in full

    depth_args = argparse.Namespace(schemes=["post_ln", "pre_ln"], jobs=1, threads=1, vocab_size=200, out=str(tmp_path),
                                    data=DEFAULT_CORPUS)
    for r in results:
        r["settings"]["depth"] = 6
    depth_study.write_report(depth_args, dict(bleu_sentences=5, vocab=200), results, wall_s=1)
    md = (tmp_path / "results.md").read_text()
    assert "1 of 2 cells stopped before 1000 updates" in md and "| 37 |" in md
    assert math.isfinite(json.loads((tmp_path / "results.json").read_text())["cells"][1]["reached"])

"""The study cells' bookkeeping (scripts/residual_studies/cell.py) and the depth study's report: divergence
classification, resumable cell folders, log parsing, and a report that shows diverged and failed cells
instead of dropping them.

The training itself is fairseq-train (exercised by tests/test_claims.py and the demo's tests); these tests run
no training and take about a second.
"""
import argparse
import json
import math
import os

import pytest

from residual_studies import cell, depth_study
from residual_studies.data import DEFAULT_CORPUS

VOCAB = 4000


@pytest.mark.parametrize("rc, log, stats, status, phrase", [
    (0, "", {"valid_nll_loss": 6.5}, "ok", ""),
    (1, "Traceback ...\n    raise FloatingPointError(\"gradients are Nan/Inf\")\n"
        "FloatingPointError: gradients are Nan/Inf\n", {}, "diverged",
     "FloatingPointError: gradients are Nan/Inf"),
    (1, "FloatingPointError: Minimum loss scale reached (0.0001).\n", {}, "diverged", "Minimum loss scale"),
    (1, "Fatal error: gradients norm exceeded threshold\n", {}, "diverged", "exceeded"),
    (0, "", {"valid_nll_loss": math.nan}, "diverged", "nan"),
    (0, "", {"valid_nll_loss": 12.5, "first_train_loss": 9.0, "last_train_loss": 13.0}, "diverged",
     "loss exploded"),
    (0, "", {"valid_nll_loss": 12.5, "first_train_loss": 13.5, "last_train_loss": 12.9}, "ok", ""),
    (1, "RuntimeError: out of memory\n", {}, "failed", "out of memory"),
    (0, "", {"valid_nll_loss": None}, "failed", "no validation"),
])
def test_classify(rc, log, stats, status, phrase):
    got, reason = cell.classify(rc, log, stats, VOCAB)
    assert got == status
    assert phrase in reason


def test_cell_folder_is_stable_and_names_the_settings():
    s = dict(scheme="pre_ln", depth=24, width=64, updates=300, lr=1e-3)
    a, b = cell.folder("/tmp/x", s), cell.folder("/tmp/x", dict(s))
    assert a == b  # a rerun finds the same folder (and skips the cell when result.json is there)
    assert os.path.basename(a).startswith("pre_ln-L24-w64-")
    assert cell.folder("/tmp/x", dict(s, lr=2e-3)) != a  # any other setting: another cell
    assert cell.folder("/tmp/x", dict(s, updates=1200)) == a  # but a longer budget continues this one
    assert cell.result_path("/tmp/x", s) == os.path.join(a, "budgets", "u300", "result.json")
    # the name is the scheme, depth, width and the first 8 hex digits of the settings' SHA-256 (sorted JSON,
    # without the updates): existing cell folders are found by every later version
    assert os.path.basename(a) == "pre_ln-L24-w64-" + __import__("hashlib").sha256(
        b'{"depth": 24, "lr": 0.001, "scheme": "pre_ln", "width": 64}').hexdigest()[:8]


def test_parse_log(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(
        '2026 | INFO | train_inner | {"num_updates": "25", "loss": "9.1", "gnorm_enc_low_top": "0.5"}\n'
        "2026 | INFO | fairseq.trainer | something else\n"
        '2026 | INFO | valid | {"valid_loss": "8.8", "valid_nll_loss": "8.3"}\n')
    parsed = cell.parse_log(str(path))
    assert parsed["train_inner"][0]["gnorm_enc_low_top"] == "0.5"
    assert parsed["valid"][0]["valid_nll_loss"] == "8.3"
    assert parsed["train"] == []


def _result(scheme, depth, status, nll=None, bleu=None, reason=""):
    settings = dict(scheme=scheme, depth=depth, width=64, ffn_dim=128, heads=4, updates=300, lr=1e-3,
                    warmup=60, max_tokens=4096, dropout=0.1, clip_norm=0.0, seed=1, beam=4,
                    bleu_sentences=300)
    return dict(settings=settings, status=status, reason=reason, exit_status=0 if status == "ok" else 1,
                stats=dict(valid_loss=None if nll is None else nll + 0.5, valid_nll_loss=nll,
                           grad_norm_low_top_enc=0.5, grad_norm_low_top_dec=7.5e-05),
                train_s=10.0, train_cpu_s=9.0,
                scores=None if bleu is None else dict(bleu=bleu, chrf=20.0, translate_s=1.0,
                                                       bleu_signature="nrefs:1|tok:13a"))


def test_report_shows_diverged_and_failed_cells(tmp_path):
    results = [
        _result("post_ln", 6, "ok", 6.1, 3.2), _result("resi_dual", 6, "ok", 6.0, 3.5),
        _result("post_ln", 24, "diverged", reason="NaN/Inf gradients (FloatingPointError): ..."),
        _result("resi_dual", 24, "ok", 5.9, 3.9),
        _result("post_ln", 48, "failed", reason="fairseq-train exit status 1: boom"),
        _result("resi_dual", 48, "diverged", 12.5, 0.0, reason="loss exploded: ..."),
    ]
    args = argparse.Namespace(schemes=["post_ln", "pre_ln", "resi_dual"], jobs=2, threads=1, data=DEFAULT_CORPUS,
                              vocab_size=4000, out=str(tmp_path))
    data = dict(bleu_sentences=300, vocab=4003)
    pivot = depth_study.write_report(args, data, results, wall_s=60.0)
    rows = {line.split("|")[1].strip(): line for line in pivot.splitlines()[2:]}
    assert set(rows) == {"6", "24", "48"}
    assert "3.20 / 6.10" in rows["6"] and "3.50 / 6.00" in rows["6"]
    assert "**diverged**" in rows["24"] and "**failed**" in rows["48"]
    assert "**diverged** (0.00 / 12.50)" in rows["48"]  # its numbers are kept
    assert "Pre-LN" not in pivot  # a scheme without cells gets no column
    text = (tmp_path / "results.md").read_text()
    assert "7.5e-05" in text and "boom" in text
    assert "beam-4 translations of the first 300 test sentences" in text and "signature `nrefs:1|tok:13a`" in text
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [c["status"] for c in saved["cells"]] == [r["status"] for r in results]
    with open(tmp_path / "quality_vs_depth.png", "rb") as f:
        assert f.read(4) == b"\x89PNG"


def test_a_few_updates_above_the_uniform_guess_are_untrained_not_exploded(tmp_path, monkeypatch, capsys):
    """A cell of 4 updates whose --log-interval exceeds them logs no train_inner line: its updates come from
    the epoch and validation records, and its valid nll above the uniform guess with a falling training loss
    is an untrained model, not a diverged one."""
    log = ('2026 | INFO | train_inner | {"epoch": 1, "num_updates": "2", "loss": "9.4"}\n'
           '2026 | INFO | train_inner | {"epoch": 1, "num_updates": "3", "loss": "9.1"}\n'
           '2026 | INFO | valid | {"epoch": 1, "valid_loss": "9.0", "valid_nll_loss": "8.85", "num_updates": "4"}\n'
           '2026 | INFO | train | {"epoch": 1, "loss": "9.2", "num_updates": "4"}\n')

    def logged(text):  # fairseq-train as the cell runs it: its log appended to the segment's file
        def run(cmd, path, threads, append=False):
            with open(path, "a", encoding="utf-8") as f:
                f.write(text)
            return 0, 1.0
        return run

    monkeypatch.setattr(cell, "train_command", lambda args, s, data_bin, run_dir: ["fairseq-train"])
    epoch_only = "".join(line + "\n" for line in log.splitlines() if "train_inner" not in line)
    for name, text in (("inner", log), ("epoch_only", epoch_only)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        monkeypatch.setattr(cell, "run_logged", logged(text))
        state = cell.train_segment(argparse.Namespace(threads=1), {"updates": 4}, {"bin": "bin", "vocab": 300},
                                   str(run_dir), None, "cell")
        assert state["stats"]["updates_done"] == 4, name
        assert state["status"] == "ok", (name, state["reason"])
        assert "cell: training from scratch to 4 updates" in capsys.readouterr().out
    # a segment a kill cut short: fairseq resumes from its checkpoint, and the log says so
    (tmp_path / "inner" / "checkpoint_last.pt").write_bytes(b"x")
    cell.train_segment(argparse.Namespace(threads=1), {"updates": 4}, {"bin": "bin", "vocab": 300},
                       str(tmp_path / "inner"), None, "cell")
    assert "training on from the checkpoint of an interrupted run" in capsys.readouterr().out

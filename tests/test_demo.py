"""Tests for the German->English demo (scripts/run_demo.sh -> scripts/demo.py -> residual_studies.demo).

One shortened demo run goes through the real entry point and the real fairseq CLIs: one scheme
(ResiDual), a tiny model (2+2 layers, width 32), 5 updates, the first 100 pairs of each split of the
shipped corpus, into a temporary folder. The tests then check its outputs (the scores against sacreBLEU
called here on the same files), that a second run reuses every finished step, that the printed
fairseq-interactive line works, and that a missing or corrupt corpus file stops the demo with an error
naming the file. The later runs call the demo in-process: the entry point adds nothing they test.
"""

import json
import math
import os
import shutil
import subprocess

import pytest
from sacrebleu.metrics import BLEU, CHRF

import inprocess
from conftest import REPO, SHIPPED_CORPUS, cli_env
from residual_studies import demo
from residual_studies.logs import loss_curves
from residual_studies.runner import ToolError

ROOT = str(REPO)
ENTRY = os.path.join(ROOT, "scripts", "run_demo.sh")
DATA = str(SHIPPED_CORPUS)
ARGS = ["--schemes", "resi_dual", "--max-update", "5", "--tiny", "--subset", "100"]

pytestmark = pytest.mark.slow


def run_demo(*args, cwd=ROOT):
    return subprocess.run(["bash", ENTRY, *args], cwd=cwd, env=cli_env(), capture_output=True,
                          text=True, timeout=600)


def demo_in_process(capsys, *args):
    """The demo's ``main`` on ``args`` in this process; its printed output."""
    assert demo.main(list(args)) == 0
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    proc = run_demo(*ARGS, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc


def test_results_table_json_plot_examples(demo_run):
    out, proc = demo_run
    res = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert list(res["schemes"]) == ["resi_dual"]
    r = res["schemes"]["resi_dual"]
    hyps = (out / "runs" / "resi_dual" / "hyp.test.en").read_text(encoding="utf-8").split("\n")[:-1]
    refs = (out / "data" / "raw" / "test.en").read_text(encoding="utf-8").split("\n")[:-1]
    assert r["bleu"] == round(BLEU().corpus_score(hyps, [refs]).score, 2)  # the detokenized text, raw refs
    assert r["chrf"] == round(CHRF().corpus_score(hyps, [refs]).score, 2)
    assert r["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "chrF" not in r["bleu_signature"] and r["chrf_signature"].startswith("nrefs:1")
    assert math.isfinite(r["best_valid_loss"]) and 0 < r["best_valid_loss"] < 20  # bits / token
    assert r["updates"] == 5 and r["best_valid_update"] == 5
    assert r["params"] > 0 and r["train_time_s"] > 0
    # tiny preset: 2+2 layers, width 32, ffn 64, shared embeddings of the joint vocabulary
    assert res["settings"]["layers"] == 2 and res["settings"]["embed_dim"] == 32
    # the loss curves behind the plot: every logged update (log interval 1), finite losses
    curves = loss_curves(str(out / "runs" / "resi_dual" / "train.log"))
    assert [u for u, _ in curves["train"]] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(loss) for _, loss in curves["train"])
    assert curves["params"] == r["params"]

    assert len(res["examples"]) == 5
    src = (out / "data" / "raw" / "test.de").read_text(encoding="utf-8").splitlines()
    ref = (out / "data" / "raw" / "test.en").read_text(encoding="utf-8").splitlines()
    assert len(src) == len(ref) == 100  # --subset 100
    for i, ex in enumerate(res["examples"]):
        assert ex["source"] == src[i] and ex["reference"] == ref[i]
        assert set(ex["hypotheses"]) == {"resi_dual"}
    hyps = (out / "runs" / "resi_dual" / "hyp.test.en").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 100  # no sentence dropped (--required-batch-size-multiple 1)
    assert all("\u2581" not in h for h in hyps)  # sentencepiece pieces decoded

    md = (out / "results.md").read_text(encoding="utf-8")
    assert "| scheme | BLEU | chrF | best valid loss | parameters |" in md
    assert f"| ResiDual | {r['bleu']:.2f} | {r['chrf']:.2f} |" in md
    assert f"{r['params']:,}" in md and "fairseq-interactive" in md
    assert (out / "examples.md").read_text(encoding="utf-8").count("**source:**") == 5

    png = (out / "loss_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000

    # fairseq's progress lines reach the terminal, prefixed with the scheme
    assert '[resi_dual] ' in proc.stdout and '| train_inner | {"epoch": 1' in proc.stdout
    assert "BLEU signature: nrefs:1" in proc.stdout


def test_printed_interactive_command_translates(demo_run, tmp_path):
    out, proc = demo_run
    res = json.loads((out / "results.json").read_text(encoding="utf-8"))
    inter = res["interactive"]
    assert inter["translation"].strip()  # the demo ran it once itself
    cmd = inter["command"]
    assert cmd in proc.stdout
    for flag in ("--user-dir", "--path", "--bpe sentencepiece", "--sentencepiece-model",
                 "--required-batch-size-multiple 1", "--beam 5"):
        assert flag in cmd
    # run the printed line as a user would, from any folder, on another sentence
    line = cmd.replace(demo.INTERACTIVE_SENTENCE, "Das Haus ist groß.")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].strip() and "\u2581" not in lines[0]


def test_rerun_reuses_finished_steps(demo_run, capsys):
    out, first = demo_run
    before = json.loads((out / "results.json").read_text(encoding="utf-8"))
    ckpt = out / "runs" / "resi_dual" / "checkpoint_last.pt"
    mtime = ckpt.stat().st_mtime_ns
    text = demo_in_process(capsys, *ARGS, "--out", str(out))
    for what in ("data: reusing", "train resi_dual: reusing", "translate resi_dual: reusing",
                 "interactive: reusing"):
        assert what in text
    assert "fairseq-train " not in text and "fairseq-generate " not in text
    assert ckpt.stat().st_mtime_ns == mtime
    after = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert after["schemes"]["resi_dual"]["bleu"] == before["schemes"]["resi_dual"]["bleu"]
    assert after["demo_wall_s"] < before["demo_wall_s"] / 3
    assert after["history"][-1]["computed"] == []  # nothing computed: every step reused

    # other settings for a finished run: an error naming the folder, not a silent retrain
    with pytest.raises(ToolError) as err:
        demo.main(["--schemes", "resi_dual", "--max-update", "4", "--tiny", "--subset", "100", "--out", str(out)])
    assert "runs/resi_dual" in str(err.value) and "max_update: 5 -> 4" in str(err.value)
    assert "--overwrite" in str(err.value)


def _corpus_copy(tmp_path):
    data = tmp_path / "corpus"
    shutil.copytree(DATA, data, ignore=shutil.ignore_patterns("README*"))
    return data


def test_missing_data_file_names_it(tmp_path):
    data = _corpus_copy(tmp_path)
    (data / "test.en").unlink()
    proc = run_demo(*ARGS, "--data", str(data), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "missing data file" in proc.stderr and str(data / "test.en") in proc.stderr
    assert not (tmp_path / "out" / "data").exists()  # stopped before any work


def test_corrupt_data_files_name_the_file(tmp_path):
    data = _corpus_copy(tmp_path)
    lines = (data / "valid.de").read_text(encoding="utf-8").splitlines(keepends=True)
    (data / "valid.de").write_text("".join(lines[:-1]), encoding="utf-8")
    with pytest.raises(ToolError, match="line count mismatch") as err:
        demo.main([*ARGS, "--data", str(data), "--out", str(tmp_path / "out")])
    assert f"{data / 'valid.de'} has 999 lines" in str(err.value) and str(data / "valid.en") in str(err.value)
    assert not (tmp_path / "out" / "data").exists()  # stopped before any work

    # the checks behind the other messages, without starting the entry point each time
    (data / "valid.de").write_text("".join(lines), encoding="utf-8")
    raw = (data / "train.en").read_bytes().split(b"\n")
    raw[2] = raw[2] + b" \xff\xfe"
    (data / "train.en").write_bytes(b"\n".join(raw))
    with pytest.raises(ToolError, match=r"not valid UTF-8: .*train\.en \(line 3"):
        demo.check_corpus(str(data))
    shutil.copy(os.path.join(DATA, "train.en"), data / "train.en")
    (data / "test.de").write_bytes(b"")
    with pytest.raises(ToolError, match=r"empty data file: .*test\.de"):
        demo.check_corpus(str(data))
    shutil.copy(os.path.join(DATA, "test.de"), data / "test.de")
    text = (data / "test.de").read_text(encoding="utf-8").split("\n")
    text[9] = "   "
    (data / "test.de").write_text("\n".join(text), encoding="utf-8")
    with pytest.raises(ToolError, match=r"empty line 10 in data file: .*test\.de"):
        demo.check_corpus(str(data))
    shutil.copy(os.path.join(DATA, "test.de"), data / "test.de")
    digests, counts = demo.check_corpus(str(data))
    assert counts == {"train": 13032, "valid": 1000, "test": 1000} and len(digests) == 6
    binarized = tmp_path / "data-bin"  # what a fairseq user may pass: fairseq-preprocess's output
    binarized.mkdir()
    for name in ("dict.de.txt", "dict.en.txt", "train.de-en.de.idx", "train.de-en.de.bin"):
        (binarized / name).write_text("")
    with pytest.raises(ToolError, match=r"is a fairseq-preprocess output \(dict.\*.txt, \*.bin/.idx\); --data takes "
                                        r"the raw text corpus \(train.de/.en, valid.de/.en, test.de/.en"):
        demo.check_corpus(str(binarized))


def test_larger_max_update_continues_the_finished_run(demo_run, tmp_path, capsys, monkeypatch):
    """The demo's fairseq-train and fairseq-generate run in-process here (tests/inprocess.py: the same commands,
    the functions their console scripts call); the demo run of the fixture starts them as processes."""
    monkeypatch.setattr(demo, "_run", inprocess.run)
    out, _ = demo_run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    text = demo_in_process(capsys, "--schemes", "resi_dual", "--max-update", "8", "--tiny", "--subset", "100",
                           "--out", str(copy))
    assert "data: reusing" in text
    assert "train resi_dual: resuming from" in text and "up to 8 updates" in text
    curves = loss_curves(str(copy / "runs" / "resi_dual" / "train.log"))
    assert [u for u, _ in curves["train"]] == list(range(1, 9))  # 1-5 first, 6-8 resumed
    res = json.loads((copy / "results.json").read_text(encoding="utf-8"))
    assert res["schemes"]["resi_dual"]["updates"] == 8
    assert [h["computed"] for h in res["history"]][-1] == ["train resi_dual", "translate resi_dual"]


def test_default_outputs_are_outside_the_checkout():
    """The demo and the studies write their runs outside the checkout by default (a new clone or git clean keeps
    them): under $FAIRSEQ_RESIDUAL_RUNS, else ~/fairseq-residual-runs."""
    from residual_studies import RUNS, claims, depth_study

    for out in (demo.DEFAULT_OUT, claims.DEFAULT_OUT, depth_study.DEFAULT_OUT):
        assert os.path.commonpath([out, RUNS]) == RUNS
        assert os.path.commonpath([out, str(ROOT)]) != str(ROOT), out

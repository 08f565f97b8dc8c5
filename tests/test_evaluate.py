"""scripts/evaluate.sh, score_bleu.py, average_checkpoints.py and collect_results.py.

A tiny model is trained once (scripts/train.sh, IWSLT14 config shrunk to the tiny preset, CPU) and
evaluated the IWSLT14 way and the WMT14 way (with checkpoint averaging); a tiny multilingual model
is evaluated the OPUS-100 way. Every score must equal sacreBLEU called directly on the same
fairseq-generate output; the scorer itself is also checked on hand-made generate output, and
collect_results on synthetic run directories with diverged runs.
"""
import json
import re
import shutil
import statistics
import subprocess
import sys

import pytest
import torch
from sacrebleu.metrics import BLEU
from sacremoses import MosesDetokenizer

from bench_helpers import (
    SCRIPTS, TINY_TRAIN, TINY_TRANSLATION, generate_lines, multilingual_data_bin, run_script,
)
from conftest import cli_env
from residual_studies import bleu as score_bleu
from residual_studies import bleu_metrics
from residual_studies import checkpoints as average_checkpoints
from residual_studies import results as collect_results

EVALUATE = SCRIPTS / "evaluate.sh"
TRAIN = SCRIPTS / "train.sh"


def sacrebleu_direct(hyps, refs, **kwargs):
    return BLEU(**kwargs).corpus_score(hyps, [refs])


def ordered_pairs(gen_file):
    hyps, refs = generate_lines(gen_file, "H"), generate_lines(gen_file, "T")
    ids = sorted(hyps)
    return [hyps[i] for i in ids], [refs[i] for i in ids]


@pytest.fixture(scope="module")
def trained_run(tiny_data_bin, tmp_path_factory):
    """A tiny model trained for 24 updates (3 per epoch, last 3 epoch checkpoints kept)."""
    raw, data_bin = tiny_data_bin
    root = tmp_path_factory.mktemp("eval_runs")
    run_script([TRAIN, "--benchmark", "iwslt14", "--data", data_bin, "--save-root", root, "--layers", "2",
                "--seed", "1", "--cpu", "--max-tokens", "1024", "--update-freq", "1",
                "--extra", " ".join(TINY_TRANSLATION + [
                    "task.source_lang=src", "task.target_lang=tgt", "optimization.max_update=24",
                    "dataset.disable_validation=true", "checkpoint.keep_last_epochs=3",
                    "common.log_interval=100"])], timeout=400)
    return raw, data_bin, root / "iwslt14" / "resi_dual-2L-seed1"


@pytest.mark.slow
def test_evaluate_iwslt14_tokenized_bleu(trained_run):
    raw, data_bin, run_dir = trained_run
    run_script([EVALUATE, "--benchmark", "iwslt14", "--run-dir", run_dir, "--data", data_bin,
                "--source-lang", "src", "--target-lang", "tgt", "--checkpoint", "last", "--cpu",
                "--batch-size", "5"], timeout=300)
    result = json.loads((run_dir / "eval" / "test.json").read_text())
    gen = run_dir / "eval" / "generate-test.txt"
    hyps, refs = ordered_pairs(gen)
    n_test = len((raw / "test.tgt").read_text().splitlines())
    # --batch-size 5 with 24 sentences: a last batch of 4, which fairseq would drop with its
    # default --required-batch-size-multiple 8
    assert len(hyps) == n_test == result["num_sentences"] == 24
    direct = sacrebleu_direct(hyps, refs, tokenize="none", lowercase=True)
    got = result["metrics"]["tokenized_bleu"]
    assert got["score"] == pytest.approx(direct.score, abs=1e-9)
    assert (got["sys_len"], got["ref_len"]) == (direct.sys_len, direct.ref_len)
    assert "tok:none" in got["signature"] and "case:lc" in got["signature"]
    # fairseq-generate's own scorer sees the same tokens and n-gram matches (the tiny model's BLEU
    # itself is ~0: it has learned unigrams and some bigrams)
    m = re.search(r"BLEU4 = [\d.]+, ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) .*syslen=(\d+), reflen=(\d+)",
                  result["fairseq_generate_bleu"])
    assert (int(m.group(5)), int(m.group(6))) == (direct.sys_len, direct.ref_len)
    assert [float(m.group(i)) for i in range(1, 5)] == pytest.approx(direct.precisions, abs=0.051)
    assert direct.precisions[0] > 0
    assert result["run"] == {"scheme": "resi_dual", "layers": 2, "seed": 1}
    assert result["generation"]["beam"] == 5 and result["generation"]["required_batch_size_multiple"] == 1
    assert result["checkpoint"]["path"].endswith("checkpoint_last.pt")

    # what is refused loses nothing: the other direction, a WMT14 run without its raw reference (before any
    # decoding), a fairseq-generate that fails (the earlier translations stay)
    before = gen.read_text()
    common = ["--run-dir", run_dir, "--data", data_bin, "--checkpoint", "last", "--cpu"]
    for args, message in [
            (["--benchmark", "iwslt14", "--source-lang", "tgt", "--target-lang", "src"],
             "was trained src->tgt, but this evaluates tgt->src (--benchmark iwslt14's direction): pass "
             "--source-lang src --target-lang tgt"),
            (["--benchmark", "wmt14", "--source-lang", "src", "--target-lang", "tgt", "--raw-ref", run_dir / "nope"],
             "raw reference"),
            (["--benchmark", "iwslt14", "--source-lang", "src", "--target-lang", "tgt", "--extra", "--no-such-flag"],
             "fairseq-generate failed")]:
        proc = run_script([EVALUATE, *args, *common], check=False, timeout=300)
        assert proc.returncode != 0 and message in proc.stdout, proc.stdout[-3000:]
        assert ("fairseq-generate ->" in proc.stdout) == (message == "fairseq-generate failed"), proc.stdout[-3000:]
        assert gen.read_text() == before and not (run_dir / "eval" / "generate-test.txt.partial").exists()

    # a checkpoint of another run (scheme or depth) is refused, a folder is named as one; an evaluation with its own
    # --out writes its translations beside that file, never over the run's
    other = run_dir.parent / "pre_ln-2L-seed1"
    other.mkdir(exist_ok=True)
    iwslt = ["--benchmark", "iwslt14", "--source-lang", "src", "--target-lang", "tgt", "--data", data_bin, "--cpu"]
    proc = run_script([EVALUATE, *iwslt, "--run-dir", other, "--checkpoint", run_dir / "checkpoint_last.pt"],
                      check=False, timeout=300)
    assert proc.returncode != 0 and ("holds a resi_dual model with 2 encoder layers, seed 1, but the run directory "
                                     "pre_ln-2L-seed1 is pre_ln with 2 layers, seed 1") in proc.stdout, proc.stdout[-3000:]
    shutil.copy(run_dir / "checkpoint_last.pt", other / "checkpoint_last.pt")  # copied in: its last is not its own
    proc = run_script([EVALUATE, *iwslt, "--run-dir", other, "--checkpoint", "last"], check=False, timeout=300)
    assert proc.returncode != 0 and "but the run directory pre_ln-2L-seed1 is pre_ln" in proc.stdout, proc.stdout[-3000:]
    assert not (other / "eval").exists() or not any((other / "eval").glob("*.json"))
    proc = run_script([EVALUATE, *iwslt, "--run-dir", run_dir, "--checkpoint", run_dir], check=False, timeout=300)
    assert proc.returncode != 0 and "is a folder: give a checkpoint file in it (checkpoint" in proc.stdout
    junk = run_dir.parent / "junk.pt"
    junk.write_text("not a checkpoint")
    proc = run_script([EVALUATE, *iwslt, "--run-dir", run_dir, "--checkpoint", junk], check=False, timeout=300)
    assert proc.returncode != 0 and f"cannot read the checkpoint {junk} (UnpicklingError: " in proc.stdout
    assert "Traceback" not in proc.stdout, proc.stdout[-3000:]
    out = run_dir.parent / "beam1" / "result.json"
    run_script([EVALUATE, *iwslt, "--run-dir", run_dir, "--checkpoint", "last", "--beam", "1", "--out", out],
               timeout=300)
    assert json.loads(out.read_text())["generation"]["beam"] == 1
    assert (out.parent / "result.generate-test.txt").exists() and gen.read_text() == before


@pytest.mark.slow
def test_evaluate_wmt14_with_checkpoint_averaging_and_the_newstest_average(trained_run, tmp_path):
    """The WMT14 way: the last 3 checkpoints averaged, compound-split tokenized BLEU and sacreBLEU of the
    detokenized output against the raw reference; with --newstest-average on the tiny model: its test set
    stands in for every newstest year (splits named newstestYYYY as prepare-wmt14-en-de.sh --newstest-years
    writes them, 2014 = test), each decoded with the averaged checkpoint. The tiny model's hypotheses are 1-3
    tokens, so every year's BLEU is 0 here: this checks the decoding per year and the plumbing;
    test_newstest_average_is_the_mean_of_sacrebleu checks the numbers on hypotheses that partly match (and
    test_score_bleu_matches_sacrebleu the primary metric without the average)."""
    raw, data_bin, run_dir = trained_run
    data = tmp_path / "data-bin"
    data.mkdir()
    for f in data_bin.iterdir():
        (data / f.name).symlink_to(f)
        if f.name.startswith("test."):
            for y in (2010, 2011, 2012, 2013, 2015, 2016):
                (data / f.name.replace("test.", f"newstest{y}.", 1)).symlink_to(f)
    refs = tmp_path / "refs"
    refs.mkdir()
    raw_refs = (raw / "test.tgt").read_text().splitlines()
    for y in range(2010, 2017):
        shutil.copy(raw / "test.tgt", refs / f"newstest{y}.tgt")
    out = tmp_path / "wmt.json"
    run_script([EVALUATE, "--benchmark", "wmt14", "--run-dir", run_dir, "--data", data,
                "--source-lang", "src", "--target-lang", "tgt", "--average", "3", "--cpu",
                "--raw-ref", raw / "test.tgt", "--newstest-average", "--newstest-refs", refs,
                "--out", out], timeout=400)
    result = json.loads(out.read_text())
    averaged = result["checkpoint"]["averaged"]
    assert [p.rsplit("/", 1)[1] for p in averaged] == ["checkpoint6.pt", "checkpoint7.pt", "checkpoint8.pt"]
    hyps, refs_tok = ordered_pairs(tmp_path / "wmt.generate-test.txt")  # beside --out
    split = [re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", x) for x in hyps + refs_tok]
    direct = sacrebleu_direct(split[:len(hyps)], split[len(hyps):], tokenize="none")
    assert result["metrics"]["tokenized_bleu_compound_split"]["score"] == pytest.approx(direct.score, abs=1e-9)
    md = MosesDetokenizer(lang="tgt")
    direct = sacrebleu_direct([md.detokenize(h.split()) for h in hyps], raw_refs)
    sacre = result["metrics"]["sacrebleu"]
    assert sacre["score"] == pytest.approx(direct.score, abs=1e-9)
    assert "tok:13a" in sacre["signature"] and "case:mixed" in sacre["signature"]
    for name, metric in result["metrics"].items():
        assert metric["description"] and metric["signature"], name

    assert list(result["metrics"]) == ["tokenized_bleu_compound_split", "sacrebleu",
                                       "sacrebleu_newstest2010_2016_avg"]
    assert result["primary_metric"] == "sacrebleu_newstest2010_2016_avg"
    gen_cfg = result["newstest_average_generation"]
    assert gen_cfg["beam"] == 4 and gen_cfg["references"] == str(refs)
    assert gen_cfg["lenpen"] == {f"newstest{y}": 0.6 if y == 2014 else 1.0 for y in range(2010, 2017)}
    assert gen_cfg["subset"]["newstest2014"] == "test" and gen_cfg["subset"]["newstest2010"] == "newstest2010"
    scores = []
    for y in range(2010, 2017):
        gen = tmp_path / ("wmt.generate-test.txt" if y == 2014 else f"wmt.generate-newstest{y}.txt")
        got = result["newstest_per_year"][f"newstest{y}"]
        assert got["generate"] == str(gen)
        if y != 2014:  # the year's own split, decoded with beam 4 and lenpen 1.0, with the averaged checkpoint
            log = (gen.parent / (gen.name + ".log")).read_text()
            assert f"'gen_subset': 'newstest{y}'" in log and "'lenpen': 1.0" in log
            assert "checkpoint_avg_last3.pt" in log
        hyps, _ = ordered_pairs(gen)
        direct = sacrebleu_direct([md.detokenize(h.split()) for h in hyps], raw_refs)
        assert got["score"] == pytest.approx(direct.score, abs=1e-9), y
        scores.append(direct.score)
    avg = result["metrics"]["sacrebleu_newstest2010_2016_avg"]
    assert avg["score"] == pytest.approx(statistics.mean(scores), abs=1e-9)
    # newstest2014 with beam 4 / lenpen 0.6 is the main test decoding: its sacreBLEU is the same
    assert result["newstest_per_year"]["newstest2014"]["score"] == pytest.approx(
        result["metrics"]["sacrebleu"]["score"], abs=1e-9)

    # a year's reference or split missing: stopped before decoding, naming the year and the fix
    args = [EVALUATE, "--benchmark", "wmt14", "--run-dir", run_dir, "--data", data, "--source-lang",
            "src", "--target-lang", "tgt", "--checkpoint", "last", "--cpu", "--raw-ref", raw / "test.tgt",
            "--newstest-average", "--newstest-refs", refs, "--out", tmp_path / "x.json"]
    (refs / "newstest2016.tgt").unlink()
    proc = run_script(args, check=False)
    assert proc.returncode != 0 and f"newstest2016 reference {refs}/newstest2016.tgt not found" in proc.stdout
    assert "sacrebleu -t wmt16 -l src-tgt --echo ref > newstest2016.tgt" in proc.stdout
    (data / "newstest2012.src-tgt.src.idx").unlink()
    proc = run_script(args, check=False)
    assert proc.returncode != 0 and "no split 'newstest2012' (newstest2012)" in proc.stdout
    assert "--newstest-years 2010-2016" in proc.stdout and "fairseq-generate ->" not in proc.stdout
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_average_checkpoints_is_the_mean(trained_run, tmp_path):
    _, _, run_dir = trained_run
    paths = average_checkpoints.last_n_checkpoints(run_dir, 2, "epoch")
    assert [p.rsplit("/", 1)[1] for p in paths] == ["checkpoint7.pt", "checkpoint8.pt"]
    out = tmp_path / "avg.pt"
    # the script's main in-process (evaluate.sh --average starts scripts/average_checkpoints.py, the test above)
    assert average_checkpoints.main(["--inputs", str(run_dir), "--num-epoch-checkpoints", "2",
                                     "--output", str(out)]) == paths
    import fairseq_residual  # noqa: F401  (weights_only allow-list)

    a, b, avg = (torch.load(p, map_location="cpu") for p in (*paths, out))
    for k, v in avg["model"].items():
        if v.is_floating_point():
            torch.testing.assert_close(v, (a["model"][k].double() + b["model"][k].double()).div(2).float())
        else:
            assert torch.equal(v, b["model"][k])
    assert int(avg["model"]["encoder.residual_scheme_id"]) == 2  # resi_dual
    assert "last_optimizer_state" not in avg and avg["cfg"] == b["cfg"]
    with pytest.raises(FileNotFoundError, match="needs 9"):
        average_checkpoints.last_n_checkpoints(run_dir, 9, "epoch")


@pytest.mark.slow
def test_evaluate_opus100_per_direction(tmp_path_factory, tmp_path):
    data_bin = multilingual_data_bin(tmp_path_factory)
    run_script([TRAIN, "--benchmark", "opus100", "--data", data_bin, "--save-root", tmp_path,
                "--layers", "2", "--cpu", "--max-tokens", "1024", "--update-freq", "1",
                "--extra", " ".join(TINY_TRAIN + ["optimization.max_update=12",
                                                  "checkpoint.save_interval_updates=6"])], timeout=400)
    run_dir = tmp_path / "opus100" / "resi_dual-2L-seed1"
    run_script([EVALUATE, "--benchmark", "opus100", "--run-dir", run_dir, "--data", data_bin,
                "--directions", "en-de,nl-en", "--cpu"], timeout=300)
    result = json.loads((run_dir / "eval" / "test.json").read_text())
    raw_dir = data_bin.parent / "raw"
    assert set(result["per_direction"]) == {"en-de", "nl-en"}
    for direction, ref_file in (("en-de", "test.en-de.de"), ("nl-en", "test.en-nl.en")):
        hyps, _ = ordered_pairs(run_dir / "eval" / f"generate-test.{direction}.txt")
        refs = (raw_dir / ref_file).read_text().splitlines()
        assert len(hyps) == len(refs) == 21
        direct = sacrebleu_direct(hyps, refs)
        got = result["per_direction"][direction]
        assert got["score"] == pytest.approx(direct.score, abs=1e-9) and got["missing"] == 0
    metrics = result["metrics"]
    assert metrics["sacrebleu_en_xx_avg"]["score"] == result["per_direction"]["en-de"]["score"]
    assert metrics["sacrebleu_xx_en_avg"]["score"] == result["per_direction"]["nl-en"]["score"]


# ---- the scorer on hand-made fairseq-generate output -------------------------------------------

HYPS = ["the cat sat on the mat .", "a well @-@ known state-of-the-art system x-y-z", "it &apos;s fine , right ?",
        "das ist gut", ""]
REFS = ["the cat sat on a mat .", "a well @-@ known state-of-the-art model", "it &apos;s fine , isn &apos;t it ?",
        "das ist sehr gut", "empty hypothesis here"]


def write_generate(path, hyps, refs, skip=()):
    lines = []
    for i in reversed(range(len(hyps))):  # fairseq-generate prints in batch order, not id order
        if i in skip:
            continue
        lines += [f"S-{i}\tsource {i}", f"T-{i}\t{refs[i]}", f"H-{i}\t-0.5\t{hyps[i]}",
                  f"D-{i}\t-0.5\t{hyps[i]}", f"P-{i}\t-0.1 -0.2"]
    lines.append("Generate test with beam=5: BLEU4 = 12.34, 50.0/20.0/10.0/5.0 (BP=1.000, ratio=1.0, syslen=10, reflen=10)")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_score_bleu_matches_sacrebleu(tmp_path):
    gen = write_generate(tmp_path / "gen.txt", HYPS, REFS)
    raw = tmp_path / "ref.detok"
    md = MosesDetokenizer(lang="en")
    raw.write_text("\n".join(md.detokenize(r.split()) for r in REFS) + "\n")

    iwslt = score_bleu.main(["--benchmark", "iwslt14", "--generate", str(gen), "--target-lang", "en",
                             "--expect", "5", "--out", str(tmp_path / "i.json")])
    direct = sacrebleu_direct(HYPS, REFS, tokenize="none", lowercase=True)
    assert iwslt["metrics"]["tokenized_bleu"]["score"] == pytest.approx(direct.score, abs=1e-9)
    assert 10 < direct.score < 90
    assert iwslt["fairseq_generate_bleu"].startswith("Generate test with beam=5: BLEU4 = 12.34")

    wmt = score_bleu.main(["--benchmark", "wmt14", "--generate", str(gen), "--target-lang", "en",
                           "--raw-ref", str(raw), "--out", str(tmp_path / "w.json")])
    assert wmt["primary_metric"] == "sacrebleu"  # without --newstest-generate
    # fairseq's compound_split_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
    assert bleu_metrics.compound_split("state-of-the-art x-y-z") == \
        "state ##AT##-##AT## of ##AT##-##AT## the ##AT##-##AT## art x ##AT##-##AT## y-z"
    split = [bleu_metrics.compound_split(x) for x in HYPS + REFS]
    direct = sacrebleu_direct(split[:5], split[5:], tokenize="none")
    assert wmt["metrics"]["tokenized_bleu_compound_split"]["score"] == pytest.approx(direct.score, abs=1e-9)
    detok = [md.detokenize(h.split()) for h in HYPS]
    assert detok[1] == "a well-known state-of-the-art system x-y-z" and detok[2] == "it's fine, right?"
    direct = sacrebleu_direct(detok, raw.read_text().splitlines())
    assert wmt["metrics"]["sacrebleu"]["score"] == pytest.approx(direct.score, abs=1e-9)
    # scoring detokenized text against tokenized references would give another number
    assert direct.score != pytest.approx(sacrebleu_direct(detok, REFS).score)


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("perl"), reason="perl is not installed")
def test_compound_split_equals_fairseqs_perl_one_liner():
    """fairseq's compound_split_bleu.sh runs ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``."""
    perl = subprocess.run(["perl", "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"],
                          input="\n".join(HYPS + REFS) + "\n", capture_output=True, text=True).stdout
    assert perl.splitlines() == [bleu_metrics.compound_split(x) for x in HYPS + REFS]


def test_score_bleu_refuses_dropped_sentences(tmp_path):
    gen = write_generate(tmp_path / "gen.txt", HYPS, REFS, skip={4})
    with pytest.raises(bleu_metrics.GenerateOutputError, match="--required-batch-size-multiple 1"):
        score_bleu.main(["--benchmark", "iwslt14", "--generate", str(gen), "--expect", "5",
                         "--out", str(tmp_path / "x.json")])
    # OPUS-100: sentences skipped as too long count as empty hypotheses
    raw = tmp_path / "raw"
    raw.write_text("\n".join(REFS) + "\n")
    res = score_bleu.main(["--benchmark", "opus100", "--generate", str(gen), "--directions", "de-en",
                           "--raw-ref", str(raw), "--expect", "5", "--out", str(tmp_path / "o.json")])
    d = res["per_direction"]["de-en"]
    assert d["missing"] == 1 and d["num_sentences"] == 5
    assert d["score"] == pytest.approx(sacrebleu_direct(HYPS[:4] + [""], REFS).score, abs=1e-9)


# ---- the newstest2010-2016 average (B2T protocol) on tiny local test sets ----------------------

NEWSTEST = {  # year -> (tokenized hypotheses as fairseq-generate --remove-bpe prints them, raw refs)
    2010: (["Das ist ein gutes Beispiel .", "Er sagte : &quot; Hallo ! &quot;"],
           ["Das ist ein gutes Beispiel.", "Er sagte: \"Hallo Welt!\""]),
    2011: (["Die Katze sitzt auf der Matte .", "Ein hoch @-@ modernes System ."],
           ["Die Katze saß auf der Matte.", "Ein hoch-modernes System."]),
    2012: (["Wir gehen nach Hause .", "Es ist spät ."], ["Wir gehen jetzt nach Hause.", "Es ist spät."]),
    2013: (["Zwei Katzen .", "Drei Hunde und ein Pferd ."], ["Zwei Katzen.", "Drei Hunde, ein Pferd."]),
    2014: (["Ein hochmodernes System für Fußgänger .", "Gutach : mehr Sicherheit"],
           ["Ein hochmodernes System für Fußgänger.", "Gutach: Noch mehr Sicherheit für Fußgänger"]),
    2015: (["Das Wetter ist heute gut .", "Morgen regnet es ."],
           ["Das Wetter ist heute schön.", "Morgen regnet es."]),
    2016: (["Die Regierung hat das Gesetz beschlossen .", "Niemand war da ."],
           ["Die Regierung hat das Gesetz beschlossen.", "Keiner war da."]),
}


def newstest_files(tmp_path, years=NEWSTEST, skip_ref=()):
    """Per-year generate output and a reference folder of raw newstestYYYY.de files."""
    refs = tmp_path / "refs"
    refs.mkdir(exist_ok=True)
    gens = {}
    for year, (hyps, raw) in years.items():
        gens[year] = write_generate(tmp_path / f"gen-{year}.txt", hyps, ["tok ref"] * len(hyps))
        if year not in skip_ref:
            (refs / f"newstest{year}.de").write_text("\n".join(raw) + "\n", encoding="utf-8")
    return gens, refs


def test_newstest_average_is_the_mean_of_sacrebleu(tmp_path):
    gens, refs = newstest_files(tmp_path)
    metrics, per_year = bleu_metrics.newstest_average(gens, "de", ref_dir=str(refs))
    md = MosesDetokenizer(lang="de")
    direct = {}
    for year, (hyps, raw) in NEWSTEST.items():
        detok = [md.detokenize(h.split()) for h in hyps]
        direct[year] = sacrebleu_direct(detok, raw)
        got = per_year[f"newstest{year}"]
        assert got["score"] == pytest.approx(direct[year].score, abs=1e-9), year
        assert "tok:13a" in got["signature"] and "case:mixed" in got["signature"]
        assert got["num_sentences"] == 2 and f"newstest{year}.de" in got["description"]
    assert md.detokenize(NEWSTEST[2010][0][1].split()) == 'Er sagte: "Hallo!"'
    assert md.detokenize(NEWSTEST[2011][0][1].split()) == "Ein hoch-modernes System."
    scores = [d.score for d in direct.values()]
    assert 5 < min(scores) and max(scores) < 100 and len(set(scores)) > 3  # partial matches
    avg = metrics["sacrebleu_newstest2010_2016_avg"]
    assert list(metrics) == ["sacrebleu_newstest2010_2016_avg"]
    assert avg["score"] == pytest.approx(statistics.mean(scores), abs=1e-9)
    assert avg["description"].startswith("sacreBLEU averaged over newstest2010-2016, B2T protocol")
    assert avg["years"] == list(range(2010, 2017)) and "tok:13a" in avg["signature"]
    # the averaged score is not the sacreBLEU of the concatenated years
    concat = sacrebleu_direct([md.detokenize(h.split()) for y in NEWSTEST for h in NEWSTEST[y][0]],
                              [r for y in NEWSTEST for r in NEWSTEST[y][1]])
    assert avg["score"] != pytest.approx(concat.score, abs=1e-3)

    # the same through score_bleu.py, beside the two newstest2014 scores, each labelled
    out = tmp_path / "w.json"
    res = score_bleu.main(["--benchmark", "wmt14", "--generate", str(gens[2014]), "--target-lang", "de",
                           "--raw-ref", str(refs / "newstest2014.de"), "--newstest-refs", str(refs),
                           "--newstest-generate", *[f"{y}={p}" for y, p in gens.items()],
                           "--out", str(out)])
    assert json.loads(out.read_text()) == res
    assert list(res["metrics"]) == ["tokenized_bleu_compound_split", "sacrebleu",
                                    "sacrebleu_newstest2010_2016_avg"]
    assert res["primary_metric"] == "sacrebleu_newstest2010_2016_avg"
    assert res["metrics"]["sacrebleu_newstest2010_2016_avg"]["score"] == pytest.approx(avg["score"], abs=1e-9)
    assert res["metrics"]["sacrebleu"]["score"] == pytest.approx(direct[2014].score, abs=1e-9)
    assert list(res["newstest_per_year"]) == [f"newstest{y}" for y in range(2010, 2017)]
    for metric in res["metrics"].values():
        assert metric["description"] and metric["signature"]


def test_missing_reference_is_a_user_error():
    """A newstest year without its reference is a user error like every other: under the one root, ToolError."""
    from residual_studies.runner import ToolError

    assert issubclass(bleu_metrics.MissingReferenceError, ToolError)


def test_newstest_average_refuses_missing_years(tmp_path, monkeypatch):
    gens, refs = newstest_files(tmp_path, skip_ref=(2012, 2016))
    with pytest.raises(bleu_metrics.MissingReferenceError) as err:
        bleu_metrics.newstest_average(gens, "de", ref_dir=str(refs))
    msg = str(err.value)
    for year, testset in ((2012, "wmt12"), (2016, "wmt16")):
        assert f"newstest{year}: reference {refs / f'newstest{year}.de'} not found" in msg
        assert f"sacrebleu -t {testset} -l en-de --echo ref > {refs / f'newstest{year}.de'}" in msg
    assert "newstest2011" not in msg and "never taken over fewer" in msg
    # a year without generate output
    gens, refs = newstest_files(tmp_path)
    del gens[2013]
    with pytest.raises(bleu_metrics.GenerateOutputError, match="no generate output for newstest2013"):
        bleu_metrics.newstest_average(gens, "de", ref_dir=str(refs))
    (tmp_path / "b").mkdir()
    gens, refs = newstest_files(tmp_path / "b", skip_ref=(2015,))
    # no reference folder: sacreBLEU's own test sets (wmt14/full for 2014); offline, a clear error
    from sacrebleu.dataset.base import Dataset

    asked = []

    def offline(self, langpair):
        asked.append((self.name, langpair))
        raise OSError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(Dataset, "get_reference_files", offline)  # no network in tests
    with pytest.raises(bleu_metrics.MissingReferenceError) as err:
        bleu_metrics.newstest_average(gens, "de", ref_dir=None)
    assert asked == [(f"wmt{y % 100}" if y != 2014 else "wmt14/full", "en-de") for y in range(2010, 2017)]
    assert "newstest2016: no reference folder given and sacreBLEU could not get its test set wmt16" in str(err.value)
    assert "sacrebleu -t wmt16 -l en-de --echo ref > newstest2016.de" in str(err.value)


# ---- collect_results --------------------------------------------------------------------------

def make_run(root, name, score=None, log="", checkpoint=True, metric="tokenized_bleu", beam=None, which="best"):
    run = root / "iwslt14" / name
    run.mkdir(parents=True)
    (run / "train.log").write_text(log)
    if checkpoint:
        (run / "checkpoint_last.pt").write_bytes(b"")
    if score is not None:
        (run / "eval").mkdir()
        decoded = {} if beam is None else {  # as scripts/evaluate.sh records it
            "generation": {"beam": beam, "lenpen": 1.0, "max_len_a": 1.2, "max_len_b": 10},
            "checkpoint": {"path": str(run / f"checkpoint_{which}.pt"), "averaged": None}}
        (run / "eval" / "test.json").write_text(json.dumps({
            "metrics": {metric: {"score": score, "signature": "nrefs:1|case:lc|tok:none",
                                 "description": "tokenized lowercased BLEU"}},
            "primary_metric": metric, **decoded}))
    return run


def test_a_checkpoint_is_checked_against_the_run_directory_it_is_evaluated_for(tmp_path):
    """evaluate.sh's check (scripts/residual_studies/shell.py): a checkpoint's scheme (a stock fairseq model's
    from encoder_normalize_before), encoder depth and seed against the run directory's name; what a checkpoint
    does not record is not compared; a folder that is not a run name is not checked."""
    from argparse import Namespace

    import fairseq_residual  # noqa: F401  (the safe loader's allow-list)
    from residual_studies.shell import checkpoint_fits_run

    plugin, stock = tmp_path / "plugin.pt", tmp_path / "stock.pt"
    torch.save({"cfg": {"model": {"residual_scheme": "resi_dual", "encoder_layers": 6}, "common": {"seed": 2},
                        "task": {}}, "model": {}}, plugin)
    torch.save({"args": Namespace(arch="transformer", encoder_normalize_before=True, encoder_layers=6), "model": {}},
               stock)
    assert checkpoint_fits_run(str(plugin), "resi_dual-6L-seed2") == ""
    for name in ("pre_ln-6L-seed2", "resi_dual-12L-seed2", "resi_dual-6L-seed3"):
        assert checkpoint_fits_run(str(plugin), name).startswith(
            f"{plugin} holds a resi_dual model with 6 encoder layers, seed 2, but the run directory {name} is ")
    assert checkpoint_fits_run(str(stock), "pre_ln-6L-seed9") == ""  # no seed saved: not compared
    assert checkpoint_fits_run(str(stock), "post_ln-6L-seed1").startswith(f"{stock} holds a pre_ln model with 6 "
                                                                          "encoder layers, but the run directory")
    assert checkpoint_fits_run(str(plugin), "my-run") == ""
    # a file that is no checkpoint, or a truncated one: one line through the tool, not torch's traceback
    from residual_studies.shell import main

    (tmp_path / "text.pt").write_text("not a checkpoint")
    (tmp_path / "truncated.pt").write_bytes(plugin.read_bytes()[:200])
    torch.save({"encoder.embed_tokens.weight": torch.zeros(2, 2)}, tmp_path / "state_dict.pt")  # no settings
    for name, reason in (
            ("text.pt", f"cannot read the checkpoint {tmp_path / 'text.pt'} (UnpicklingError: no file torch.save wrote"),
            ("truncated.pt", f"checkpoint {tmp_path / 'truncated.pt'} is truncated (200 bytes; cut short while it was "
                             f"written, e.g. by a kill during a save): evaluate a complete one (--checkpoint best, "
                             f"last or a file) (no complete checkpoint is beside it)"),
            ("state_dict.pt", f"cannot read the checkpoint {tmp_path / 'state_dict.pt'}: it saved no settings")):
        for command in ("checkpoint-fits-run", "checkpoint-langs"):
            with pytest.raises(SystemExit) as exit_:
                main([command, str(tmp_path / name), "resi_dual-6L-seed2"][:3 if command.endswith("run") else 2])
            assert str(exit_.value).startswith(reason), exit_.value
            assert "\n" not in str(exit_.value)


def test_collect_results_names_runs_decoded_differently(tmp_path, capsys):
    """A table whose runs were evaluated with different beams or checkpoints says so and names them; one
    evaluated alike states the settings once; a root that does not exist is one line, not a traceback."""
    make_run(tmp_path / "alike", "pre_ln-2L-seed1", 10.0, beam=5)
    make_run(tmp_path / "alike", "resi_dual-2L-seed1", 11.0, beam=5)
    text = collect_results.report(collect_results.find_runs([str(tmp_path / "alike" / "iwslt14")]))
    assert "Decoded with beam 5, lenpen 1.0, max length 1.2x+10, checkpoint_best.pt." in text
    assert "like for like" not in text
    make_run(tmp_path / "mixed", "pre_ln-2L-seed1", 10.0, beam=2, which="last")
    make_run(tmp_path / "mixed", "resi_dual-2L-seed1", 11.0, beam=5)
    make_run(tmp_path / "mixed", "post_ln-2L-seed1", 9.0)  # a result without its settings
    text = collect_results.report(collect_results.find_runs([str(tmp_path / "mixed" / "iwslt14")]))
    assert ("**Decoded with different settings, so these cells do not compare like for like:** beam 2, lenpen 1.0, "
            "max length 1.2x+10, checkpoint_last.pt (`pre_ln-2L-seed1`); beam 5, lenpen 1.0, max length 1.2x+10, "
            "checkpoint_best.pt (`resi_dual-2L-seed1`); settings not recorded (`post_ln-2L-seed1`).") in text
    # only the runs of the table count: the 2+2 table without the 6+6 run decoded otherwise
    make_run(tmp_path / "mixed", "pre_ln-6L-seed1", 12.0, beam=1)
    runs = collect_results.find_runs([str(tmp_path / "mixed" / "iwslt14")])
    assert "`pre_ln-6L-seed1`" not in collect_results.report(runs, depths=[2])
    with pytest.raises(SystemExit) as exit_:
        collect_results.main([str(tmp_path / "nowhere")])
    assert str(exit_.value) == (f"collect_results.py: error: {tmp_path / 'nowhere'} is not a directory: give "
                                "SAVE_ROOT/<benchmark> folders (or SAVE_ROOT)")


@pytest.mark.slow
def test_score_bleu_script_names_a_missing_newstest_reference(tmp_path):
    """The script itself: one line naming the year and the command that fetches it, exit status != 0, no
    traceback, no result file."""
    gens, refs = newstest_files(tmp_path, skip_ref=(2015,))
    proc = subprocess.run([sys.executable, SCRIPTS / "score_bleu.py", "--benchmark", "wmt14",
                           "--generate", gens[2014], "--target-lang", "de",
                           "--raw-ref", refs / "newstest2014.de", "--newstest-refs", refs,
                           "--newstest-generate", *[f"{y}={p}" for y, p in gens.items()],
                           "--out", tmp_path / "x.json"], env=cli_env(), capture_output=True, text=True)
    assert proc.returncode != 0 and "newstest2015: reference" in proc.stderr
    assert "sacrebleu -t wmt15 -l en-de --echo ref" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_collect_results_table_keeps_diverged_runs(tmp_path):
    done = "[fairseq_cli.train][INFO] - done training in 100.0 seconds\n"
    for seed, s in zip((1, 2, 3), (35.0, 35.5, 36.1)):
        make_run(tmp_path, f"post_ln-6L-seed{seed}", s, done)
    make_run(tmp_path, "resi_dual-6L-seed1", 36.0, done)
    make_run(tmp_path, "resi_dual-6L-seed2", 36.4, done)
    make_run(tmp_path, "resi_dual-6L-seed3", None,
             "[fairseq.trainer][INFO] - NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 0.5\n"
             "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding.\n")
    make_run(tmp_path, "post_ln-12L-seed1", 5.0,
             "[train_inner][INFO] - epoch 003:  50 / 1100 loss=nan, nll_loss=nan, ppl=nan, wps=1\n" + done)
    make_run(tmp_path, "post_ln-12L-seed2", None,
             "[train][INFO] - epoch 001 | loss 9.1\nTraceback (most recent call last):\n  ...\n"
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", checkpoint=False)
    make_run(tmp_path, "pre_ln-12L-seed1", 34.9, "| epoch 001 | loss 7.2 | nll_loss 6.1\n" + done)
    make_run(tmp_path, "pre_ln-6L-seed1", None, "[train_inner][INFO] - epoch 001: loss=9.1\n")  # running

    by_bench = collect_results.find_runs([str(tmp_path)])
    status = {r["run_dir"].rsplit("/", 1)[1]: r["status"] for r in by_bench["iwslt14"]}
    assert status == {
        "post_ln-6L-seed1": "ok", "post_ln-6L-seed2": "ok", "post_ln-6L-seed3": "ok",
        "resi_dual-6L-seed1": "ok", "resi_dual-6L-seed2": "ok", "resi_dual-6L-seed3": "diverged",
        "post_ln-12L-seed1": "diverged", "post_ln-12L-seed2": "failed",
        "pre_ln-12L-seed1": "ok", "pre_ln-6L-seed1": "incomplete",
    }
    md_file = tmp_path / "table.md"
    collect_results.main([str(tmp_path / "iwslt14"), "--seeds", "1,2,3", "--out", str(md_file),
                          "--json", str(tmp_path / "runs.json")])
    text = md_file.read_text()
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in text.splitlines() if line.startswith("| ") and "scheme" not in line}
    # each depth: your cell, the paper's number, the difference (the paper's IWSLT14 table)
    assert text.count("| scheme | 6+6 layers | paper 6+6 | Δ | 12+12 layers | paper 12+12 | Δ |") == 1
    rows = {k: v[0::3] for k, v in cells.items()}
    paper = {k: v[1::3] for k, v in cells.items()}
    delta = {k: v[2::3] for k, v in cells.items()}
    post = [35.0, 35.5, 36.1]
    # out of memory is a failure of the machine, not a divergence of the scheme (the paper's "fail")
    assert rows["Post-LN"] == [f"{statistics.mean(post):.2f} ± {statistics.stdev(post):.2f}",
                               "failed (1/3); diverged (1/3)"]
    resi = [36.0, 36.4]
    assert rows["ResiDual"][0] == (f"{statistics.mean(resi):.2f} ± {statistics.stdev(resi):.2f} "
                                   f"(n=2; 1/3 diverged)")
    assert rows["ResiDual"][1] == "incomplete (0/3)"  # a grid point of --seeds without any run
    assert rows["Pre-LN"] == ["incomplete", "34.90 (n=1; 2/3 incomplete)"]
    assert list(rows) == ["Post-LN", "Pre-LN", "ResiDual"]
    # arXiv 2304.14802's IWSLT14 numbers: Post-LN 35.37 / fail, Pre-LN 35.12 / 35.18, ResiDual 35.63 / 36.09
    assert paper == {"Post-LN": ["35.37", "fail"], "Pre-LN": ["35.12", "35.18"], "ResiDual": ["35.63", "36.09"]}
    assert delta["Post-LN"] == [f"{statistics.mean(post) - 35.37:+.2f}", "–"]
    assert delta["ResiDual"] == [f"{statistics.mean(resi) - 35.63:+.2f}", "–"]
    assert delta["Pre-LN"] == ["–", f"{34.9 - 35.18:+.2f}"]
    assert "as reported in arXiv 2304.14802" in text and "transcribed" in text
    assert "Paper's BLEU type: not stated in the paper" in text and "tokenized lowercased BLEU" in text
    assert "Minimum loss scale reached" in text
    assert ("`post_ln-12L-seed2`: failed: crashed without a final checkpoint: torch.OutOfMemoryError: CUDA out of "
            "memory. Tried to allocate 2.00 GiB (train.log)") in text
    assert "nan/inf loss" in text
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert len(runs["iwslt14"]) == 10
    # beside the paper's warm-up ablation instead: Post-LN fail / fail, Pre-LN 32.28 / 31.82, ResiDual 35.76 / 35.57
    collect_results.main([str(tmp_path / "iwslt14"), "--seeds", "1,2,3", "--paper-table", "no_warmup",
                          "--out", str(md_file)])
    text = md_file.read_text()
    assert "Its table without warm-up" in text
    assert "| Pre-LN | incomplete | 32.28 | – | 34.90 (n=1; 2/3 incomplete) | 31.82 | +3.08 |" in text
    # --depths 6: the 12+12 runs are neither in the tables nor in the list of runs left out
    collect_results.main([str(tmp_path / "iwslt14"), "--depths", "6", "--out", str(md_file)])
    text = md_file.read_text()
    assert "post_ln-12L" not in text and "`resi_dual-6L-seed3`: diverged" in text


def test_a_crash_reported_in_one_line_is_a_crash(tmp_path):
    """The plugin ends fairseq's tools on a wrong input with one line, ``fairseq-train: error: ...``, instead of a
    traceback: a run that stopped so, without a checkpoint, counts as failed (not diverged), and its failure reason
    is the whole message; the same log without it counts as running."""
    from residual_studies.divergence import classify, run_dir_divergence, run_dir_failure

    head = "[train][INFO] - epoch 001 | loss 9.1\n"
    error = ("fairseq-train: error: checkpoint x.pt is truncated (10 bytes) (FAIRSEQ_RESIDUAL_FULL_ERROR=1 shows the "
             "traceback)")
    crashed = make_run(tmp_path, "post_ln-12L-seed1", None, head + error + "\n", checkpoint=False)
    assert run_dir_divergence(crashed) is None  # no sign of divergence: a failure
    assert run_dir_failure(crashed) == f"crashed without a final checkpoint: {error} (train.log)"
    assert classify(1, head + error + "\n", None) == ("failed", f"fairseq-train exit status 1: {error}")
    assert run_dir_failure(make_run(tmp_path, "post_ln-12L-seed2", None, head, checkpoint=False)) is None
    finished = make_run(tmp_path, "post_ln-12L-seed3", None, head + error + "\n", checkpoint=True)
    assert run_dir_failure(finished) is None  # a final checkpoint: resumable, not failed
    # fairseq-hydra-train: Hydra's line, then the message alone (no traceback), then its HYDRA_FULL_ERROR hint
    message = "data directory /d does not exist: pass the --destdir of fairseq-preprocess"
    hydra = make_run(tmp_path, "post_ln-12L-seed4", None, head + "Error executing job with overrides: ['task.data=/d']"
                     f"\n{message}\n\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n",
                     checkpoint=False)
    assert run_dir_failure(hydra) == f"crashed without a final checkpoint: {message} (train.log)"
    traced = make_run(tmp_path, "post_ln-12L-seed5", None, head + "Error executing job with overrides: []\n"
                      "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'x'\n", checkpoint=False)
    assert run_dir_failure(traced) == "crashed without a final checkpoint: KeyError: 'x' (train.log)"


def test_the_papers_numbers_stand_beside_the_comparable_metric_only(tmp_path):
    """WMT14: the paper's average over newstest2010-2016 is read against sacrebleu_newstest2010_2016_avg, not against
    the newstest2014-only metrics; OPUS-100: each direction's average against the paper's column of that
    direction."""
    def run(bench, name, metrics):
        folder = tmp_path / bench / name
        (folder / "eval").mkdir(parents=True)
        (folder / "train.log").write_text("[fairseq_cli.train][INFO] - done training in 1.0 seconds\n")
        (folder / "eval" / "test.json").write_text(json.dumps({"metrics": {
            k: {"score": v, "signature": "x", "description": k} for k, v in metrics.items()}}))

    run("wmt14", "pre_ln-6L-seed1", {"tokenized_bleu_compound_split": 27.5, "sacrebleu_newstest2010_2016_avg": 26.0})
    run("opus100", "resi_dual-18L-seed1", {"sacrebleu_en_xx_avg": 28.0, "sacrebleu_xx_en_avg": 33.0})
    text = collect_results.report(collect_results.find_runs([str(tmp_path / "wmt14"), str(tmp_path / "opus100")]))
    tables = {t.split("\n")[0]: t for t in text.split("### ")[1:]}
    # arXiv 2304.14802: WMT Pre-LN 6+6 26.10; OPUS-100 ResiDual 18+18 en->xx 28.7, xx->en 33.4
    assert "| Pre-LN | 26.00 | 26.10 | -0.10 |" in tables["wmt14: sacrebleu_newstest2010_2016_avg"]
    split = tables["wmt14: tokenized_bleu_compound_split"]
    assert "| Pre-LN | 27.50 |" in split and "paper" not in split.split("| scheme")[1] and "Δ" not in split
    assert "comparable with sacrebleu_newstest2010_2016_avg only" in split
    assert "| ResiDual | 28.00 | 28.70 | -0.70 |" in tables["opus100: sacrebleu_en_xx_avg"]
    assert "| ResiDual | 33.00 | 33.40 | -0.40 |" in tables["opus100: sacrebleu_xx_en_avg"]
    assert "Read against its xx-en column" in tables["opus100: sacrebleu_xx_en_avg"]


def test_collect_results_without_paper_numbers(tmp_path):
    """A benchmark the paper does not have (the demo corpus) gets no paper columns."""
    done = "[fairseq_cli.train][INFO] - done training in 100.0 seconds\n"
    make_run(tmp_path, "post_ln-6L-seed1", 5.0, done)
    (tmp_path / "iwslt14").rename(tmp_path / "ding")
    md_file = tmp_path / "table.md"
    collect_results.main([str(tmp_path / "ding"), "--out", str(md_file)])
    text = md_file.read_text()
    assert "| scheme | 6+6 layers |" in text and "paper" not in text
    assert "| Post-LN | 5.00 |" in text

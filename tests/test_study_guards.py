"""Study options that would give a wrong result and report it as right are refused before anything is made:

* extra fairseq-train options that contradict a cell's own settings (the cell would be filed under one scheme,
  depth, seed or recipe and trained as another);
* duplicates in list options (one run counted twice);
* numbers out of range (a negative learning rate, dropout 1, ...);
* ``--device cuda`` / ``--gpu`` without a GPU (the run would go to the CPU and be reported as a GPU run);
* the error for a study folder prepared with other settings names what the user can do.
"""
import pytest

from conftest import write_corpus_head
from residual_studies import cell, claims, demo, depth_study, grid
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
def test_cuda_without_a_gpu_is_refused(tmp_path):
    with pytest.raises(ToolError, match=r"--device cuda.*no CUDA GPU"):
        grid.start(claims_args("--out", tmp_path / "study", "--device", "cuda"), print)
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

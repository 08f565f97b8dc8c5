"""Errors a user meets outside the model's maths: the plugin loaded twice under two module names, and
every ``--arch`` preset function given invalid residual constants (the ``_<scheme>`` variants call the same
functions; every scheme's options against their ranges: tests/test_conformance.py)."""
import math
import re
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import REPO, USER_DIR, VENV_BIN, build_model, cli_env, make_dictionary
from fairseq_residual.model import MODEL_NAME, PRESETS

SMALL = ["--encoder-layers", 1, "--decoder-layers", 1, "--encoder-embed-dim", 16, "--decoder-embed-dim", 16,
         "--encoder-ffn-embed-dim", 16, "--decoder-ffn-embed-dim", 16, "--encoder-attention-heads", 2,
         "--decoder-attention-heads", 2]
INVALID = [
    ("--resi-dual-scale", 0, "--resi-dual-scale (model.resi_dual_scale) must be in [0.01, 1]"),
    ("--decoder-resi-dual-scale", 2.0, "--decoder-resi-dual-scale (model.decoder_resi_dual_scale) must be in [0.01, 1]"),
    ("--decoder-resi-dual-alpha", math.inf, "--decoder-resi-dual-alpha (model.decoder_resi_dual_alpha) must be in [0, 10]"),
]
DICTIONARY = make_dictionary()


@pytest.mark.parametrize("arch", list(PRESETS) + [f"{MODEL_NAME}_tiny"])
@pytest.mark.parametrize("flag, value, message", INVALID, ids=[f"{f}={v}" for f, v, _ in INVALID])
def test_every_preset_refuses_invalid_resi_dual_constants(flag, value, message, arch):
    """No preset substitutes its own default for an explicit invalid value (opus100's c = 0.05 did)."""
    with pytest.raises(ValueError) as err:
        build_model(arch, "--residual-scheme", "resi_dual", *SMALL, flag, value, dictionary=DICTIONARY)
    assert message in str(err.value), (arch, str(err.value))


def test_opus100_preset_default_and_explicit_scale():
    """The OPUS-100 preset's c = 0.05 is ResiDual's (the authors' fp16 setting); other schemes keep
    ResiDual's options at their defaults, so the preset does not trip their refusal of ResiDual options."""
    d = make_dictionary()
    model, args, _ = build_model("residual_transformer_opus100", *SMALL, dictionary=d)
    assert args.resi_dual_scale == 0.05 and model.encoder.residual.dual_scale == 0.05
    model, args, _ = build_model("residual_transformer_opus100", *SMALL, "--resi-dual-scale", 1, dictionary=d)
    assert model.encoder.residual.dual_scale == 1.0
    model, args, _ = build_model("residual_transformer_opus100_post_ln", *SMALL, dictionary=d)
    assert args.resi_dual_scale == 1.0 and model.residual_scheme == "post_ln"


@pytest.mark.slow  # a fresh interpreter: this one has loaded the plugin
def test_second_copy_of_the_plugin_is_refused_with_both_paths(tmp_path):
    copy = tmp_path / "fairseq_residual2"
    shutil.copytree(USER_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); import fairseq_residual\n"
        "from fairseq import options, utils\n"
        f"utils.import_user_module(type('A', (), {{'user_dir': {str(copy)!r}}})())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    err = proc.stderr
    assert "DuplicatePluginError" in err and "Cannot register duplicate" not in err, err[-2000:]
    assert f"as module 'fairseq_residual2' from {copy}" in err
    assert f"module 'fairseq_residual' from {USER_DIR} already registered the model 'residual_transformer'" in err
    assert "Load one copy only" in err


def test_stock_transformer_checkpoint_loads_into_matching_scheme(tiny_data_bin, tmp_path):
    """docs/usage.md's command: a stock ``--arch transformer_tiny`` checkpoint (Post-LN) runs as
    ``residual_transformer`` with ``--model-overrides "{'_name': 'residual_transformer', ...}"``, with the
    same log-probabilities as fairseq's own model."""
    import torch
    from fairseq import checkpoint_utils

    from conftest import random_batch
    from inprocess import fairseq_main
    from fairseq_residual.model import ResidualTransformerModel

    _, data_bin = tiny_data_bin
    save = tmp_path / "stock"
    fairseq_main("fairseq-train", data_bin, "--arch", "transformer_tiny", "--optimizer", "adam", "--lr", "1e-3",
             "--max-tokens", 600, "--max-update", 2, "--save-dir", save, "--no-epoch-checkpoints",
             "--required-batch-size-multiple", 1, "--disable-validation", "--num-workers", 0)
    path = str(save / "checkpoint_last.pt")
    (stock,), _, task = checkpoint_utils.load_model_ensemble_and_task([path])
    overrides = {"_name": "residual_transformer", "residual_scheme": "post_ln"}
    # as fairseq-generate does: the task comes from the command line, the overrides reach the model
    (ours,), _, _ = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides, task=task)
    assert isinstance(ours, ResidualTransformerModel) and ours.residual_scheme == "post_ln"
    assert not isinstance(stock, ResidualTransformerModel)
    stock.eval(), ours.eval()
    src, lengths, prev, _ = random_batch(task.source_dictionary, bsz=3)
    with torch.no_grad():
        a = stock.get_normalized_probs(stock(src, lengths, prev), log_probs=True)
        b = ours.get_normalized_probs(ours(src, lengths, prev), log_probs=True)
    assert (a - b).abs().max().item() <= 1e-5
    gen = fairseq_main("fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", path, "--beam", 2,
                       "--required-batch-size-multiple", 1, "--model-overrides", repr(overrides))
    assert gen.count("\nH-") == 24 and "Generate test with beam=2" in gen


def test_ddp_check_without_torchrun_says_how_to_run_it(monkeypatch, capsys):
    import ddp_check

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit) as exit_:
        ddp_check.main(["--out", "ddp.json"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "RANK and WORLD_SIZE are not set: run it under torchrun" in err
    assert "torchrun --nproc_per_node 2 scripts/ddp_check.py" in err


@pytest.mark.parametrize("option, value, message", [("--updates", "0", "must be at least 1, got 0"),
                                                    ("--lr", "0", "must be above 0, got 0"),
                                                    ("--warmup", "-1", "must be at least 0, got -1")])
def test_precision_check_refuses_values_it_cannot_run(option, value, message, capsys):
    import precision_check

    with pytest.raises(SystemExit) as exit_:
        precision_check._args([option, value, "--out", "x.json"])
    assert exit_.value.code == 2
    assert f"argument {option}: {message}" in capsys.readouterr().err


def test_speed_benchmark_gives_the_caller_its_logging_back():
    """The speed benchmark quiets logging and warnings while it runs: a refusal after that point leaves the
    in-process caller's logging and warning filters as they were."""
    import logging
    import warnings

    from residual_studies import speed

    filters = list(warnings.filters)
    with pytest.raises(SystemExit, match="fp16 needs --device cuda"):
        speed.main(["--device", "cpu", "--dtype", "fp16", "--shapes", "tiny"])
    assert logging.root.manager.disable == logging.NOTSET
    assert warnings.filters == filters


def _parse_speed(argv):
    from residual_studies import speed

    speed.get_parser().parse_args(argv)


def _parse_claims(argv):
    from residual_studies import claims

    claims.parse_args(argv)


def _parse_precision(argv):
    import precision_check

    precision_check._args([*argv, "--out", "x.json"])


def _parse_ddp(argv):
    import ddp_check

    ddp_check.main([*argv, "--out", "ddp.json"])


def _parse_device(argv):
    import device_check

    device_check.main([*argv, "--out", "device.json"])


@pytest.mark.parametrize("parse", [_parse_speed, _parse_claims, _parse_precision, _parse_ddp, _parse_device],
                         ids=["speed_benchmark", "claims_study", "precision_check", "ddp_check", "device_check"])
def test_device_cuda_without_a_gpu_is_refused_at_parsing(parse, monkeypatch, capsys):
    """Every tool's --device cuda on a machine where torch sees no GPU stops at parsing, naming the fix,
    instead of running on the CPU and writing "device": "cuda" into its report."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(SystemExit) as exit_:
        parse(["--device", "cuda"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --device: cuda: torch sees no such CUDA GPU on this machine" in err
    assert "use --device cpu" in err


def test_a_missing_or_wrong_data_directory_is_named_with_its_fix(tmp_path, monkeypatch):
    """fairseq's TranslationTask.setup_task (every fairseq tool, and the plugin's task built on it) checks the data
    folder first: a missing folder, a file, a folder without dictionaries, a language pair it has no dictionary
    for; a preprocessed folder sets the task up as before, also when a later shard is not on this machine."""
    import argparse

    from fairseq.tasks.translation import TranslationTask

    def cfg(data, src=None, tgt=None):
        return argparse.Namespace(data=data, source_lang=src, target_lang=tgt)

    monkeypatch.chdir(tmp_path)
    for none in (None, ""):  # fairseq-hydra-train without task.data: not split_paths' TypeError
        with pytest.raises(FileNotFoundError, match=r"^no data directory given: pass the --destdir of fairseq-preprocess "
                                                    r"\(task.data=<path> under fairseq-hydra-train\)$"):
            TranslationTask.setup_task(cfg(none))
    with pytest.raises(FileNotFoundError, match=rf"^data directory nope \(relative to {tmp_path}\) does not exist: "
                                                r"pass the --destdir of fairseq-preprocess \(task.data=<path> under "
                                                r"fairseq-hydra-train\)$"):
        TranslationTask.setup_task(cfg("nope"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"data directory .*afile is a file, not a folder"):
        TranslationTask.setup_task(cfg(str(tmp_path / "afile")))
    with pytest.raises(FileNotFoundError, match=r"has no dictionary \(dict.<lang>.txt\) \(it holds: afile\)"):
        TranslationTask.setup_task(cfg(str(tmp_path)))
    make_dictionary().save(str(tmp_path / "dict.de.txt"))
    make_dictionary().save(str(tmp_path / "dict.en.txt"))
    with pytest.raises(FileNotFoundError, match=r"has no dict.fr.txt \(it holds: afile, dict.de.txt, dict.en.txt\)"):
        TranslationTask.setup_task(cfg(str(tmp_path), "fr", "en"))
    task = TranslationTask.setup_task(cfg(str(tmp_path), "de", "en"))
    assert len(task.source_dictionary) == len(make_dictionary())
    # a shard after the first is read with the training split, as stock fairseq does: not required here
    task = TranslationTask.setup_task(cfg(f"{tmp_path}:{tmp_path / 'shard1'}", "de", "en"))
    assert len(task.target_dictionary) == len(make_dictionary())


def test_a_model_name_no_registry_knows_is_refused_with_the_closest(monkeypatch):
    """Hydra's model._name is not checked against the --arch choices; stock fairseq then ends on KeyError
    "'_name'" while formatting the config for its assertion. A known name builds as before."""
    from fairseq import models
    from omegaconf import OmegaConf

    from fairseq_residual.user_errors import SettingError

    cfg = OmegaConf.create({"_name": "residual_transformer_tin", "dropout": 0.1})
    OmegaConf.set_struct(cfg, True)
    with pytest.raises(SettingError, match=r"^model\._name=residual_transformer_tin \(--arch\) is no model or "
                                           r"architecture fairseq knows \(did you mean residual_transformer_tiny\?\): "
                                           r"this plugin's are residual_transformer, .* a model of another plugin "
                                           r"needs its --user-dir"):
        models.build_model(cfg, None)
    model, _, _ = build_model("residual_transformer_tiny", *SMALL, dictionary=DICTIONARY)  # through the same call
    assert model.residual_scheme == "resi_dual"


def test_a_data_directory_without_its_splits_or_with_one_cut_short_is_named(tiny_data_bin, tmp_path, monkeypatch):
    """Dictionaries but no binarized split (stock: "Could not infer language pair"; with -s/-t: "Dataset not found:
    valid"); a .bin file shorter than its index (stock: numpy's "offset must be ... no greater than buffer length",
    raised while the first batch is read)."""
    from inprocess import fairseq_main

    from fairseq_residual.user_errors import user_message

    _, data_bin = tiny_data_bin
    train = ["--user-dir", USER_DIR, "--arch", "residual_transformer_tiny", "--optimizer", "adam", "--lr", "1e-3",
             "--max-tokens", "500", "--max-update", "2", "--no-save", "--num-workers", "0",
             "--save-dir", tmp_path / "ckpt"]
    dicts = tmp_path / "dicts (copy)"  # parentheses, as fairseq's "Dataset not found: valid (<path>)" has
    dicts.mkdir()
    for d in data_bin.glob("dict.*.txt"):
        shutil.copy(d, dicts)
    with pytest.raises(AssertionError, match=rf"DataDirectoryError: data directory {re.escape(str(dicts))} holds no "
                                             r"binarized split \(<split>.<src>-<tgt>.<lang>.bin and .idx; it holds: "
                                             r"dict.src.txt, dict.tgt.txt\) to infer the language pair from: give "
                                             r"--source-lang / --target-lang .* or, to train or score, binarize"):
        fairseq_main("fairseq-train", dicts, *train)
    for name in ("train.src-tgt.src", "train.src-tgt.tgt"):
        for ext in (".bin", ".idx"):
            shutil.copy(data_bin / (name + ext), dicts)
    with pytest.raises(AssertionError, match=rf"DataDirectoryError: data directory {re.escape(str(dicts))} has no "
                                             r"'valid' split \(.*; it holds: dict.src.txt, dict.tgt.txt, "
                                             r"train.src-tgt.src.bin, .*\): binarize it with fairseq-preprocess "
                                             r"--validpref, or choose a split"):
        fairseq_main("fairseq-train", dicts, "-s", "src", "-t", "tgt", *train)
    with pytest.raises(AssertionError, match=r"has no 'valid1' split .*: binarize it with a second, comma-separated "
                                             r"fairseq-preprocess --validpref"):
        fairseq_main("fairseq-train", dicts, "-s", "src", "-t", "tgt", *train, "--valid-subset", "valid1")
    with pytest.raises(AssertionError, match=r"has no 'valid' split \(<split>.<src>-<tgt>.<lang>, text \(--dataset-impl "
                                             r"raw\); .*\): binarize it with fairseq-preprocess --validpref, with "
                                             r"--dataset-impl raw, or choose"):
        fairseq_main("fairseq-train", dicts, "-s", "src", "-t", "tgt", *train, "--dataset-impl", "raw")
    cut = tmp_path / "cut"
    shutil.copytree(data_bin, cut)
    binary = cut / "train.src-tgt.src.bin"
    binary.write_bytes(binary.read_bytes()[:binary.stat().st_size // 2])
    with pytest.raises(AssertionError) as raised:
        fairseq_main("fairseq-train", cut, *train)
    monkeypatch.setattr(sys, "argv", ["/venv/bin/fairseq-train"])
    assert user_message(raised.value.__cause__) == (
        f"the binarized file {cut}/train.src-tgt.src.bin is shorter than its index ({cut}/train.src-tgt.src.idx) "
        f"says: cut short (a kill, a full disk, an incomplete copy) after fairseq-preprocess wrote it; binarize the "
        f"text again with fairseq-preprocess")


def test_user_input_errors_are_one_message_and_keep_their_builtin_base(monkeypatch):
    """The plugin's errors about the user's input are reported as ``<tool>: error: <message>``; any other
    exception, and FAIRSEQ_RESIDUAL_FULL_ERROR=1, leave Python's traceback; callers catching the builtin base
    (ValueError, FileNotFoundError, RuntimeError) still catch them."""
    import io

    from fairseq_residual import user_errors
    from fairseq_residual.checkpoint_safety import ForeignCheckpointError, TruncatedCheckpointError
    from fairseq_residual.data_checks import DataDirectoryError
    from fairseq_residual.encoder_decoder import SchemeMismatchError
    from fairseq_residual.norms import NormMismatchError
    from fairseq_residual.schemes.base import OptionError

    for cls, base in [(OptionError, ValueError), (SchemeMismatchError, ValueError), (NormMismatchError, ValueError),
                      (ForeignCheckpointError, ValueError), (TruncatedCheckpointError, RuntimeError),
                      (DataDirectoryError, FileNotFoundError), (user_errors.SettingError, ValueError),
                      (user_errors.MissingFileError, FileNotFoundError),
                      (user_errors.UnavailableHereError, RuntimeError)]:
        assert issubclass(cls, user_errors.UserInputError) and issubclass(cls, base), cls
    monkeypatch.delenv(user_errors.FULL_ERROR_VAR, raising=False)
    out = io.StringIO()
    assert user_errors.report(OptionError("--hc-streams must be in [1, 16], got 0"), "fairseq-train", out)
    assert out.getvalue() == ("fairseq-train: error: --hc-streams must be in [1, 16], got 0 "
                              "(FAIRSEQ_RESIDUAL_FULL_ERROR=1 shows the traceback)\n")
    out = io.StringIO()
    assert not user_errors.report(ValueError("a bug"), "fairseq-train", out) and out.getvalue() == ""
    out = io.StringIO()
    assert user_errors.report(KeyboardInterrupt(), "fairseq-train", out) and out.getvalue() == (
        "fairseq-train: interrupted (Ctrl-C); the same command resumes from the newest complete checkpoint in its "
        "--save-dir (the updates since that save are trained again)\n")
    out = io.StringIO()
    assert user_errors.report(KeyboardInterrupt(), "fairseq-generate", out)
    assert out.getvalue() == "fairseq-generate: interrupted (Ctrl-C)\n"
    out = io.StringIO()
    monkeypatch.setenv(user_errors.FULL_ERROR_VAR, "1")
    assert not user_errors.report(OptionError("x"), "fairseq-train", out) and out.getvalue() == ""
    monkeypatch.setenv(user_errors.FULL_ERROR_VAR, "0")
    assert user_errors.report(OptionError("x"), "fairseq-train", out)
    assert user_errors.tool_name("/venv/bin/fairseq-generate") == "fairseq-generate"
    assert user_errors.tool_name("/venv/lib/python3.11/site-packages/fairseq_cli/train.py") == "fairseq-train"
    assert user_errors.tool_name("/venv/lib/python3.11/site-packages/fairseq_cli/eval_lm.py") == "fairseq-eval-lm"
    # Hydra reports fairseq-hydra-train's errors (in full with HYDRA_FULL_ERROR=1); other programs keep Python's
    for program in ("/venv/bin/fairseq-hydra-train", "/venv/lib/python3.11/site-packages/fairseq_cli/hydra_train.py",
                    "/usr/bin/ipython", "train.py", ""):
        assert user_errors.tool_name(program) is None, program


def test_hydra_reports_a_wrong_input_by_its_message_alone(monkeypatch, capsys):
    """fairseq-hydra-train's jobs end in Hydra's ``run_and_report``: a plugin error is reported by its message,
    without a traceback (Hydra's CompactHydraException), and raised in full with HYDRA_FULL_ERROR=1; any other
    exception keeps Hydra's traceback (the negative control)."""
    from hydra._internal.utils import run_and_report

    from fairseq_residual.data_checks import DataDirectoryError
    from fairseq_residual.schemes.base import OptionError

    def job(error):
        def run():
            raise error
        return run

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    for error in (OptionError("--x (model.x) is wrong: drop model.x"), DataDirectoryError("data directory d is gone")):
        with pytest.raises(SystemExit) as exit_:
            run_and_report(job(error))
        assert exit_.value.code == 1
        err = capsys.readouterr().err
        assert err.startswith(f"{error}\n") and "Traceback" not in err, err
    with pytest.raises(SystemExit):
        run_and_report(job(ValueError("a stock error")))
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(OptionError):
        run_and_report(job(OptionError("x")))


@pytest.mark.slow
def test_fairseq_train_ends_on_a_wrong_input_with_one_message(tmp_path):
    """A real fairseq-train on a missing data directory: the message and its fix, exit status 1, no
    traceback; FAIRSEQ_RESIDUAL_FULL_ERROR=1 brings the traceback back."""
    command = [str(VENV_BIN / "fairseq-train"), str(tmp_path / "nope"), "--user-dir", USER_DIR, "--task",
               "translation", "--arch", MODEL_NAME + "_tiny", "--cpu", "--max-tokens", "512"]
    proc = subprocess.run(command, env=cli_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "UserWarning" not in proc.stderr, proc.stderr[:3000]  # Hydra's deprecations about fairseq's code
    assert proc.stderr.endswith(f"fairseq-train: error: data directory {tmp_path / 'nope'} does not exist: pass the "
                                "--destdir of fairseq-preprocess (task.data=<path> under fairseq-hydra-train) "
                                "(FAIRSEQ_RESIDUAL_FULL_ERROR=1 shows the traceback)\n"), proc.stderr[-3000:]
    proc = subprocess.run(command, env={**cli_env(), "FAIRSEQ_RESIDUAL_FULL_ERROR": "1"}, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.rstrip().endswith(f"DataDirectoryError: data directory {tmp_path / 'nope'} does not exist: pass "
                                         "the --destdir of fairseq-preprocess (task.data=<path> under "
                                         "fairseq-hydra-train)"), proc.stderr[-3000:]
    hydra = [str(VENV_BIN / "fairseq-hydra-train"), "--config-dir", str(REPO / "configs"), "--config-name",
             "iwslt14_de_en", f"task.data={tmp_path / 'nope'}", f"common.user_dir={USER_DIR}", "common.cpu=true",
             f"hydra.run.dir={tmp_path / 'hydra'}"]
    proc = subprocess.run(hydra, env=cli_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (f"\ndata directory {tmp_path / 'nope'} does not exist: pass the --destdir of fairseq-preprocess "
            "(task.data=<path> under fairseq-hydra-train)\n") in proc.stderr, proc.stderr[-3000:]


def test_a_checkpoint_of_other_shapes_is_refused_naming_the_tensors():
    """A model built with another number of residual streams than its checkpoint (fairseq-generate's
    --model-overrides "{'hc_streams': 3}" on a 2-stream checkpoint): one error naming the first tensors and the
    fix, instead of PyTorch's list of every mismatch; the same shapes load."""
    from fairseq_residual.user_errors import SettingError

    small = ["--residual-scheme", "hyper_connections", *SMALL]
    two, _, _ = build_model(MODEL_NAME, *small, "--hc-streams", 2, dictionary=DICTIONARY)
    three, _, _ = build_model(MODEL_NAME, *small, "--hc-streams", 3, dictionary=DICTIONARY)
    with pytest.raises(SettingError, match=r"^the checkpoint does not fit this model: encoder\.layers\.0\.\S+ is "
                                           r"\(2, 3\) in the checkpoint, \(3, 4\) in this model; .* \(\d+ tensors\)\. "
                                           r".*drop the keys that change shapes .* from --model-overrides"):
        three.load_state_dict(two.state_dict())
    # the same model on data of another dictionary: named as such, not as a setting
    other, _, _ = build_model(MODEL_NAME, *small, "--hc-streams", 2, dictionary=make_dictionary(30))
    with pytest.raises(SettingError, match=r"^the checkpoint's dictionary is not the data's: encoder's embedding has "
                                           r"44 rows in the checkpoint, 34 with the dictionaries of this data "
                                           r"directory\. Pass the data directory"):
        other.load_state_dict(two.state_dict())
    # a setting that adds or removes parameters (no dynamic weights): one error naming them, not PyTorch's list
    static, _, _ = build_model(MODEL_NAME, *small, "--hc-streams", 2, "--hc-static", dictionary=DICTIONARY)
    with pytest.raises(SettingError, match=r"^the checkpoint does not fit this model: the checkpoint has \S+dynamic"
                                           r"\S+, .* that this model lacks\. .*drop the keys that add or remove "
                                           r"parameters \(a scheme's option such as hc_dynamic\)"):
        static.load_state_dict(two.state_dict())
    twin, _, _ = build_model(MODEL_NAME, *small, "--hc-streams", 2, dictionary=DICTIONARY)
    twin.load_state_dict(two.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(twin.state_dict().values(), two.state_dict().values()))


def test_a_model_overrides_key_nothing_reads_is_refused():
    """fairseq sets every --model-overrides key on the model configuration a checkpoint saved as a Namespace, where
    a misspelt one is read by nobody: refused by name with the closest key; the model's options, the keys of
    fairseq's other configuration sections and the sections themselves pass."""
    from argparse import Namespace

    from fairseq_residual.config import check_override_keys
    from fairseq_residual.model import ResidualTransformerModel
    from fairseq_residual.user_errors import SettingError

    cfg = {"_name": None, "model": Namespace(arch="residual_transformer_tiny", lr=[1e-3]),
           "task": {"_name": "translation", "data": "bin", "source_lang": "de"}, "bpe": None}
    known = ResidualTransformerModel.known_model_keys()
    check_override_keys({"hc_streams": 2, "dropout": 0.2, "data": "other", "bpe": "sentencepiece",
                         "task": {"data": "x"}, "_name": "residual_transformer"}, cfg, known)
    with pytest.raises(SettingError, match=r"^--model-overrides 'hc_stream' \(did you mean 'hc_streams'\?\), "
                                           r"'zzz': no options of this checkpoint's model or of fairseq, so fairseq "
                                           r"would ignore them"):
        check_override_keys({"zzz": 1, "hc_stream": 3, "dropout": 0.1}, cfg, known)
    with pytest.raises(SettingError, match=r"^--model-overrides 'task.dat' \(did you mean 'task.data'\?\): no option"):
        check_override_keys({"task": {"dat": "x"}}, cfg, known)  # a section's dict: its keys are checked
    with pytest.raises(SettingError, match=r"^--model-overrides \{'model': \{\.\.\.\}\}: this checkpoint saved its model "
                                           r"settings as a Namespace, .* at the top level: \{'dropout': 0\.0\}"):
        check_override_keys({"model": {"dropout": 0.0}}, cfg, known)
    # a model saved as a config (fairseq-hydra-train) takes only the keys it holds
    hydra = dict(cfg, model={"_name": "residual_transformer_tiny", "dropout": 0.1})
    check_override_keys({"dropout": 0.0, "model": {"dropout": 0.0}}, hydra, known)
    with pytest.raises(SettingError, match=r"^--model-overrides 'hc_streams': no option"):
        check_override_keys({"hc_streams": 2}, hydra, known)


def test_only_the_typed_model_overrides_are_checked():
    """fairseq-validate hands the loader every option of its command line as an override too: only the dict
    typed after --model-overrides is checked."""
    from fairseq_residual.checkpoint_safety import typed_model_overrides

    assert typed_model_overrides(["bin", "--model-overrides", "{'dropout': 0.1}", "--task", "translation"]) == {
        "dropout": 0.1}
    assert typed_model_overrides(["bin", "--model-overrides={'a': 1}"]) == {"a": 1}
    assert typed_model_overrides(["bin", "--label-smoothing", "0.1"]) is None
    assert typed_model_overrides(["bin", "--model-overrides", "{'a': x}"]) is None  # fairseq fails on it itself


@pytest.mark.parametrize("saved, loading, training", [
    (["--residual-scheme", "mhc", "--hc-streams", 2],  # a hyper-connections checkpoint, overridden to mhc
     "--hc-streams (model.hc_streams) is an option of --residual-scheme hyper_connections "
     "(model.residual_scheme=hyper_connections), but the model's scheme is mhc: if --model-overrides sets it, drop "
     "it there; if the checkpoint was trained with --residual-scheme hyper_connections and saved it, load it with "
     "its own scheme (drop residual_scheme from --model-overrides)",
     "--hc-streams (model.hc_streams) is an option of --residual-scheme hyper_connections "
     "(model.residual_scheme=hyper_connections), but the model's scheme is mhc: drop --hc-streams or use "
     "--residual-scheme hyper_connections"),
    (["--residual-scheme", "post_ln", "--encoder-normalize-before"],  # a Pre-LN checkpoint, overridden to post_ln
     "--encoder-normalize-before asks for Pre-LN but --residual-scheme is post_ln: a checkpoint saves "
     "encoder_normalize_before=True with the Pre-LN-type scheme it was trained with, so if --model-overrides sets "
     "residual_scheme or encoder_normalize_before, drop it (the checkpoint names its scheme, and its weights are "
     "that scheme's)",
     "--encoder-normalize-before asks for Pre-LN but --residual-scheme is post_ln: the scheme decides where "
     "LayerNorm goes; drop --encoder-normalize-before or use --residual-scheme pre_ln"),
    (["--residual-scheme", "pre_ln", "--norm", "layernorm", "--dyt-alpha", 0.8],  # a DyT checkpoint, norm overridden
     "--dyt-alpha (model.dyt_alpha) is an option of --norm dyt (model.norm=dyt), but the norm is layernorm: if "
     "--model-overrides sets norm or it, drop it there; the checkpoint's weights are those of the norm it was "
     "trained with, which it names",
     "--dyt-alpha (model.dyt_alpha) is an option of --norm dyt (model.norm=dyt), but the norm is layernorm: drop "
     "--dyt-alpha or use --norm dyt"),
], ids=["scheme-option", "normalize-before", "norm-option"])
def test_a_saved_setting_meeting_an_overridden_scheme_names_the_fix_of_each_tool(monkeypatch, saved, loading,
                                                                                  training):
    """fairseq-generate on a checkpoint with --model-overrides "{'residual_scheme': ...}" (or norm): a setting the
    checkpoint saved with its own scheme or norm (a scheme's or norm's option, or the encoder_normalize_before its
    scheme set, never typed) meets the overridden one; the error gives the loading fix alone (there is no flag to drop in fairseq-generate),
    fairseq-train the training fix alone (its options come from its command line, never from a checkpoint)."""
    from fairseq_residual.user_errors import UserInputError

    for tool, message in (("fairseq-generate", loading), ("fairseq-train", training)):
        monkeypatch.setattr(sys, "argv", [f"/venv/bin/{tool}"])
        with pytest.raises(UserInputError) as raised:
            build_model(MODEL_NAME + "_tiny", *saved, dictionary=DICTIONARY)
        assert str(raised.value) == message


def test_an_option_of_another_scheme_typed_at_its_default_is_refused_in_training(monkeypatch):
    """Typed on fairseq-train's command line, an option of another scheme or norm is refused at its default value
    too (it would change nothing, without a word; a value off the default is refused from any source); so is
    fairseq-hydra-train's typed ``model.<key>=``; the same options under their own scheme and norm pass, and so do
    defaults nobody typed (a script's Namespace, a Hydra config's keys)."""
    from fairseq_residual.schemes.base import OptionError

    def build(argv0, typed, *flags):
        monkeypatch.setattr(sys, "argv", [argv0, *typed])
        return build_model(MODEL_NAME + "_tiny", *flags, dictionary=DICTIONARY)

    train = "/venv/bin/fairseq-train"
    for typed, message in [
            (["--hc-streams", "4"], r"--hc-streams \(model.hc_streams\) is an option of --residual-scheme "
                                    r"hyper_connections .*drop --hc-streams or use --residual-scheme hyper_connections$"),
            (["--hc-dynamic"], r"^--hc-dynamic \(model.hc_dynamic\) is an option of --residual-scheme hyper_conn"),
            (["--hc-static"], r"^--hc-static \(model.hc_dynamic=false\) is an option of --residual-scheme hyper_c"),
            (["--dyt-alpha", "0.5"], r"^--dyt-alpha \(model.dyt_alpha\) is an option of --norm dyt \(model.norm=dyt\), "
                                     r"but the norm is layernorm")]:
        flags = ["--residual-scheme", "pre_ln", *typed]
        with pytest.raises(OptionError, match=message):
            build(train, flags, *flags)
    build(train, ["--residual-scheme", "hyper_connections", "--hc-streams", "4"], "--residual-scheme",
          "hyper_connections", "--hc-streams", "4")
    build(train, ["--residual-scheme", "pre_ln", "--norm", "dyt", "--dyt-alpha", "0.5"], "--residual-scheme", "pre_ln",
          "--norm", "dyt", "--dyt-alpha", "0.5")
    build(train, ["--residual-scheme", "pre_ln"], "--residual-scheme", "pre_ln", "--hc-streams", "4")  # not typed
    for program in ("/usr/bin/python3", "/venv/bin/fairseq-generate"):  # a script's own settings; a checkpoint's
        build(program, ["--residual-scheme", "pre_ln", "--hc-streams", "4"], "--residual-scheme", "pre_ln",
              "--hc-streams", "4")

    hydra = "/venv/bin/fairseq-hydra-train"  # the fix in Hydra's terms
    with pytest.raises(OptionError, match=r"^--hc-streams \(model.hc_streams\) is an option of --residual-scheme hyp.*"
                                          r"pre_ln: drop model.hc_streams or use model.residual_scheme=hyper_conn"):
        build(hydra, ["model.residual_scheme=pre_ln", "+model.hc_streams=4"], "--residual-scheme", "pre_ln")
    with pytest.raises(OptionError, match=r"^--hc-static \(model.hc_dynamic=false\) is .*: drop model.hc_dynamic or"):
        build(hydra, [], "--residual-scheme", "pre_ln", "--hc-static")
    with pytest.raises(OptionError, match=r"^--dyt-alpha \(model.dyt_alpha\) is an option of --norm dyt "
                                          r"\(model.norm=dyt\), but the norm is layernorm: drop model.dyt_alpha or "
                                          r"use model.norm=dyt$"):
        build(hydra, ["model.dyt_alpha=0.5"], "--dyt-alpha", "0.5")
    build(hydra, ["model.residual_scheme=pre_ln", "task.data=x"], "--residual-scheme", "pre_ln", "--hc-streams", "4")


def test_a_missing_checkpoint_path_is_named_with_the_checkpoints_beside_it(tmp_path, monkeypatch):
    """fairseq-generate / -interactive / -validate load --path through fairseq's load_model_ensemble: a path that
    does not exist names what its folder holds (complete checkpoints, newest first) or that the folder is missing;
    a folder given as --path names the checkpoints in it."""
    import os

    from fairseq import checkpoint_utils

    from fairseq_residual.user_errors import MissingFileError, SettingError

    save = tmp_path / "checkpoints"
    save.mkdir()
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        torch.save({}, save / name)
    os.utime(save / "checkpoint_best.pt", (1, 1))  # older
    (save / "checkpoint3.pt").write_bytes(b"PK\x03\x04 cut short")  # not complete: not offered
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MissingFileError, match=rf"^checkpoint checkpoints/checkpoint_nope.pt \(relative to {tmp_path}\) "
                                               r"does not exist: checkpoints holds checkpoint_last.pt, "
                                               r"checkpoint_best.pt \(newest first\); pass --path a checkpoint "):
        checkpoint_utils.load_model_ensemble(["checkpoints/checkpoint_nope.pt"])
    with pytest.raises(MissingFileError, match=rf"^checkpoint {tmp_path}/gone/c.pt does not exist: its folder "
                                               rf"{tmp_path}/gone does not exist either; pass --path"):
        checkpoint_utils.load_model_ensemble([str(tmp_path / "gone" / "c.pt")])
    # the save dir itself (stock fairseq: IsADirectoryError after a traceback)
    with pytest.raises(SettingError, match=r"^--path checkpoints is a folder, not a checkpoint: checkpoints holds "
                                           r"checkpoint_last.pt, checkpoint_best.pt \(newest first\); pass --path "
                                           r"checkpoints/checkpoint_best.pt or another of them"):
        checkpoint_utils.load_model_ensemble(["checkpoints"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SettingError, match=r"^--path empty is a folder, not a checkpoint, and it holds no complete "
                                           r"checkpoint; pass --path a checkpoint fairseq-train wrote"):
        checkpoint_utils.load_model_ensemble(["empty"])


def _raise_wrapped(inner):
    """Raise ``inner`` wrapped as fairseq's trainer wraps a checkpoint's errors (trainer.py, load_checkpoint)."""
    try:
        raise inner
    except Exception:
        raise Exception("Cannot load model parameters from checkpoint c.pt; please ensure that the architectures "
                        "match.")


def _worker_trace(inner, wrapped):
    """The text torch.multiprocessing.spawn's worker sends its parent (``traceback.format_exc()``)."""
    import traceback

    try:
        _raise_wrapped(inner) if wrapped else _raise(inner)
    except Exception:
        return traceback.format_exc()


def _raise(exc):
    raise exc


def test_errors_fairseq_hands_on_are_read_through(monkeypatch):
    """fairseq-train --restore-file wraps the plugin's error in a bare Exception; a spawned worker's error reaches
    the parent as torch's ProcessRaisedException holding the worker's traceback text: both are reported as the
    plugin's message (with fairseq's wrapper message after it); a bare Exception around any other error, another
    exception type around the plugin's, and a worker's other error keep Python's traceback."""
    import io

    from torch.multiprocessing.spawn import ProcessRaisedException

    from fairseq_residual import user_errors
    from fairseq_residual.user_errors import SettingError, UnavailableHereError

    monkeypatch.delenv(user_errors.FULL_ERROR_VAR, raising=False)
    wrapper = "Cannot load model parameters from checkpoint c.pt; please ensure that the architectures match."
    wrong = SettingError("--hc-streams must be in [1, 16], got 0")
    for wrapped in (False, True):
        with pytest.raises(Exception) as raised:
            _raise_wrapped(wrong) if wrapped else _raise(wrong)
        worker = ProcessRaisedException(f"\n\n-- Process 1 terminated with the following error:\n"
                                        f"{_worker_trace(wrong, wrapped)}", 1, 4242)
        expected = str(wrong) + (f" (fairseq: {wrapper})" if wrapped else "")
        for exc in (raised.value, worker):
            out = io.StringIO()
            assert user_errors.report(exc, "fairseq-train", out), (wrapped, exc)
            assert out.getvalue() == f"fairseq-train: error: {expected} (FAIRSEQ_RESIDUAL_FULL_ERROR=1 shows the " \
                                     "traceback)\n", (wrapped, exc)
    multi_line = UnavailableHereError("first line\nsecond: line")
    worker = ProcessRaisedException("\n\n-- Process 0 terminated with the following error:\n"
                                     + _worker_trace(multi_line, False), 0, 4242)
    assert user_errors.user_message(worker) == user_errors.user_message(multi_line) == "first line second: line"
    with pytest.raises(Exception) as raised:  # fairseq's wrapper without a message
        try:
            raise wrong
        except SettingError:
            raise Exception
    assert user_errors.user_message(raised.value) == str(wrong)
    # negative controls: Python's traceback stands
    with pytest.raises(Exception) as raised:
        try:
            raise wrong
        except SettingError:
            raise Exception("another failure") from None
    assert user_errors.user_message(raised.value) is None
    with pytest.raises(Exception) as raised:
        _raise_wrapped(ValueError("a bug"))
    assert user_errors.user_message(raised.value) is None
    twice = _worker_trace(wrong, True).rstrip("\n") + (
        "\n\nDuring handling of the above exception, another exception occurred:\n\nTraceback (most recent call "
        "last):\n  File \"x.py\", line 1, in <module>\nException: a second wrapper\n")
    embedded = _worker_trace(RuntimeError("a bug; its log:\n" + _worker_trace(wrong, True)), False)
    for trace in (twice, embedded):  # two wrappers; a plugin error's trace inside another error's message
        worker = ProcessRaisedException("\n\n-- Process 0 terminated with the following error:\n" + trace, 0, 1)
        assert user_errors.user_message(worker) is None, trace
    try:
        try:
            raise wrong
        except SettingError:
            raise RuntimeError("a bug in an except block")
    except RuntimeError as exc:
        assert user_errors.user_message(exc) is None
    for inner, wrapped in ((ValueError("a bug"), False), (ValueError("a bug"), True), (wrong, False)):
        trace = _worker_trace(inner, wrapped)
        if inner is wrong:  # the plugin's error, then a bug while handling it
            trace = trace.rstrip("\n") + ("\n\nDuring handling of the above exception, another exception occurred:\n\n"
                                          "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                                          "KeyError: 'a bug'\n")
        worker = ProcessRaisedException("\n\n-- Process 0 terminated with the following error:\n" + trace, 0, 1)
        assert user_errors.user_message(worker) is None, trace
    monkeypatch.setenv(user_errors.FULL_ERROR_VAR, "1")
    assert not user_errors.report(raised.value, "fairseq-train", io.StringIO())


@pytest.mark.parametrize("argv0, expected", [
    ("/venv/bin/fairseq-generate", "L"), ("/venv/bin/fairseq-validate", "L"), ("/venv/bin/fairseq-train", "T"),
    ("/venv/bin/fairseq-hydra-train", "T"), ("/venv/lib/python3.11/site-packages/fairseq_cli/hydra_train.py", "T"),
    ("/usr/bin/ipython", "fairseq-generate, -interactive and -validate: L; "
                                                                 "fairseq-train: T")])
def test_a_fix_is_given_for_the_running_tool(argv0, expected, monkeypatch):
    """A checkpoint-mismatch message gives the loading tools' fix (--model-overrides) in fairseq-generate and
    its siblings, the training fix in fairseq-train and fairseq-hydra-train, and both, named, elsewhere."""
    from fairseq_residual import user_errors

    monkeypatch.setattr(sys, "argv", [argv0])
    assert user_errors.advice_for_this_tool("L", "T") == expected


def _worker_with_a_wrong_setting(index):
    from fairseq_residual.user_errors import SettingError

    _raise_wrapped(SettingError(f"worker {index}: --hc-streams must be in [1, 16], got 0"))


@pytest.mark.slow  # a spawned process
def test_a_spawned_workers_error_is_one_message(monkeypatch):
    """A real torch.multiprocessing.spawn (fairseq-train's launcher for --distributed-world-size > 1 on one
    machine, which needs as many GPUs): the worker's wrapped error reaches the parent as a ProcessRaisedException
    that is reported as the plugin's message."""
    import io

    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessRaisedException

    from fairseq_residual import user_errors

    monkeypatch.delenv(user_errors.FULL_ERROR_VAR, raising=False)
    with pytest.raises(ProcessRaisedException) as raised:
        mp.spawn(_worker_with_a_wrong_setting, nprocs=1, join=True)
    out = io.StringIO()
    assert user_errors.report(raised.value, "fairseq-train", out), str(raised.value)
    assert out.getvalue() == ("fairseq-train: error: worker 0: --hc-streams must be in [1, 16], got 0 (fairseq: "
                              "Cannot load model parameters from checkpoint c.pt; please ensure that the "
                              "architectures match.) (FAIRSEQ_RESIDUAL_FULL_ERROR=1 shows the traceback)\n")


@pytest.mark.parametrize("argv0, quiet", [("/venv/bin/fairseq-generate", True), ("/usr/bin/ipython", False),
                                          ("/venv/bin/fairseq-hydra-train", False)])
def test_hydra_deprecations_about_fairseqs_code_are_silenced_in_its_tools(argv0, quiet, monkeypatch):
    """In fairseq's tools the six deprecation warnings Hydra prints about fairseq 0.12's own use of its API are
    silenced (another warning is not), and the DEBUG level a fairseq model module sets on import goes back to
    INFO; other programs and fairseq-hydra-train keep both. torch's autocast deprecation, about fairseq's training
    step, and its pin_memory warning on a CPU-only machine, about fairseq's data iterators, are silenced in every
    fairseq tool, fairseq-hydra-train included."""
    import logging
    import warnings

    from fairseq_residual import tool_output

    monkeypatch.setattr(sys, "argv", [argv0])
    monkeypatch.delenv("LOGLEVEL", raising=False)
    fairseqs = ["hydra.experimental.initialize() is no longer experimental. Use hydra.initialize()",
                "hydra.experimental.compose() is no longer experimental. Use hydra.compose()",
                "\nThe version_base parameter is not specified.\nPlease specify a compatability version level",
                "In 'config': Usage of deprecated keyword in package header '# @package _group_'.\nSee https://",
                "\n'config' is validated against ConfigStore schema with the same name.\nThis behavior is deprecated",
                "\nThe strict flag in the compose API is deprecated.\nSee https://hydra.cc"]
    other = "In 'my_config': the defaults list is missing _self_"
    autocast = ("`torch.cuda.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cuda', args...)` "
                "instead.")
    pin = ("'pin_memory' argument is set as true but no accelerator is found, then device pinned memory won't be "
           "used.")
    masks = "Support for mismatched key_padding_mask and attn_mask is deprecated. Use same type for both instead."
    level = logging.root.level
    try:
        logging.root.setLevel(logging.DEBUG)
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("always")
            tool_output.install()
            for message in [*fairseqs, other]:
                warnings.warn(message, UserWarning)
            warnings.warn(autocast, FutureWarning)
            warnings.warn(pin, UserWarning)
            warnings.warn(masks, UserWarning)
        fairseq_tool = argv0 != "/usr/bin/ipython"
        assert [str(w.message) for w in shown] == ([other] if quiet else [*fairseqs, other]) + (
            [] if fairseq_tool else [autocast, pin, masks])
        assert logging.root.level == (logging.INFO if quiet else logging.DEBUG)
    finally:
        logging.root.setLevel(level)


def test_an_unknown_scheme_names_the_closest():
    """A misspelt scheme where argparse does not check it (fairseq-hydra-train's model.residual_scheme): the
    closest scheme, and the whole list; nothing close, the list alone."""
    from fairseq_residual.schemes import get_scheme
    from fairseq_residual.user_errors import SettingError

    with pytest.raises(SettingError, match=r"^unknown residual scheme 'ResiDual' \(did you mean resi_dual\?\): "
                                           r"choose one of post_ln, pre_ln,"):
        get_scheme("ResiDual")
    with pytest.raises(SettingError, match=r"^unknown residual scheme 'zzz': choose one of post_ln"):
        get_scheme("zzz")
    from fairseq_residual.user_errors import closest

    # case alone (argparse's invalid choice, --residual-scheme Pre_LN): difflib's ratio is 0.5
    assert closest("Pre_LN", ["post_ln", "pre_ln"]) == "pre_ln" and closest("ZZZ", ["post_ln"]) is None
    # two letters swapped: one edit from adam, two from adamax (difflib's ratio alone prefers adamax, 0.8 to 0.75)
    optimizers = ["adadelta", "adafactor", "adagrad", "adam", "adamax", "sgd"]
    assert closest("adma", optimizers) == "adam" and closest("adamx", optimizers) == "adamax"
    assert closest("lamb", ["lamb"]) == "lamb"


def test_fairseq_train_without_an_arch_is_named():
    """Stock fairseq-train without --arch ends on a bare ``RuntimeError()`` in its option parser: one line naming
    --arch; a bare RuntimeError raised elsewhere keeps its traceback."""
    from fairseq import options

    from fairseq_residual import user_errors

    with pytest.raises(RuntimeError) as raised:
        options.parse_args_and_arch(options.get_training_parser(), ["data-bin", "--user-dir", str(USER_DIR)])
    assert user_errors.user_message(raised.value).startswith("no --arch given (or one no model registers): add "
                                                             "--arch residual_transformer")
    with pytest.raises(RuntimeError) as elsewhere:
        raise RuntimeError()
    assert user_errors.user_message(elsewhere.value) is None


def test_fairseq_validate_without_a_task_is_named(monkeypatch):
    """Stock fairseq-validate has no default --task and ends on ``KeyError: None`` in fairseq's option parser: the
    tool reports the missing --task and the fix instead; a KeyError(None) raised elsewhere keeps its traceback."""
    from fairseq import options

    from fairseq_residual import user_errors

    parser = options.get_validation_parser()
    with pytest.raises(KeyError) as raised:
        options.parse_args_and_arch(parser, ["data-bin", "--path", "checkpoint_best.pt", "--user-dir", str(USER_DIR)])
    assert user_errors.user_message(raised.value) == (
        "no --task given, and this tool has no default task: add the task the model was trained with (--task "
        "translation for this plugin's translation models), with --max-tokens 4096 or --batch-size")
    with pytest.raises(KeyError) as elsewhere:
        {}[None]
    assert user_errors.user_message(elsewhere.value) is None


def test_an_unreadable_model_overrides_is_named_and_a_readable_one_never_blamed(monkeypatch):
    """A SyntaxError or NameError under fairseq's command-line code is reported as an unreadable
    ``--model-overrides`` only when the text typed after it is no Python dict literal: with a valid one the same
    errors (a broken ``--user-dir`` module's, say) keep their traceback."""
    from fairseq_residual import user_errors

    def raised_under_fairseq_cli(source):
        try:
            exec(compile(source, "/site-packages/fairseq_cli/generate.py", "exec"), {})
        except (NameError, SyntaxError) as exc:
            return exc
        raise AssertionError("nothing raised")

    for source in ("undefined_name", "exec('def broken(:')"):
        monkeypatch.setattr(sys, "argv", ["fairseq-generate", "bin", "--model-overrides", "{dropout: 0.1}"])
        assert user_errors.user_message(raised_under_fairseq_cli(source)).startswith(
            "--model-overrides is not a Python dict literal ("), source
        monkeypatch.setattr(sys, "argv", ["fairseq-generate", "bin", "--model-overrides", "{'dropout': 0.1}"])
        assert user_errors.user_message(raised_under_fairseq_cli(source)) is None, source

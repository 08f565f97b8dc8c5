"""End to end through fairseq's CLIs: fairseq-preprocess -> fairseq-train -> fairseq-generate, resume,
fairseq-hydra-train, and the errors a user meets (wrong flag, checkpoint of another scheme).

fairseq's tools run in-process (``inprocess.fairseq_main``, their own ``cli_main``) except where the process
is what is checked (exit status and message of a wrong flag, fairseq-hydra-train's entry point). The smoke
test (train 3 updates, translate) is the fast lane's one end-to-end run; the round trip (train, translate,
resume) runs once per code path of the model (:data:`CLI_ROUND_TRIP`)."""
import math
import re
import sys
import textwrap

import pytest
import torch

from conftest import USER_DIR, run_cli, write_tiny_parallel
from inprocess import fairseq_main
from fairseq_residual.model import ARCH_NAMES
from fairseq_residual.schemes import SCHEME_NAMES, get_scheme

TRAIN_FLAGS = [
    "--optimizer", "adam", "--lr", "5e-3", "--criterion", "label_smoothed_cross_entropy",
    "--label-smoothing", "0.1", "--max-tokens", "600", "--required-batch-size-multiple", "1",
    "--log-format", "simple", "--log-interval", "1", "--no-epoch-checkpoints", "--seed", "3",
    "--num-workers", "0",
]


def train(data_bin, save_dir, *flags, max_update=6):
    """fairseq-train in-process; returns its log."""
    return fairseq_main("fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save_dir,
                        "--max-update", max_update, *TRAIN_FLAGS, *flags)


def translate(data_bin, checkpoint, *flags):
    """fairseq-generate (beam 5) in-process; returns what it printed."""
    return fairseq_main("fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "5",
                        "--required-batch-size-multiple", "1", "--num-workers", "0", *flags)


def load_checkpoint(path):
    """Load a fairseq checkpoint the way torch 2.13 does by default (weights_only=True)."""
    import fairseq_residual  # noqa: F401  (allow-lists fairseq's checkpoint globals)

    return torch.load(path, map_location="cpu")


def test_help_lists_every_preset(capsys):
    from fairseq import options

    with pytest.raises(SystemExit) as exit_:  # fairseq-train --help, as its cli_main parses it
        options.parse_args_and_arch(options.get_training_parser(), ["--user-dir", USER_DIR, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    # argparse wraps help lines anywhere in a long choice list (at hyphens, commas, underscores):
    # compare with all whitespace removed
    flat = re.sub(r"\s+", "", out)
    # 5 preset families, each plain and with every registered scheme's suffix, plus the tiny preset
    assert len(ARCH_NAMES) == 5 * (1 + len(SCHEME_NAMES)) + 1
    for scheme in SCHEME_NAMES:
        assert f"residual_transformer_iwslt_de_en_{scheme}" in ARCH_NAMES
        assert re.search(rf"[{{,]{scheme}[,}}]", flat), f"--residual-scheme help lacks {scheme}"
    for name in ARCH_NAMES:
        assert re.search(rf"[:,]{name}[,.]", flat), f"--arch help lacks {name}"
    assert "--hc-streams" not in flat  # the model's options need --arch (fairseq parses them after it)

    with pytest.raises(SystemExit) as exit_:  # fairseq-train --arch <preset> --help: the model's options too
        options.parse_args_and_arch(options.get_training_parser(),
                                    ["--user-dir", USER_DIR, "--arch", "residual_transformer_tiny", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "Model-specific configuration (--arch residual_transformer_tiny" in out
    flat = re.sub(r"\s+", " ", out)
    for flag in ("--residual-scheme", "--resi-dual-scale", "--encoder-resi-dual-alpha", "--norm {layernorm,rmsnorm",
                 "--dyt-alpha", "--rmsnorm-eps", "--encoder-layers", "--hc-streams N Hyper-connections"):
        assert flag in flat, flag
    assert re.search(r"--hc-streams N .*range \[1, 16\]; default 4", flat)
    assert re.search(r"--admin-profile FILE .* CHECKPOINT OUT; default none", flat)  # a path: no numeric range

    for typed in (["--help", "--arch", "residual_transformer_tiny"],  # argparse runs --help before it reads --arch
                  ["--help", "--arch=residual_transformer_tiny"], ["--help", "-aresidual_transformer_tiny"],
                  ["--arch", "transformer", "--help", "-a",
                                                                   "residual_transformer_tiny"]):
        with pytest.raises(SystemExit) as exit_:
            options.parse_args_and_arch(options.get_training_parser(), ["--user-dir", USER_DIR] + typed)
        assert exit_.value.code == 0
        assert "--hc-streams N Hyper-connections" in re.sub(r"\s+", " ", capsys.readouterr().out), typed
    with pytest.raises(SystemExit):  # the last --arch counts, as in argparse
        options.parse_args_and_arch(options.get_training_parser(), ["--user-dir", USER_DIR, "--help", "--arch",
                                                                    "residual_transformer_tiny", "--arch", "transformer"])
    assert "--hc-streams" not in capsys.readouterr().out


def test_argparse_errors_are_one_line_with_the_closest_option(monkeypatch, capsys):
    """In fairseq's tools a misspelt option or a wrong choice ends on one line with the closest one (argparse's
    message after 100-200 lines of usage in stock fairseq); a long choice list is cut to its count; a message
    with nothing close keeps argparse's text alone; other programs keep argparse's usage."""
    from fairseq import options

    def generation_parser():  # as fairseq_cli/generate.py makes it: with an --arch for audio models
        parser = options.get_generation_parser()
        parser.add_argument("--arch", "-a", metavar="ARCH", default="wav2vec2")
        return parser

    def error_of(argv0, args, parser=generation_parser):
        monkeypatch.setattr(sys, "argv", [argv0])
        with pytest.raises(SystemExit) as exit_:
            options.parse_args_and_arch(parser(), args)
        assert exit_.value.code == 2
        return capsys.readouterr().err

    err = error_of("fairseq-generate", ["bin", "--user-dir", USER_DIR, "--bem", "4"])
    assert err == ("fairseq-generate: error: unrecognized arguments: --bem 4 (did you mean --beam?); "
                   "fairseq-generate --help lists the options\n")
    err = error_of("fairseq-train", ["bin", "--user-dir", USER_DIR, "--arch", "residual_transformr"],
                   options.get_training_parser)
    assert re.fullmatch(r"fairseq-train: error: argument --arch/-a: invalid choice: 'residual_transformr' \(one of "
                        r"\d+ choices\) \(did you mean residual_transformer\?\); fairseq-train --help "
                        r"lists the options \(with --arch <preset>, the model's too\)\n", err), err
    err = error_of("fairseq-train", ["bin", "--user-dir", USER_DIR, "--arch", "residual_transformer_tiny_pre_ln"],
                   options.get_training_parser)
    assert "(did you mean --arch residual_transformer_tiny --residual-scheme pre_ln?)" in err
    err = error_of("fairseq-train", ["bin", "--user-dir", USER_DIR, "--arch", "transformer", "--hc-streams", "4"],
                   options.get_training_parser)
    assert "--hc-streams 4 (--hc-streams is an option of the residual_transformer presets: --arch " in err
    err = error_of("fairseq-train", ["bin", "--user-dir", USER_DIR, "--arch", "residual_transformer_tiny",
                                     "--decay-period", "4000"], options.get_training_parser)  # T-Fixup's scheduler's
    assert ("--decay-period 4000 (--decay-period is an option of --lr-scheduler inverse_sqrt_nowarmup, not of the one "
            "this command line chose)") in err and "did you mean" not in err, err
    err = error_of("fairseq-train", ["bin", "--user-dir", USER_DIR, "--arch", "zzz"], options.get_training_parser)
    assert "invalid choice: 'zzz' (choose from 'transformer_tiny', " in err  # nothing close: the whole list
    err = error_of("fairseq-train", ["bin", "--user-dir", USER_DIR, "--arch", "residual_transformer_tiny",
                                     "--residual-scheme", "zzz"], options.get_training_parser)
    assert "invalid choice: 'zzz' (choose from 'post_ln', 'pre_ln'," in err and "did you mean" not in err
    err = error_of("fairseq-generate", ["bin", "--user-dir", USER_DIR, "--hc-streams", "4"])
    assert ("(--hc-streams is a model option: this tool reads the model's settings from the checkpoint; change one "
            "with --model-overrides \"{'hc_streams': ...}\")") in err
    err = error_of("fairseq-validate", ["bin", "--user-dir", USER_DIR, "--task", "translation", "--hc-streams", "4"],
                   options.get_validation_parser)  # no --arch in fairseq-validate either: not the presets' advice
    assert "change one with --model-overrides \"{'hc_streams': ...}\")" in err and "--arch" not in err, err
    err = error_of("fairseq-generate", ["bin", "--user-dir", USER_DIR, "--residual-scheme", "mhc"])
    assert err.endswith("(--residual-scheme is a model option: this tool builds the model with the residual_scheme "
                        "the checkpoint was trained with, whose weights are that residual_scheme's; drop it); "
                        "fairseq-generate --help lists the options\n"), err  # not an override that then fails
    err = error_of("python", ["bin", "--user-dir", USER_DIR, "--bem", "4"])
    assert err.startswith("usage: ") and "did you mean" not in err


def test_a_diverged_run_ends_on_one_line_with_the_fixes(tiny_data_bin, tmp_path, monkeypatch):
    """fairseq-train stops on non-finite gradients, re-runs the step under its NaN detector, and there torch's
    backward hook fails on the encoder's dict output: the user gets a StopIteration traceback in stock fairseq,
    here one line with what happened and the fixes."""
    from fairseq_residual.user_errors import user_message

    _, data_bin = tiny_data_bin
    with pytest.raises(AssertionError) as raised:
        fairseq_main("fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "residual_transformer_tiny",
                     "--residual-scheme", "t_fixup", "--optimizer", "adam", "--lr", "100", "--max-tokens", "500",
                     "--max-update", "20", "--save-dir", tmp_path / "ckpt", "--num-workers", "0",
                     "--disable-validation", "--no-save")
    exc = raised.value.__cause__
    chain = [type(exc).__name__, type(exc.__context__).__name__ if exc.__context__ else None]
    assert "FloatingPointError" in chain, chain  # fairseq's own stop, with or without the detector's failure
    monkeypatch.setattr(sys, "argv", ["/venv/bin/fairseq-train"])
    message = user_message(exc)
    assert message.startswith("the gradients became NaN or Inf: training diverged") and "Lower --lr" in message
    assert "--clip-norm 1.0" in message and "\n" not in message
    assert user_message(FloatingPointError("Minimum loss scale reached (0.0001)")) is None  # fp16's: not this


def test_smoke_train_three_updates_and_translate(tmp_path):
    """The fast lane's end-to-end run: binarise a tiny corpus, train ResiDual (the residual protocol's
    generic loop) 3 updates, translate the test split with beam 5."""
    raw = write_tiny_parallel(tmp_path / "raw", n_train=64, n_valid=8, n_test=8)
    data_bin = tmp_path / "bin"
    fairseq_main("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
                 "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", data_bin,
                 "--joined-dictionary", "--workers", "1")
    log = train(data_bin, tmp_path / "ckpt", "--arch", "residual_transformer_tiny", "--residual-scheme", "resi_dual",
                max_update=3)
    assert re.search(r"num_updates[= ]3\b", log), log[-2000:]
    assert load_checkpoint(tmp_path / "ckpt" / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"] == 3
    gen = translate(data_bin, tmp_path / "ckpt" / "checkpoint_last.pt", "--max-len-b", "12")
    assert len([line for line in gen.splitlines() if line.startswith("H-")]) == 8
    assert re.search(r"Generate test with beam=5: BLEU4 = \d+\.\d+", gen)


# The schemes that train, translate and resume through fairseq's CLIs here, one per code path: fairseq's own
# layers (post_ln), the residual protocol's generic loop (resi_dual), a training hook and its buffers (admin),
# state across layers (dlcl), several residual streams (hyper_connections). Every scheme trains in
# test_ddp.py (fairseq's Trainer, DDP) and test_precision.py (bf16/fp16); beam search, incremental decoding and
# the state-dict round trip run for every scheme in test_conformance.py, resuming through fairseq's checkpoint
# loading in test_checkpoint_devices.py.
CLI_ROUND_TRIP = ("post_ln", "resi_dual", "admin", "dlcl", "hyper_connections")


@pytest.mark.parametrize("scheme", CLI_ROUND_TRIP)
def test_train_generate_resume(scheme, shipped_data_bin, tmp_path):
    """Train on the shipped corpus, translate with beam 5, resume from checkpoint_last.pt to more updates."""
    assert set(CLI_ROUND_TRIP) <= set(SCHEME_NAMES), "a round-trip scheme is no longer registered"
    raw, data_bin = shipped_data_bin
    save = tmp_path / "ckpt"
    arch_flags = ["--arch", "residual_transformer_tiny", "--residual-scheme", scheme]
    log = train(data_bin, save, *arch_flags, max_update=6)
    assert re.search(r"num_updates[= ]6\b", log)
    losses = [float(v) for v in re.findall(r"\| loss (\S+) \|", log)]
    assert losses and all(math.isfinite(v) for v in losses), "finite training loss"
    state = load_checkpoint(save / "checkpoint_last.pt")
    assert int(state["model"]["encoder.residual_scheme_id"]) == get_scheme(scheme).scheme_id
    assert state["optimizer_history"][-1]["num_updates"] == 6

    gen = translate(data_bin, save / "checkpoint_last.pt", "--max-len-b", "20", "--batch-size", "16")
    hyps = [line for line in gen.splitlines() if line.startswith("H-")]
    n_test = sum(1 for _ in open(raw / "test.de", encoding="utf-8"))
    assert len(hyps) == n_test, "every test sentence is translated"
    assert re.search(r"Generate test with beam=5: BLEU4 = \d+\.\d+", gen)

    # resume from checkpoint_last.pt and continue to 9 updates
    log = train(data_bin, save, *arch_flags, max_update=9)
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 6 updates\)", log)
    assert load_checkpoint(save / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"] == 9


def test_t_fixup_trains_with_its_schedule_without_warm_up(shipped_data_bin, tmp_path):
    """T-Fixup's recipe through fairseq-train: the plugin's inverse_sqrt_nowarmup schedule, lr * sqrt(P / (P + t))
    after update t."""
    _, data_bin = shipped_data_bin
    log = train(data_bin, tmp_path / "ckpt", "--arch", "residual_transformer_tiny", "--residual-scheme", "t_fixup",
                "--lr-scheduler", "inverse_sqrt_nowarmup", "--decay-period", "100", max_update=3)
    lrs = [float(v) for v in re.findall(r"\| lr (\S+) \|", log)]
    assert lrs[-1] == pytest.approx(5e-3 * math.sqrt(100 / 103), rel=1e-4)


def test_a_model_trained_pruned_translates_and_resumes(tiny_data_bin, tmp_path, monkeypatch):
    """fairseq-train --encoder-layers-to-keep trains the kept sub-network of the deeper model (each kept layer
    with its index's depth constants); its checkpoint translates and resumes as that sub-network, the stack
    without a list whole; a whole model's checkpoint prunes at generation with one stack's list."""
    _, data_bin = tiny_data_bin
    save = tmp_path / "pruned"
    flags = ["--arch", "residual_transformer_tiny", "--residual-scheme", "lns", "--encoder-layers", "3",
             "--encoder-layers-to-keep", "2"]
    train(data_bin, save, *flags, max_update=2)
    state = load_checkpoint(save / "checkpoint_last.pt")
    assert (state["cfg"]["model"].encoder_layers, state["cfg"]["model"].encoder_layers_to_keep) == (3, "2")
    held = {k.split(".layers.")[0] + "." + k.split(".layers.")[1].split(".")[0] for k in state["model"]
            if ".layers." in k}
    assert held == {"encoder.0", "decoder.0", "decoder.1"}
    gen = translate(data_bin, save / "checkpoint_last.pt", "--max-len-b", "5")
    assert len([line for line in gen.splitlines() if line.startswith("H-")]) == 24
    log = train(data_bin, save, *flags, max_update=3)
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 2 updates\)", log)
    resumed = load_checkpoint(save / "checkpoint_last.pt")
    assert resumed["optimizer_history"][-1]["num_updates"] == 3
    assert resumed["cfg"]["model"].encoder_layers_to_keep == "2"  # the resumed run kept its list
    # the same command again: done, nothing trained or saved (stock fairseq trains update 4 and saves it)
    before = (save / "checkpoint_last.pt").read_bytes()
    log = train(data_bin, save, *flags, max_update=3)
    assert "the checkpoint loaded is at update 3, --max-update 3 (optimization.max_update): this training is done" in log
    assert re.search(r"done training in [\d.]+ seconds", log)  # fairseq-train's main returned, no process exit
    assert (save / "checkpoint_last.pt").read_bytes() == before

    whole = tmp_path / "whole"
    train(data_bin, whole, "--arch", "residual_transformer_tiny", "--residual-scheme", "lns", max_update=1)
    gen = translate(data_bin, whole / "checkpoint_last.pt", "--max-len-b", "5",
                    "--model-overrides", "{'encoder_layers_to_keep': '1'}")
    assert len([line for line in gen.splitlines() if line.startswith("H-")]) == 24
    with pytest.raises(AssertionError, match=r"--model-overrides 'encoder_layers_to_kep' \(did you mean "
                                             r"'encoder_layers_to_keep'\?\): no option of this checkpoint's model"):
        translate(data_bin, whole / "checkpoint_last.pt", "--model-overrides", "{'encoder_layers_to_kep': '1'}")
    # a --model-overrides that is no dict literal: one line, not ast's traceback
    from fairseq_residual.user_errors import user_message

    with pytest.raises(AssertionError) as raised:
        translate(data_bin, whole / "checkpoint_last.pt", "--model-overrides", "{dropout: 0.1}")
    monkeypatch.setattr(sys, "argv", ["fairseq-generate", "--model-overrides", "{dropout: 0.1}"])  # as it saw it
    assert user_message(raised.value.__cause__).startswith(
        "--model-overrides is not a Python dict literal: quote its keys and string values")
    monkeypatch.undo()
    # fairseq-generate parses model options after --arch, then builds the checkpoint's saved model: refused
    with pytest.raises(AssertionError, match=r"--residual-scheme: fairseq-generate builds the model from the "
                                             r"checkpoint's saved settings and ignores model options on its command "
                                             r"line; drop it \(the checkpoint names its scheme\)(?!, or change)"):
        translate(data_bin, whole / "checkpoint_last.pt", "--arch", "residual_transformer", "--residual-scheme", "lns")
    # fairseq-validate hands every option typed to the loader as an override: only --model-overrides' are checked
    validate = ["fairseq-validate", data_bin, "--user-dir", USER_DIR, "--path", whole / "checkpoint_last.pt",
                "--task", "translation", "--max-tokens", 600, "--criterion", "label_smoothed_cross_entropy",
                "--label-smoothing", "0.1", "--num-workers", 0]
    assert re.search(r"valid on 'valid' subset \| loss", fairseq_main(*validate, "--model-overrides", "{'dropout': 0.1}"))
    with pytest.raises(AssertionError) as raised:  # no --max-tokens / --batch-size: fairseq's bare assertion
        fairseq_main(*[a for a in validate if a not in ("--max-tokens", 600)])
    for tool in ("fairseq-validate", "fairseq-train"):  # fairseq-train asserts it too: each names itself
        monkeypatch.setattr(sys, "argv", [f"/venv/bin/{tool}"])
        assert user_message(raised.value.__cause__) == ("no batch size given: add --max-tokens 4096 (or --batch-size "
                                                        f"N), as {tool} has no default")
    monkeypatch.undo()
    # fairseq-train asserts the batch size before it builds the model: the model options' refusal comes with it
    refused = ["fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "residual_transformer_tiny",
             "--residual-scheme", "pre_ln", "--denseformer-period", "2"]
    with pytest.raises(AssertionError) as raised:
        fairseq_main(*refused)
    monkeypatch.setattr(sys, "argv", ["/venv/bin/fairseq-train", *map(str, refused[1:])])
    assert user_message(raised.value.__cause__) == (
        "no batch size given: add --max-tokens 4096 (or --batch-size N), as fairseq-train has no default; the model "
        "options will be refused next: --denseformer-period (model.denseformer_period) is an option of "
        "--residual-scheme denseformer (model.residual_scheme=denseformer), but the model's scheme is pre_ln: drop "
        "--denseformer-period or use --residual-scheme denseformer")
    monkeypatch.setattr(sys, "argv", ["/venv/bin/fairseq-train", *map(str, refused[1:-2])])  # nothing else wrong
    assert user_message(raised.value.__cause__).endswith("as fairseq-train has no default")
    monkeypatch.undo()
    with pytest.raises(AssertionError, match=r"--model-overrides 'dropuot' \(did you mean 'dropout'\?\)"):
        fairseq_main(*validate, "--model-overrides", "{'dropuot': 0.1}")
    with pytest.raises(AssertionError, match=r"checkpoint holds 1 encoder layers: a --model-overrides of encoder_layers or encoder_layers_to_keep"):
        translate(data_bin, save / "checkpoint_last.pt", "--max-len-b", "5",
                  "--model-overrides", "{'encoder_layers_to_keep': None}")


def test_checkpoint_of_another_scheme_is_refused(tiny_data_bin, tmp_path):
    _, data_bin = tiny_data_bin
    save = tmp_path / "ckpt"
    train(data_bin, save, "--arch", "residual_transformer_tiny",
          "--residual-scheme", "pre_ln", max_update=2)
    with pytest.raises(AssertionError) as failed:
        train(data_bin, save, "--arch", "residual_transformer_tiny", "--residual-scheme", "resi_dual", max_update=4)
    message = str(failed.value)
    assert "trained with residual scheme 'pre_ln'" in message
    assert "uses residual scheme 'resi_dual'" in message
    assert "--residual-scheme pre_ln" in message
    # nothing was lost: the pre_ln checkpoint is untouched
    assert load_checkpoint(save / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"] == 2


def test_bad_flags_give_clear_errors(tiny_data_bin, tmp_path):
    """What a user sees: fairseq-train's exit status and message (a process of its own)."""
    _, data_bin = tiny_data_bin

    def cli_train(save_dir, *flags):
        return run_cli(["fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save_dir,
                        "--max-update", 6, *TRAIN_FLAGS, *flags], check=False)

    proc = cli_train(tmp_path / "a", "--arch", "residual_transformer_tiny", "--resi-dual-scale", "0")
    assert proc.returncode != 0 and "--resi-dual-scale (model.resi_dual_scale) must be in [0.01, 1]" in proc.stdout
    proc = cli_train(tmp_path / "b", "--arch", "residual_transformer_tiny", "--residual-scheme", "preln")
    assert proc.returncode == 2 and "invalid choice: 'preln'" in proc.stdout
    assert "(did you mean pre_ln?); fairseq-train --help lists the options" in proc.stdout
    assert "usage:" not in proc.stdout  # argparse's 100-200 lines of fairseq's usage are not printed
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())


def test_presets_apply_their_dimensions_under_fairseq_train(tiny_data_bin, tmp_path):
    _, data_bin = tiny_data_bin
    save = tmp_path / "ckpt"
    train(data_bin, save, "--arch", "residual_transformer_iwslt_de_en_post_ln", max_update=1)
    state = load_checkpoint(save / "checkpoint_last.pt")
    sd = state["model"]
    assert sd["encoder.embed_tokens.weight"].shape[1] == 256
    assert sd["encoder.layers.0.fc1.weight"].shape == (1024, 256)
    assert max(int(k.split(".")[2]) for k in sd if k.startswith("decoder.layers.")) == 5
    assert int(sd["encoder.residual_scheme_id"]) == 0  # post_ln
    assert state["cfg"]["model"].share_all_embeddings


def test_hydra_train_applies_preset_and_generates(tiny_data_bin, tmp_path):
    raw, data_bin = tiny_data_bin
    save = tmp_path / "ckpt"
    config_dir = tmp_path / "configs"
    config_dir.mkdir()
    (config_dir / "tiny.yaml").write_text(
        textwrap.dedent(
            f"""
            # @package _group_
            common:
              user_dir: {USER_DIR}
              log_format: simple
              log_interval: 1
              seed: 3
            task:
              _name: translation
              data: {data_bin}
            model:
              _name: residual_transformer_iwslt_de_en_pre_ln
              encoder_layers: 2
              decoder_layers: 2
            criterion:
              _name: label_smoothed_cross_entropy
              label_smoothing: 0.1
            optimizer:
              _name: adam
            lr_scheduler:
              _name: fixed
            optimization:
              lr: [0.005]
              max_update: 3
            dataset:
              max_tokens: 600
              required_batch_size_multiple: 1
              num_workers: 0
            checkpoint:
              save_dir: {save}
              no_epoch_checkpoints: true
            """
        )
    )
    hydra = ["fairseq-hydra-train", "--config-dir", config_dir, "--config-name", "tiny", f"hydra.run.dir={tmp_path / 'hydra'}"]
    # the model's config holds no precision: Admin's refusal of fairseq's fp32 master copy comes from the Trainer,
    # before any batch or checkpoint
    refused = run_cli(hydra + ["+model.residual_scheme=admin", "common.bf16=true", "common.fp16_no_flatten_grads=true",
                               "common.cpu=true"], check=False)
    assert refused.returncode != 0
    assert "\n--bf16 (common.bf16) keeps an fp32 copy of the weights" in refused.stdout, refused.stdout[-3000:]
    assert "Traceback" not in refused.stdout  # Hydra reports the plugin's errors by their message
    assert not list(save.glob("*.pt"))
    run_cli(hydra)
    sd = load_checkpoint(save / "checkpoint_last.pt")["model"]
    assert sd["encoder.embed_tokens.weight"].shape[1] == 256  # the preset, not base dims (512)
    assert sd["encoder.layers.0.fc1.weight"].shape == (1024, 256)
    assert max(int(k.split(".")[2]) for k in sd if k.startswith("encoder.layers.")) == 1  # override: 2 layers
    assert int(sd["encoder.residual_scheme_id"]) == 1  # pre_ln from the preset name
    assert "encoder.layer_norm.weight" in sd
    gen = translate(data_bin, save / "checkpoint_last.pt")
    assert len([x for x in gen.splitlines() if x.startswith("H-")]) == sum(1 for _ in open(raw / "test.src"))
    # a sweep: each job in its own folder by interpolation; the same sweep again ends every finished job and goes
    # on to the next (a finished job used to exit the process, which ended the sweep); jobs sharing one folder:
    # the job of other sizes is refused, and told how a sweep separates its jobs
    sweep = [hydra[0], "-m", *hydra[1:], f"hydra.sweep.dir={tmp_path / 'sweep'}", "model.encoder_layers=1,2",
             "optimization.max_update=1"]
    apart = f"checkpoint.save_dir={tmp_path}/sweep-${{model.encoder_layers}}"
    run_cli([*sweep, apart])
    again = run_cli([*sweep, apart]).stdout
    assert again.count("this training is done; nothing trained or saved") == 2, again[-3000:]
    shared = run_cli([*sweep, f"checkpoint.save_dir={tmp_path}/sweep-1"], check=False)
    assert shared.returncode != 0 and "this training is done" in shared.stdout
    assert ("In a sweep (fairseq-hydra-train -m), give each job its own folder by interpolating the keys it varies, "
            "e.g. 'checkpoint.save_dir=/path/to/sweep/${model.residual_scheme}'") in shared.stdout, shared.stdout[-3000:]


def test_activation_checkpointing_trains_resi_dual(tiny_data_bin, tmp_path, monkeypatch):
    """--checkpoint-activations: every layer of a protocol scheme runs its forward under torch's
    non-reentrant checkpoint (in-process: the calls are counted, and the gradients equal those without
    checkpointing); then the CLI trains with it."""
    import torch.utils.checkpoint

    from conftest import build_model, make_dictionary, random_batch

    calls = []
    real = torch.utils.checkpoint.checkpoint

    def counting(fn, *args, **kwargs):
        calls.append(fn)
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counting)
    d = make_dictionary()
    src, lengths, prev, _ = random_batch(d)
    grads = []
    for flags, wrapped in (((), False), (("--checkpoint-activations",), True)):
        torch.manual_seed(1)
        model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "resi_dual", *flags,
                                  dictionary=d)
        layers = list(model.encoder.layers) + list(model.decoder.layers)
        assert [layer.checkpoint_activations for layer in layers] == [wrapped] * len(layers)
        model.train()
        calls.clear()
        torch.manual_seed(2)  # the same dropout masks in both runs
        model(src, lengths, prev)[0].sum().backward()
        assert len(calls) == (len(layers) if wrapped else 0)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], msg=name)

    _, data_bin = tiny_data_bin
    log = train(data_bin, tmp_path / "ckpt", "--arch", "residual_transformer_tiny", "--checkpoint-activations",
                max_update=2)
    assert re.search(r"num_updates[= ]2\b", log)

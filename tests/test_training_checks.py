"""The checks of the training settings run where fairseq's Trainer is built (``fairseq_residual/training_checks.py``),
with fairseq's whole config, so that they hold under ``fairseq-hydra-train``, which builds the model from a config
without the precision, distributed, optimizer and schedule settings.

Each case builds the model as fairseq-hydra-train does, without the case's training settings (its arguments say
fp32, no warm-up, ...), then fairseq's own Trainer with them: the refusal or the warning comes from the Trainer's
construction; its negative control, the recipe's setting, builds the Trainer without either.
``tests/test_cli.py`` runs fairseq-hydra-train itself into Admin's refusal."""
import logging
import re

import pytest
import torch

from conftest import make_dictionary
from trainers import train_config

#: (scheme, the settings checked, the recipe's settings (negative control), ValueError or "warning", message)
CASES = {
    "admin-bf16-master-copy": (
        "admin", ["--bf16", "--fp16-no-flatten-grads"], ["--memory-efficient-bf16"], ValueError,
        r"--bf16 \(common.bf16\) keeps an fp32 copy of the weights made before the first batch, which would "
        r"overwrite the omegas .* --admin-profile profile.ratio.init, or use memory-efficient bf16 "
        r"\(fairseq-hydra-train: common.memory_efficient_bf16=true\)"),
    "admin-fp16-master-copy": (
        "admin", ["--fp16", "--fp16-no-flatten-grads"], ["--memory-efficient-fp16"], ValueError,
        r"--fp16 \(common.fp16\) keeps an fp32 copy .* or use --amp or --memory-efficient-fp16"),
    "hyper_connections-flat-fp16": (
        "hyper_connections", ["--fp16", "--weight-decay", "0.1"], ["--fp16", "--weight-decay", "0"], ValueError,
        r"--residual-scheme hyper_connections trains .*, but --fp16 keeps one flat fp32 copy of all weights, which has "
        r"no room for that: add --fp16-no-flatten-grads \(fairseq-hydra-train: common.fp16_no_flatten_grads=true\), "
        r"or use --memory-efficient-fp16, --weight-decay 0 or bf16 \(through fairseq-hydra-train: common.bf16=true "
        r"common.fp16_no_flatten_grads=true; fairseq-train's --bf16 turns on --tpu\)"),
    "ngpt-fully-sharded": (
        "ngpt", ["--ddp-backend", "fully_sharded"], ["--ddp-backend", "pytorch_ddp"], ValueError,
        r"--ddp-backend fully_sharded \(distributed_training.ddp_backend\) flattens the weights .* use --ddp-backend "
        r"pytorch_ddp"),
    "ngpt-weight-decay": (
        "ngpt", ["--weight-decay", "0.1"], ["--weight-decay", "0"], "warning",
        r"nGPT trains without weight decay .* decays weights by 0.1: .* use --weight-decay 0 "
        r"\(optimizer.weight_decay=0\)"),
    "t_fixup-warm-up": (
        "t_fixup", ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100"],
        ["--lr-scheduler", "inverse_sqrt_nowarmup"], "warning",
        r"without learning-rate warm-up, but the schedule warms up over 100 updates \(--warmup-updates, .* "
        r"--lr-scheduler inverse_sqrt_nowarmup"),
    "t_fixup-tri-stage-warm-up": (
        "t_fixup", ["--lr-scheduler", "tri_stage", "--warmup-steps", "9"], ["--lr-scheduler", "tri_stage"], "warning",
        r"without learning-rate warm-up, but the schedule warms up over 9 updates"),
    "fp16-on-a-cpu": (
        "pre_ln", ["--memory-efficient-fp16"], ["--memory-efficient-bf16"], "warning",
        r"fp16 training without CUDA \((--cpu|no CUDA device)\): .*torch.tensor\(0.0\).cuda\(\), "
        r".*in bf16 through fairseq-hydra-train \(common.bf16=true common.fp16_no_flatten_grads=true, or "
        r"common.memory_efficient_bf16=true; fairseq-train's --bf16 and --memory-efficient-bf16 turn on --tpu\)"),
}


def _trainer(scheme, flags):
    """fairseq's Trainer with ``flags``, for a model built from the same arguments without them."""
    from fairseq.tasks.translation import TranslationTask
    from fairseq.trainer import Trainer

    d = make_dictionary()
    task = TranslationTask(train_config(scheme).task, d, d)
    torch.manual_seed(0)
    model = task.build_model(train_config(scheme).model)
    cfg = train_config(scheme, *flags)
    return Trainer(cfg, task, model, task.build_criterion(cfg.criterion))


def _warnings(caplog, pattern):
    return [r for r in caplog.records if r.levelno == logging.WARNING and re.search(pattern, r.getMessage())]


@pytest.mark.parametrize("case", list(CASES))
def test_training_settings_are_checked_where_fairseqs_trainer_is_built(case, caplog):
    scheme, checked, recipe, outcome, message = CASES[case]
    with caplog.at_level(logging.WARNING, logger="fairseq_residual"):
        if outcome is ValueError:
            with pytest.raises(ValueError, match=message):
                _trainer(scheme, checked)
        else:
            _trainer(scheme, checked)
            assert len(_warnings(caplog, message)) == 1, caplog.text
        caplog.clear()
        _trainer(scheme, recipe)
    assert _warnings(caplog, message) == []


def test_a_trainer_given_fairseq_trains_argument_namespace_is_checked_too():
    """fairseq's Trainer still takes the parsed arguments (it converts them, with a deprecation warning): the checks
    read them the same way. The model is built without the settings, which the caller sets afterwards."""
    from fairseq.trainer import Trainer

    from conftest import build_model

    model, args, task = build_model("residual_transformer_tiny", "--residual-scheme", "hyper_connections",
                                    "--optimizer", "adam", "--cpu")
    args.fp16, args.weight_decay = True, 0.1
    with pytest.raises(ValueError, match=r"--fp16 keeps one flat fp32 copy"):
        Trainer(args, task, model, task.build_criterion(args))
    args.fp16_no_flatten_grads = True  # negative control: per-parameter master copies
    Trainer(args, task, model, task.build_criterion(args))


def test_a_model_of_another_kind_gets_the_precision_checks_only(caplog):
    """fairseq's own transformer: the precision a CPU does not honour is named for it too; Admin's refusal of the
    same settings belongs to residual_transformer."""
    from fairseq_residual.training_checks import check_training, namespace_config
    from conftest import build_model

    model, args, _ = build_model("transformer", "--encoder-layers", 1, "--decoder-layers", 1,
                                 "--encoder-embed-dim", 8, "--decoder-embed-dim", 8, "--encoder-ffn-embed-dim", 8,
                                 "--decoder-ffn-embed-dim", 8, "--encoder-attention-heads", 2,
                                 "--decoder-attention-heads", 2, "--cpu")
    for flag, message in (("amp", r"^--amp \(common.amp\) has no effect"),
                          ("fp16", r"^fp16 training without CUDA \(--cpu\)"),
                          ("bf16", None)):  # bf16: the negative control
        setattr(args, flag, True)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="fairseq_residual"):
            check_training(namespace_config(args), model)
        assert len(_warnings(caplog, "")) == (message is not None), caplog.text
        assert message is None or len(_warnings(caplog, message)) == 1, caplog.text
        setattr(args, flag, False)
    args.bf16 = True
    tiny, args, _ = build_model("residual_transformer_tiny", "--residual-scheme", "admin")
    args.bf16 = True
    with pytest.raises(ValueError, match="overwrite the omegas"):
        check_training(namespace_config(args), tiny)


@pytest.mark.parametrize("scheme, group, key, message", [
    ("ngpt", "optimizer", "weight_decay", "nGPT trains without weight decay"),
    ("t_fixup", "lr_scheduler", "warmup_updates", "without learning-rate warm-up, but the schedule warms up over"),
])
def test_composite_optimizers_groups_are_read(scheme, group, key, message, caplog):
    """``--optimizer composite`` trains each parameter group with its own optimizer and schedule
    (``cfg.optimizer.groups[name]``): a group's weight decay or warm-up counts, the top level holding neither."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from fairseq_residual.schemes import get_scheme

    def cfg(value):
        other = "lr_scheduler" if group == "optimizer" else "optimizer"
        return SimpleNamespace(optimizer=OmegaConf.create({"_name": "composite", "groups": {
            "default": {group: {key: 0}, other: {}}, "scales": {group: {key: value}, other: {}}}}),
            lr_scheduler=OmegaConf.create({"_name": "pass_through"}))

    with caplog.at_level(logging.WARNING, logger="fairseq_residual"):
        get_scheme(scheme).check_training(cfg(50), None)
        assert len(_warnings(caplog, message)) == 1
        caplog.clear()
        get_scheme(scheme).check_training(cfg(0), None)  # negative control
    assert _warnings(caplog, message) == []

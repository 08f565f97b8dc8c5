"""--amp without CUDA (fairseq_residual/precision.py): fairseq's AMP is CUDA-only (torch.cuda.amp autocast in
``FairseqTask.train_step``, ``torch.cuda.amp.GradScaler`` in ``fairseq/optim/amp_optimizer.py``), so on the CPU
an ``--amp`` run silently trains in fp32; the plugin says so in a warning, from its check of fairseq's Trainer
(``--fp16`` on a CPU, the same check's other warning: tests/test_training_checks.py)."""
import argparse
import logging
import re

import pytest

from conftest import USER_DIR
from inprocess import fairseq_main
from fairseq_residual.training_checks import namespace_config

TRAIN = [
    "--arch", "residual_transformer_tiny", "--residual-scheme", "post_ln", "--optimizer", "adam", "--lr", "1e-3",
    "--max-tokens", "120", "--required-batch-size-multiple", "1", "--log-format", "simple", "--log-interval", "1",
    "--no-save", "--disable-validation", "--seed", "3", "--num-workers", "0", "--max-update", "1",
]


def test_amp_on_cpu_training_logs_a_warning(tiny_data_bin):
    _, data_bin = tiny_data_bin
    out = fairseq_main("fairseq-train", data_bin, "--user-dir", USER_DIR, "--task", "translation", "--cpu", "--amp",
                       *TRAIN)
    warning = [line for line in out.splitlines() if "WARNING" in line and "--amp" in line]
    assert len(warning) == 1, out[-3000:]
    assert "fairseq's AMP is CUDA-only" in warning[0] and "trains in fp32" in warning[0]
    assert "drop --amp" in warning[0] and "--cpu" in warning[0]
    assert re.search(r"done training", out)


def _cfg(amp=True, cpu=False, tpu=False, fp16=False):
    from omegaconf import OmegaConf

    return OmegaConf.create({"common": {"amp": amp, "cpu": cpu, "tpu": tpu, "fp16": fp16}})


@pytest.mark.parametrize(
    "cfg, cuda, why",
    [
        (_cfg(cpu=True), True, "--cpu"),  # a GPU machine, run with --cpu
        (_cfg(), False, "no CUDA device"),  # no GPU at all
        (namespace_config(argparse.Namespace(amp=True, cpu=False)), False, "no CUDA device"),  # fairseq-train's args
        (namespace_config(argparse.Namespace(amp=True, cpu=True)), True, "--cpu"),
    ],
)
def test_amp_without_cuda_is_named(cfg, cuda, why, caplog):
    from fairseq_residual import precision

    with caplog.at_level(logging.WARNING, logger="fairseq_residual.precision"):
        assert len(precision.warn_without_cuda(cfg, cuda_available=cuda)) == 1
    records = [r for r in caplog.records if r.name == "fairseq_residual.precision"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    msg = records[0].getMessage()
    assert f"this run is not on CUDA ({why})" in msg and "trains in fp32" in msg
    assert "--bf16/--fp16 also need a GPU in stock fairseq" in msg and "drop --amp" in msg


@pytest.mark.parametrize(
    "cfg, cuda",
    [(_cfg(), True), (_cfg(amp=False, cpu=True), False),
     (_cfg(cpu=True, fp16=True), False),  # fairseq's Trainer refuses --amp with --fp16 right after
     (namespace_config(argparse.Namespace(amp=False, cpu=True)), False), (namespace_config(argparse.Namespace()), False)],
)
def test_no_warning_with_cuda_or_without_amp(cfg, cuda, caplog):
    from fairseq_residual import precision

    with caplog.at_level(logging.WARNING, logger="fairseq_residual.precision"):
        assert precision.warn_without_cuda(cfg, cuda_available=cuda) == []
    assert not [r for r in caplog.records if r.name == "fairseq_residual.precision"]


def test_amp_with_fp16_under_fsdp_keeps_the_warnings(caplog):
    """fairseq's refusal of --amp with --fp16 sits outside --ddp-backend fully_sharded: there the warnings stay."""
    from omegaconf import OmegaConf

    from fairseq_residual import precision

    cfg = OmegaConf.create({"common": {"amp": True, "fp16": True, "cpu": True},
                            "distributed_training": {"ddp_backend": "fully_sharded"}})
    assert len(precision.warn_without_cuda(cfg, cuda_available=False)) == 2


def test_fairseq_train_bf16_is_refused_before_its_trainer_fails(tiny_data_bin):
    """fairseq-train --bf16 sets --tpu (fairseq issue 4696); without torch_xla its Trainer fails on an
    AttributeError. The plugin's check refuses it first, naming the entry point where bf16 runs."""
    _, data_bin = tiny_data_bin
    with pytest.raises(AssertionError) as raised:
        fairseq_main("fairseq-train", data_bin, "--user-dir", USER_DIR, "--task", "translation", "--cpu", "--bf16",
                     "--fp16-no-flatten-grads", *TRAIN)
    assert "SettingError: fairseq-train --bf16 (or --memory-efficient-bf16) also turns on --tpu" in str(raised.value)
    assert "fairseq-hydra-train" in str(raised.value) and "xla_device" in str(raised.value)


@pytest.mark.parametrize("common, xla, refused", [
    ({"bf16": True, "tpu": True}, False, "fairseq-train --bf16"),  # what fairseq-train --bf16 gives
    ({"tpu": True}, False, "drop --tpu"),
    ({"bf16": True, "tpu": True}, True, None),  # a TPU machine
    ({"bf16": True}, False, None),  # fairseq-hydra-train's common.bf16=true: no --tpu
    ({}, False, None),
])
def test_tpu_without_torch_xla_is_refused(common, xla, refused):
    from omegaconf import OmegaConf

    from fairseq_residual import precision

    cfg = OmegaConf.create({"common": common})
    if refused is None:
        assert precision.refuse_tpu_without_xla(cfg, xla_available=xla) is None
    else:
        with pytest.raises(ValueError, match=re.escape(refused)):
            precision.refuse_tpu_without_xla(cfg, xla_available=xla)

"""--amp without CUDA (fairseq_residual/precision.py): fairseq's AMP is CUDA-only (torch.cuda.amp autocast in
``FairseqTask.train_step``, ``torch.cuda.amp.GradScaler`` in ``fairseq/optim/amp_optimizer.py``), so on the CPU
an ``--amp`` run silently trains in fp32; the plugin says so in a warning."""
import argparse
import logging
import re

import pytest

from conftest import USER_DIR
from inprocess import fairseq_main

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


def _cfg(amp=True, cpu=False, tpu=False):
    from omegaconf import OmegaConf

    return OmegaConf.create({"common": {"amp": amp, "cpu": cpu, "tpu": tpu}})


@pytest.mark.parametrize(
    "cfg, cuda, why",
    [
        (_cfg(cpu=True), True, "--cpu"),  # a GPU machine, run with --cpu
        (_cfg(), False, "no CUDA device"),  # no GPU at all
        (argparse.Namespace(amp=True, cpu=False), False, "no CUDA device"),  # the args build_model sees
        (argparse.Namespace(amp=True, cpu=True), True, "--cpu"),
    ],
)
def test_amp_without_cuda_is_named(cfg, cuda, why, caplog):
    from fairseq_residual import precision

    precision._warned.clear()
    with caplog.at_level(logging.WARNING, logger="fairseq_residual.precision"):
        assert precision.warn_if_amp_without_cuda(cfg, cuda_available=cuda) is True
        assert precision.warn_if_amp_without_cuda(cfg, cuda_available=cuda) is True  # logged once only
    records = [r for r in caplog.records if r.name == "fairseq_residual.precision"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    msg = records[0].getMessage()
    assert f"this run is on the CPU ({why})" in msg and "trains in fp32" in msg
    assert "--bf16/--fp16 also need a GPU in stock fairseq" in msg and "drop --amp" in msg


@pytest.mark.parametrize(
    "cfg, cuda",
    [(_cfg(), True), (_cfg(amp=False, cpu=True), False), (argparse.Namespace(amp=False, cpu=True), False),
     (argparse.Namespace(), False)],
)
def test_no_warning_with_cuda_or_without_amp(cfg, cuda, caplog):
    from fairseq_residual import precision

    precision._warned.clear()
    with caplog.at_level(logging.WARNING, logger="fairseq_residual.precision"):
        assert precision.warn_if_amp_without_cuda(cfg, cuda_available=cuda) is False
    assert not [r for r in caplog.records if r.name == "fairseq_residual.precision"]


def test_hook_is_fairseqs_amp_optimizer():
    """The warning comes from where fairseq turns AMP on (Trainer._build_optimizer -> AMPOptimizer), so it
    covers every task and fairseq-hydra-train; the stock builder still builds the optimizer."""
    import fairseq_residual  # noqa: F401
    from fairseq.optim.amp_optimizer import AMPOptimizer

    assert AMPOptimizer.build_optimizer.__func__.__module__ == "fairseq_residual.precision"
    assert AMPOptimizer.build_optimizer.__wrapped_stock__.__module__ == "fairseq.optim.amp_optimizer"

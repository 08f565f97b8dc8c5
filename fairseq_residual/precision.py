"""Say what fairseq does not about mixed precision on a machine without CUDA.

* ``--amp`` trains in fp32 there. fairseq's automatic mixed precision is CUDA-only: ``FairseqTask.train_step``
  runs the forward pass under ``torch.cuda.amp.autocast`` (``fairseq/tasks/fairseq_task.py``) and
  ``AMPOptimizer`` scales the loss with ``torch.cuda.amp.GradScaler`` (``fairseq/optim/amp_optimizer.py``). On a
  run without CUDA (``--cpu``, or a machine without a GPU) torch disables both with a ``UserWarning`` that is easy
  to miss, and fairseq logs ``loss_scale=1`` as if AMP were on.
* ``--fp16`` fails there at its first loss-scale overflow: fairseq's ``Trainer`` answers each gradient overflow
  (the first ones are normal: the scale starts at ``--fp16-init-scale`` and halves on each) with
  ``torch.tensor(0.0).cuda()`` (``fairseq/trainer.py``, ``train_step``), which raises 'Torch not compiled with
  CUDA enabled'.

* ``fairseq-train --bf16`` also sets ``--tpu`` (``fairseq/options.py``, ``parse_args_and_arch``: "if args.bf16:
  args.tpu = True"; fairseq issue 4696), and without torch_xla fairseq's ``Trainer`` then fails on
  ``utils.get_tpu_device()`` with "AttributeError: 'NoneType' object has no attribute 'xla_device'", on a CPU
  and on a GPU alike. ``fairseq-hydra-train`` does not set it.

:func:`warn_without_cuda` logs one WARNING per such setting, and :func:`refuse_tpu_without_xla` refuses the
last with the fix. The plugin's wrap of fairseq's ``Trainer.__init__`` (:mod:`fairseq_residual.training_checks`)
calls both for every model, task and entry point (fairseq-train, fairseq-hydra-train), before the first batch.
Nothing else changes.
"""
import logging
from typing import List, Optional

import torch

from .schemes.base import setting
from .user_errors import SettingError

logger = logging.getLogger(__name__)


def _not_on_cuda(cfg, cuda_available: Optional[bool]) -> Optional[str]:
    """Why the run of fairseq config ``cfg`` is not on CUDA, as fairseq's ``Trainer`` decides its device
    (``torch.cuda.is_available() and not cfg.common.cpu and not tpu``): ``"--cpu"``, ``"--tpu"`` or
    ``"no CUDA device"``; None on CUDA. ``cuda_available`` defaults to ``torch.cuda.is_available()``."""
    if setting(cfg, "common", "cpu", False):
        return "--cpu"
    if setting(cfg, "common", "tpu", False):
        return "--tpu"
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    return None if cuda_available else "no CUDA device"


def amp_without_cuda(cfg, cuda_available: Optional[bool] = None) -> Optional[str]:
    """Why the ``--amp`` of fairseq config ``cfg`` (``cfg.common.amp``, ``.cpu``, ``.tpu``) has no effect, or None
    (no ``--amp``, or a CUDA run).

    Returns:
        ``"--cpu"``, ``"--tpu"`` or ``"no CUDA device"``.
    """
    return _not_on_cuda(cfg, cuda_available) if setting(cfg, "common", "amp", False) else None


def fp16_without_cuda(cfg, cuda_available: Optional[bool] = None) -> Optional[str]:
    """Why the fp16 training of fairseq config ``cfg`` (``cfg.common.fp16``; fairseq-train's parser sets it for
    ``--memory-efficient-fp16`` too) will fail at its first loss-scale overflow, or None (no fp16, or a CUDA
    run); as :func:`amp_without_cuda`."""
    return _not_on_cuda(cfg, cuda_available) if setting(cfg, "common", "fp16", False) else None


def refuse_tpu_without_xla(cfg, xla_available: Optional[bool] = None) -> None:
    """Refuse ``--tpu`` (``cfg.common.tpu``) where torch_xla is not installed, before fairseq's ``Trainer`` fails
    on it with an AttributeError; for ``fairseq-train --bf16``, which sets ``--tpu`` itself, name the ways bf16
    does run. ``xla_available`` defaults to whether ``torch_xla`` can be imported.

    Raises:
        ValueError: ``--tpu`` without torch_xla.
    """
    if not setting(cfg, "common", "tpu", False):
        return
    if xla_available is None:
        import importlib.util

        xla_available = importlib.util.find_spec("torch_xla") is not None
    if xla_available:
        return
    if setting(cfg, "common", "bf16", False):
        raise SettingError(
            "fairseq-train --bf16 (or --memory-efficient-bf16) also turns on --tpu (fairseq's options.py; fairseq "
            "issue 4696), and torch_xla is not installed, so fairseq's Trainer would fail ('NoneType' object has no "
            "attribute 'xla_device'). Train in bf16 through fairseq-hydra-train instead (common.bf16=true, with "
            "common.fp16_no_flatten_grads=true or common.memory_efficient_bf16=true; scripts/train.sh --precision "
            "bf16 does this), or with --amp on a GPU, or in fp32")
    raise SettingError("--tpu (common.tpu) needs torch_xla, which is not installed: drop --tpu")


def warn_without_cuda(cfg, cuda_available: Optional[bool] = None) -> List[str]:
    """Log a WARNING for each mixed-precision setting of fairseq config ``cfg`` that a run without CUDA does not
    honour (``--amp``: trains in fp32; ``--fp16``: fails at its first overflow). Returns the messages logged.
    ``--amp`` with ``--fp16`` gets none: fairseq's ``Trainer`` refuses the pair next ('Cannot use fp16 and AMP
    together', an assert outside ``--ddp-backend fully_sharded``), and a warning that the run trains in fp32 would
    say otherwise.

    Args: as :func:`amp_without_cuda`.
    """
    messages = []
    if (setting(cfg, "common", "amp", False) and setting(cfg, "common", "fp16", False)
            and setting(cfg, "distributed_training", "ddp_backend", None) != "fully_sharded"):
        return messages
    why = amp_without_cuda(cfg, cuda_available)
    if why is not None:
        messages.append(
            f"--amp (common.amp) has no effect: fairseq's AMP is CUDA-only (torch.cuda.amp autocast and "
            f"GradScaler) and this run is not on CUDA ({why}), so it trains in fp32 (loss_scale stays 1). On the "
            f"CPU drop --amp; for mixed precision train on a GPU (--amp; --bf16/--fp16 also need a GPU in "
            f"stock fairseq)"
        )
    why = fp16_without_cuda(cfg, cuda_available)
    if why is not None:
        messages.append(
            f"fp16 training without CUDA ({why}): fairseq's Trainer answers each gradient overflow of its loss scaler "
            "(its first overflows are normal: the scale starts at --fp16-init-scale and halves on each) with "
            "torch.tensor(0.0).cuda(), which fails without CUDA ('Torch not compiled with CUDA enabled'); on a "
            "CPU train in fp32, or in bf16 through fairseq-hydra-train (common.bf16=true "
            "common.fp16_no_flatten_grads=true, or common.memory_efficient_bf16=true; fairseq-train's --bf16 and "
            "--memory-efficient-bf16 turn on --tpu)"
        )
    for message in messages:
        logger.warning(message)
    return messages

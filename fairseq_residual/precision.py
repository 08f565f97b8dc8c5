"""Say what fairseq does not: ``--amp`` without CUDA trains in fp32.

fairseq's automatic mixed precision is CUDA-only: ``FairseqTask.train_step`` runs the forward pass under
``torch.cuda.amp.autocast`` (``fairseq/tasks/fairseq_task.py``) and ``AMPOptimizer`` scales the loss with
``torch.cuda.amp.GradScaler`` (``fairseq/optim/amp_optimizer.py``). On a run without CUDA (``--cpu``, or a
machine without a GPU) torch disables both with a ``UserWarning`` that is easy to miss, and fairseq logs
``loss_scale=1`` as if AMP were on: the run silently trains in fp32.

Importing the plugin wraps ``AMPOptimizer.build_optimizer``, which fairseq's ``Trainer._build_optimizer``
calls exactly when it turns AMP on (``common.amp``), for every task and entry point (fairseq-train,
fairseq-hydra-train): the build logs one WARNING from :func:`warn_if_amp_without_cuda` when the run is not
on CUDA, then builds the optimizer as fairseq does. Nothing else changes.
"""
import logging
from typing import Optional

import torch
from fairseq.optim.amp_optimizer import AMPOptimizer

logger = logging.getLogger(__name__)

#: messages already logged in this process (one warning per process, however often it is checked)
_warned = set()

_stock_build_optimizer = getattr(
    AMPOptimizer.build_optimizer, "__wrapped_stock__", AMPOptimizer.build_optimizer.__func__
)


def _option(cfg, name: str):
    """``cfg.common.<name>`` of a fairseq config (``FairseqConfig`` / ``DictConfig``), or ``cfg.<name>`` of
    the ``argparse.Namespace`` that a legacy model's ``build_model`` sees; False when absent."""
    source = getattr(cfg, "common", None)
    if source is None:
        source = cfg
    return bool(getattr(source, name, False))


def amp_without_cuda(cfg, cuda_available: Optional[bool] = None) -> Optional[str]:
    """Why the ``--amp`` of ``cfg`` has no effect, or None (no ``--amp``, or a CUDA run).

    Args:
        cfg: the run's fairseq config (``cfg.common.amp``, ``cfg.common.cpu``, ``cfg.common.tpu``) or
            training args (``args.amp``, ``args.cpu``, ``args.tpu``).
        cuda_available: whether CUDA is usable (default ``torch.cuda.is_available()``).

    Returns:
        ``"--cpu"`` or ``"no CUDA device"`` (or ``"--tpu"``): as fairseq's ``Trainer`` decides its device
        (``torch.cuda.is_available() and not cfg.common.cpu and not tpu``).
    """
    if not _option(cfg, "amp"):
        return None
    if _option(cfg, "cpu"):
        return "--cpu"
    if _option(cfg, "tpu"):
        return "--tpu"
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    return None if cuda_available else "no CUDA device"


def warn_if_amp_without_cuda(cfg, cuda_available: Optional[bool] = None) -> bool:
    """Log one WARNING (once per process) if ``cfg`` trains with ``--amp`` but not on CUDA.

    Args: as :func:`amp_without_cuda`.

    Returns:
        True if the run's ``--amp`` has no effect (whether or not this call logged the warning).
    """
    why = amp_without_cuda(cfg, cuda_available)
    if why is None:
        return False
    msg = (
        f"--amp (common.amp) has no effect: fairseq's AMP is CUDA-only (torch.cuda.amp autocast and "
        f"GradScaler) and this run is on the CPU ({why}), so it trains in fp32 (loss_scale stays 1). On the "
        f"CPU drop --amp; for mixed precision train on a GPU (--amp; --bf16/--fp16 also need a GPU in "
        f"stock fairseq)"
    )
    if msg not in _warned:
        _warned.add(msg)
        logger.warning(msg)
    return True


def _build_optimizer(cls, cfg, params, **kwargs):
    """``AMPOptimizer.build_optimizer``, after :func:`warn_if_amp_without_cuda` on the run's config."""
    warn_if_amp_without_cuda(cfg)
    return _stock_build_optimizer(cls, cfg, params, **kwargs)


def install():
    """Wrap fairseq's ``AMPOptimizer.build_optimizer`` (idempotent)."""
    _build_optimizer.__wrapped_stock__ = _stock_build_optimizer
    AMPOptimizer.build_optimizer = classmethod(_build_optimizer)


install()

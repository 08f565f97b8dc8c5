"""The checks of the training settings: the plugin's wrap of fairseq's ``Trainer.__init__``.

``fairseq-hydra-train`` builds the model from ``cfg.model`` alone (``fairseq_cli/train.py``:
``task.build_model(cfg.model)``), so a scheme's ``check_args`` never sees the precision (``common``), the
distributed backend (``distributed_training``), the optimizer or the learning-rate schedule there;
``fairseq-train`` hands the model its whole argument namespace. Both entry points then build fairseq's
``Trainer(cfg, task, model, criterion)`` with the whole config, on every rank, before the first batch and before
the optimizer exists (fairseq-train builds that at ``trainer.get_lr()``, before training). Loading the plugin wraps
``Trainer.__init__`` so that, first, :func:`check_training` runs there: the settings' warnings and refusals come
from one place under either entry point, and a refusal loses nothing.

What is checked there: for every model, ``--tpu`` without torch_xla, which ``fairseq-train --bf16`` sets
(:func:`fairseq_residual.precision.refuse_tpu_without_xla`), and mixed precision a run without CUDA does not honour
(``--amp``, ``--fp16``: :func:`fairseq_residual.precision.warn_without_cuda`); for ``residual_transformer``, the scheme's own
:meth:`~fairseq_residual.schemes.base.ResidualScheme.check_training` (Admin's refusal of fairseq's fp32 master
copy without a profile, nGPT's of FSDP, T-Fixup's warm-up and nGPT's weight decay logged).
"""
import argparse
import functools
from types import SimpleNamespace

from fairseq.trainer import Trainer

from .precision import refuse_tpu_without_xla, warn_without_cuda
from .schemes.base import scheme_of, unwrap_model

#: the groups of fairseq's config (``fairseq/dataclass/configs.py``, ``FairseqConfig``)
CONFIG_GROUPS = ("common", "common_eval", "distributed_training", "dataset", "optimization", "checkpoint", "bmuf",
                 "generation", "eval_lm", "interactive", "model", "task", "criterion", "optimizer", "lr_scheduler",
                 "scoring", "bpe", "tokenizer", "ema")


def namespace_config(args) -> SimpleNamespace:
    """A stand-in for fairseq's config made of one flat ``argparse.Namespace`` (as ``fairseq-train`` parses it):
    every group of :data:`CONFIG_GROUPS` is ``args`` itself, so ``cfg.common.bf16`` reads ``args.bf16``. Without
    fairseq's conversion of the namespace (half a second a call)."""
    return SimpleNamespace(**{group: args for group in CONFIG_GROUPS})


def check_training(cfg, model) -> None:
    """The checks of fairseq config ``cfg`` (its groups ``common``, ``distributed_training``, ``optimizer``,
    ``lr_scheduler``, ...) for training ``model`` (wrapped or not): the precision for any model, the scheme's
    checks for a ``residual_transformer``.

    Raises:
        ValueError: a setting the model's scheme cannot honour, or ``--tpu`` without torch_xla (which
            ``fairseq-train --bf16`` sets), naming the fix.
    """
    refuse_tpu_without_xla(cfg)
    warn_without_cuda(cfg)
    model = unwrap_model(model)
    scheme = scheme_of(model)
    if scheme is not None:
        scheme.check_training(cfg, model)


def _wrap(init):
    @functools.wraps(init)
    def __init__(self, cfg, task, model, criterion, *args, **kwargs):
        # fairseq's Trainer still takes an argparse.Namespace (it converts it, with a deprecation warning)
        check_training(namespace_config(cfg) if isinstance(cfg, argparse.Namespace) else cfg, model)
        init(self, cfg, task, model, criterion, *args, **kwargs)

    __init__._residual_training_checks = True
    return __init__


if not getattr(Trainer.__init__, "_residual_training_checks", False):
    Trainer.__init__ = _wrap(Trainer.__init__)

"""The scheme's hook after every optimizer step: the plugin's ``task.optimizer_step``.

fairseq's Trainer takes every update's step through ``task.optimizer_step(optimizer, model, update_num)``
(``fairseq/trainer.py``, ``train_step``; ``FairseqTask.optimizer_step`` calls ``optimizer.step()``), after the
gradients are reduced, unscaled and clipped, for every optimizer and precision wrapper (``--fp16`` / ``--bf16``,
memory-efficient, ``--amp``) and under DDP on every rank. Loading the plugin wraps ``FairseqTask.optimizer_step``
so that, after fairseq's step, a ``residual_transformer``'s scheme gets
:meth:`~fairseq_residual.schemes.base.ResidualScheme.after_optimizer_step` with the model (out of its DDP wrappers)
and fairseq's optimizer (whose fp32 master copies the scheme may need): nGPT renormalises its weights there
(:mod:`fairseq_residual.schemes.ngpt`). Other models and schemes are untouched (the default hook does nothing).

The hook runs where fairseq's step runs, so the checkpoint written after an update holds the weights as the hook
left them, and a resumed run continues from them. A task that overrides ``optimizer_step`` without calling
``FairseqTask.optimizer_step`` bypasses it; none of fairseq's translation tasks does.
"""
import functools

from fairseq.tasks import FairseqTask

from .schemes.base import scheme_of, unwrap_model


def after_step(model, optimizer) -> None:
    """The model's scheme's hook after an optimizer step (nothing for a model of another kind)."""
    model = unwrap_model(model)
    scheme = scheme_of(model)
    if scheme is not None:
        scheme.after_optimizer_step(model, optimizer)


def _wrap(step):
    @functools.wraps(step)
    def optimizer_step(self, optimizer, model, update_num):
        result = step(self, optimizer, model, update_num)
        after_step(model, optimizer)
        return result

    optimizer_step._residual_after_step = True
    return optimizer_step


if not getattr(FairseqTask.optimizer_step, "_residual_after_step", False):
    FairseqTask.optimizer_step = _wrap(FairseqTask.optimizer_step)

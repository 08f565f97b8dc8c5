"""``translation_with_grad_norms``: fairseq's translation task that can log per-layer gradient norms.

``fairseq-train --user-dir fairseq_residual --task translation_with_grad_norms
--log-grad-norm-interval N`` logs, at updates N, 2N, 3N, ..., the gradient norm of every encoder and
decoder layer's parameters to fairseq's metrics, so they appear in the ``train_inner`` log lines
(``--log-format json``) and in tensorboard (``--tensorboard-logdir``) under

* ``gnorm_enc_L01`` ... ``gnorm_enc_LNN``: encoder layer 1 (lowest, next to the embedding) to NN;
* ``gnorm_dec_L01`` ... ``gnorm_dec_LNN``: decoder layers, numbered the same way;
* ``gnorm_enc_low_top`` / ``gnorm_dec_low_top``: layer 1's norm divided by the top layer's (the
  number that shows vanishing gradients in the lower layers of a deep Post-LN stack).

What is measured: the L2 norm of the gradient of the *per-token* loss (the criterion's summed loss
divided by its sample size, as the trainer normalises before the optimizer step) with respect to
the layer's parameters, on the first micro-batch of the update (with ``--update-freq`` > 1 the
later micro-batches are not included), before gradient clipping, with the fp16 / AMP loss scale
divided out. It is the same quantity as ``fairseq-residual-analyze``'s ``param_grad_norm`` on that
batch. In multi-GPU training the value is worker 0's (DDP all-reduces the gradients during the
backward pass when ``--update-freq`` is 1; FSDP-flattened parameters are not supported).

Cost: with ``--log-grad-norm-interval 0`` (the default) ``train_step`` adds one integer comparison
to fairseq's; when on, one pass over the parameter gradients every N updates.

Gradients exist only after the backward pass, so a criterion cannot see them in its own step: the
norms are taken in the task's ``train_step`` right after fairseq's forward and backward.

Resuming reproduces the run it continues (:meth:`TranslationWithGradNormsTask.get_batch_iterator`):
fairseq's own ``translation`` task, in the fairseq source this project installs, batches the training
set differently in a process that starts in epoch E > 1 than in one that started in epoch 1, so a run
resumed after its first epoch is not the run it continues.
"""
import math
from dataclasses import dataclass, field

import torch

from fairseq import metrics
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from .schemes.base import unwrap_model
from .user_errors import SettingError

TASK_NAME = "translation_with_grad_norms"

#: Sort the per-layer keys after fairseq's own (loss, ppl, wps, ..., gnorm has priority 400).
METRIC_PRIORITY = 1000


@dataclass
class TranslationWithGradNormsConfig(TranslationConfig):
    log_grad_norm_interval: int = field(
        default=0,
        metadata={
            "help": "log the gradient norm of every encoder/decoder layer's parameters "
            "(metrics gnorm_enc_L01..., gnorm_dec_L01..., gnorm_{enc,dec}_low_top) every N "
            "updates, at updates N, 2N, ...; 0 = off (no cost)"
        },
    )


def layer_grad_norms(layers):
    """L2 norm of the gradient of each layer's parameters, as a 1-D float32 tensor (one per layer).

    Parameters without a gradient count as zero. A layer without any gradient gives 0.
    """
    norms = []
    for layer in layers:
        grads = [p.grad.detach().float().norm() for p in layer.parameters() if p.grad is not None]
        norms.append(torch.stack(grads).norm() if grads else torch.zeros(()))
    if not norms:
        return torch.zeros(0)
    device = norms[0].device
    return torch.stack([n.to(device) for n in norms])


def loss_scale_of(optimizer):
    """The factor the optimizer multiplied the loss by before backward (fp16 / AMP), else 1."""
    scaler = getattr(optimizer, "scaler", None)
    if scaler is None:
        return 1.0
    if hasattr(scaler, "loss_scale"):  # fairseq's DynamicLossScaler (--fp16, --memory-efficient-fp16)
        return float(scaler.loss_scale)
    if hasattr(scaler, "get_scale"):  # torch GradScaler (--amp)
        return float(scaler.get_scale())
    return 1.0


def log_layer_grad_norms(model, sample_size, loss_scale=1.0):
    """Log the per-layer gradient norms of ``model`` to fairseq's metrics; return them as a dict.

    Args:
        model: a (possibly DDP-wrapped) encoder-decoder with ``encoder.layers`` / ``decoder.layers``.
        sample_size: the criterion's sample size (target tokens) of the loss that was back-propagated.
        loss_scale: fp16 / AMP loss scale included in the gradients.

    Returns:
        ``{metric name: value}`` of what was logged (empty when nothing finite was found).
    """
    model = unwrap_model(model)
    denom = float(sample_size) * float(loss_scale)
    if not denom > 0:
        return {}
    logged = {}
    for stack, short in (("encoder", "enc"), ("decoder", "dec")):
        layers = getattr(getattr(model, stack, None), "layers", None)
        if not layers:
            continue
        values = (layer_grad_norms(layers) / denom).tolist()
        if not all(math.isfinite(v) for v in values):  # an fp16 overflow step: skipped by fairseq too
            continue
        for i, value in enumerate(values, 1):
            logged[f"gnorm_{short}_L{i:02d}"] = value
        if values[-1] > 0:
            logged[f"gnorm_{short}_low_top"] = values[0] / values[-1]
    for key, value in logged.items():
        metrics.log_scalar(key, value, priority=METRIC_PRIORITY)
    return logged


@register_task(TASK_NAME, dataclass=TranslationWithGradNormsConfig)
class TranslationWithGradNormsTask(TranslationTask):
    """fairseq's ``translation`` task plus ``--log-grad-norm-interval N`` (see the module docstring)."""

    def __init__(self, cfg: TranslationWithGradNormsConfig, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self.log_grad_norm_interval = int(getattr(cfg, "log_grad_norm_interval", 0) or 0)
        if self.log_grad_norm_interval < 0:
            raise SettingError(
                f"--log-grad-norm-interval must be >= 0 (0 = off), got {self.log_grad_norm_interval}"
            )
        self._grad_norm_logged_update = -1

    def get_batch_iterator(self, dataset, *args, **kwargs):
        """fairseq's batch iterator, with the batches sorted as a run that started in epoch 1 sorts them.

        fairseq (``FairseqTask.get_batch_iterator``, ``make_batches``, in fairseq main and fairseq-fixed
        0.12.3.1) sorts the examples into batches once, under the numpy seed ``seed + epoch`` of the epoch
        the process starts in, and keeps those batches for every later epoch (only their order is
        shuffled per epoch). A run resumed in epoch E > 1 therefore sorts under ``seed + E``: examples of
        equal length land in another order within a batch, or in another batch, than in the run it
        continues, which changes its dropout masks and float sums from the first update on (a 6-layer
        Post-LN model resumed at the start of epoch 2 differed from the uninterrupted run by up to 1e-3
        in its weights five updates later). Here the batches of a new iterator are sorted under epoch
        1's seed and the iterator is then set to the epoch asked for (fairseq's resume sets it again
        from the checkpoint), so that a resumed CPU run equals the uninterrupted one bit for bit.

        Left as fairseq does it when the batches are made per epoch anyway: the iterator cache is off
        (``disable_iterator_cache``, sharded data), ``update_epoch_batch_itr`` is set, the dataset cannot
        reuse its iterator across epochs, or the task rebuilds its batches every epoch.
        """
        epoch = kwargs.get("epoch", 1)
        once = (
            epoch > 1
            and not kwargs.get("disable_iterator_cache", False)
            and not kwargs.get("update_epoch_batch_itr", False)
            and self.can_reuse_epoch_itr(dataset)
            and not getattr(self.cfg, "rebuild_batches", False)
        )
        if not once:
            return super().get_batch_iterator(dataset, *args, **kwargs)
        cached = dataset in self.dataset_to_epoch_iter
        itr = super().get_batch_iterator(dataset, *args, **dict(kwargs, epoch=1))
        if not cached:
            itr.epoch = epoch
        return itr

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False, **kwargs):
        """fairseq's forward and backward; then, every N updates, the per-layer gradient norms."""
        out = super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad, **kwargs)
        if self.log_grad_norm_interval > 0:  # the whole cost when off
            self._maybe_log_grad_norms(model, optimizer, update_num, out[1], ignore_grad)
        return out

    def _maybe_log_grad_norms(self, model, optimizer, update_num, sample_size, ignore_grad):
        # update_num counts the updates done before this one: log at updates N, 2N, ... (1-based),
        # once per update (first micro-batch only; also skips fairseq's NaN-detector / AMP re-runs).
        if (update_num + 1) % self.log_grad_norm_interval or ignore_grad:
            return
        if update_num == self._grad_norm_logged_update:
            return
        self._grad_norm_logged_update = update_num
        with torch.no_grad():
            log_layer_grad_norms(model, sample_size, loss_scale_of(optimizer))

"""``--lr-scheduler inverse_sqrt_nowarmup``: the inverse-square-root decay without warm-up that T-Fixup
trains with (Huang et al. 2020, section 4; layer6ai-labs/T-Fixup,
``fairseq/optim/lr_scheduler/inverse_sqrt_nowarmup_schedule.py``):

    lr_t = lr * sqrt(P / (P + t))

for update t (0 at the start) and decay period P (``--decay-period``, 4000 in the reference recipe): the
learning rate starts at ``--lr`` and has fallen by 1/sqrt(2) after P updates. Registered under the
reference's name so that its command lines run unchanged.
"""
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import List

from omegaconf import II

from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler

from .user_errors import SettingError


@dataclass
class InverseSqrtNoWarmupConfig(FairseqDataclass):
    decay_period: int = field(
        default=4000,
        metadata={"help": "decay period P in updates: lr_t = lr * sqrt(P / (P + t)), "
                          "so the learning rate has fallen by 1/sqrt(2) after P updates"},
    )
    lr: List[float] = II("optimization.lr")


@register_lr_scheduler("inverse_sqrt_nowarmup", dataclass=InverseSqrtNoWarmupConfig)
class InverseSqrtNoWarmupSchedule(FairseqLRScheduler):
    """``lr_t = lr * sqrt(P / (P + t))`` from update 0, no warm-up.

    Raises:
        ValueError: more than one ``--lr`` value, or a decay period below 1.
    """

    def __init__(self, cfg: InverseSqrtNoWarmupConfig, optimizer):
        super().__init__(cfg, optimizer)
        if isinstance(cfg.lr, Collection) and len(cfg.lr) > 1:
            raise SettingError(
                "--lr-scheduler inverse_sqrt_nowarmup takes one --lr value; for a per-epoch list use "
                "--lr-scheduler fixed"
            )
        if cfg.decay_period < 1:
            raise SettingError(f"--decay-period must be a positive number of updates, got {cfg.decay_period}")
        self.init_lr = cfg.lr[0] if isinstance(cfg.lr, Collection) else cfg.lr
        self.lr = self.init_lr
        self.optimizer.set_lr(self.lr)

    def step(self, epoch, val_loss=None):
        """No change at epoch boundaries."""
        super().step(epoch, val_loss)
        return self.optimizer.get_lr()

    def step_update(self, num_updates):
        """Set and return ``lr * sqrt(P / (P + num_updates))``."""
        period = self.cfg.decay_period
        self.lr = self.init_lr * (period / (period + num_updates)) ** 0.5
        self.optimizer.set_lr(self.lr)
        return self.lr

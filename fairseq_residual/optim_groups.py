"""Per-parameter optimizer overrides for every fairseq optimizer: the smallest mechanism that lets a scheme
exempt parameters from ``--weight-decay`` (hyper-connections' static connection weights, trained without
weight decay in their paper).

fairseq already has the attribute: a parameter may carry ``optim_overrides``, a dict of optimizer settings
(fairseq's ``--optimizer composite`` reads it, and its fp16 optimizer copies it to the fp32 master
parameters, ``fairseq/optim/fp16_optimizer.py``), but every other optimizer builds one parameter group from
a flat list and ignores it. Loading the plugin wraps ``fairseq.optim.build_optimizer``, which the trainer,
the fp16, memory-efficient fp16 and AMP wrappers all call: after fairseq built the optimizer, parameters
with ``optim_overrides`` move out of their group into a group of their own with those settings, the learning
rate and the other settings copied from their group, so that schedulers, which set every group's ``lr``, keep
treating them alike. They move also where their settings agree with the group's: the groups then depend on the
model, not on the options' values, and a run resumed with other options finds the groups it saved. A flat fp16 master copy (``--fp16`` without
``--fp16-no-flatten-grads``) holds no per-parameter attribute: building it for parameters with overrides is
refused (:func:`flat_master_copy_refusal`) where fairseq's Trainer is built, under either entry point
(:meth:`fairseq_residual.schemes.base.ResidualScheme.check_training`).

Two override keys are multipliers rather than settings, for rules that scale whatever the options give (Depth-µP's
per-stack learning rate and eps, :mod:`fairseq_residual.schemes.depth_mup`):

* ``lr_scale``: kept in the parameter group (``group["lr_scale"]``); the group's learning rate is the scheduler's
  times it. Schedulers set every group's ``lr`` through the optimizer's ``set_lr``, which the wrapper follows by
  multiplying each group that has an ``lr_scale`` (:func:`scale_lr_on_set`). The key is saved with the
  optimizer's groups and restored by ``load_state_dict``, so a resumed run scales as the run it continues;
* ``eps_scale``: multiplies the group's ``eps`` once, when the group is made (only a numeric ``eps``: Adam's,
  Adagrad's; Adafactor's pair and optimizers without eps are left as they are).
"""
import functools
import logging
from typing import Iterable, Optional

import fairseq.optim

from .optimizer_order import remap_on_load

logger = logging.getLogger(__name__)

#: override keys that multiply a setting instead of replacing it
LR_SCALE, EPS_SCALE = "lr_scale", "eps_scale"


def _settings(group: dict, overrides) -> dict:
    """The settings of a new group for parameters of ``group`` with ``overrides`` (``(key, value)`` pairs)."""
    settings = {k: v for k, v in group.items() if k != "params"}
    settings.update({k: v for k, v in overrides if k in group and k not in (LR_SCALE, EPS_SCALE)})
    for k, v in overrides:
        if k == LR_SCALE:
            settings[LR_SCALE] = float(v)
            settings["lr"] = group["lr"] * float(v)
        elif k == EPS_SCALE and isinstance(group.get("eps"), (int, float)) and not isinstance(group["eps"], bool):
            settings["eps"] = group["eps"] * float(v)
    return settings


def apply_overrides(optimizer) -> int:
    """Move every parameter of ``optimizer`` (a fairseq optimizer or a torch one) that carries
    ``optim_overrides`` into its own parameter group with those settings. Returns how many moved."""
    torch_optimizer = getattr(optimizer, "optimizer", optimizer)
    groups = getattr(torch_optimizer, "param_groups", None)
    if groups is None:
        return 0
    moved = 0
    for group in list(groups):
        by_override = {}
        for p in group["params"]:
            overrides = getattr(p, "optim_overrides", None)
            if overrides:  # a group of its own even where the settings agree (--weight-decay 0): the groups
                # then depend on the model only, and a run resumed with other settings finds the groups it saved
                by_override.setdefault(tuple(sorted(overrides.items())), []).append(p)
        if not by_override:
            continue
        exempt = {id(p) for ps in by_override.values() for p in ps}
        group["params"] = [p for p in group["params"] if id(p) not in exempt]
        for overrides, params in by_override.items():
            torch_optimizer.add_param_group(dict(_settings(group, overrides), params=params))
            moved += len(params)
    if moved:
        logger.info(f"optimizer: {moved} parameter tensor(s) in groups of their own (optim_overrides)")
    return moved


def flat_master_copy_refusal(flat: bool, keys: Iterable[str], weight_decay: float) -> Optional[str]:
    """Why fairseq's flat fp32 master copy of ``--fp16`` (``flat``: fp16 without ``--fp16-no-flatten-grads``,
    ``--memory-efficient-fp16`` or bf16) cannot train parameters whose ``optim_overrides`` set ``keys``, or None:
    the flat copy is one tensor in one parameter group. Overrides of weight decay alone are harmless at
    ``weight_decay`` 0."""
    keys = set(keys)
    if not flat or not keys or (keys == {"weight_decay"} and not (weight_decay or 0) > 0):
        return None
    return (f"--fp16 keeps one flat fp32 copy of all weights, which has no room for that: add --fp16-no-flatten-grads "
            f"(fairseq-hydra-train: common.fp16_no_flatten_grads=true), or use --memory-efficient-fp16"
            f"{', --weight-decay 0' if keys == {'weight_decay'} else ''} or bf16 (through fairseq-hydra-train: "
            f"common.bf16=true common.fp16_no_flatten_grads=true; fairseq-train's --bf16 turns on --tpu)")


def scale_lr_on_set(optimizer) -> None:
    """Make ``optimizer.set_lr(lr)`` (a fairseq optimizer; every scheduler sets the learning rate through it) give
    each parameter group with an ``lr_scale`` the learning rate ``lr * lr_scale``, the others ``lr``.
    ``get_lr`` reads the first group, which holds no override (the moved parameters' groups come after it)."""
    set_lr = optimizer.set_lr

    def scaled_set_lr(lr):
        set_lr(lr)
        for group in optimizer.param_groups:
            if LR_SCALE in group:
                group["lr"] = lr * group[LR_SCALE]

    optimizer.set_lr = scaled_set_lr


def _wrap(build):
    @functools.wraps(build)
    def build_optimizer(cfg, params, *args, **kwargs):
        optimizer = build(cfg, params, *args, **kwargs)
        apply_overrides(optimizer)
        scale_lr_on_set(optimizer)
        remap_on_load(optimizer)  # a checkpoint's optimizer state onto the parameters of the same name
        return optimizer

    build_optimizer._residual_overrides = True
    return build_optimizer


if not getattr(fairseq.optim.build_optimizer, "_residual_overrides", False):
    fairseq.optim.build_optimizer = _wrap(fairseq.optim.build_optimizer)

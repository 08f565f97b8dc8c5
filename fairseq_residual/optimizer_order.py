"""Resuming optimizer state onto the right parameters when the model's parameter order changed.

fairseq saves the optimizer's state positionally (torch's ``Optimizer.state_dict``: state by parameter
index, in the order the trainer handed the parameters over, ``model.parameters()``) and loads it back by
position (``fairseq/trainer.py``, ``load_checkpoint``). A checkpoint saved by a version of a scheme whose
modules registered their parameters in another order (Admin and DLCL before the residual protocol) then
gets its Adam moments on the wrong parameters: a crash where shapes differ (``output with shape [64]
doesn't match the broadcast shape [64, 64]``), silently wrong moments where they agree.

The checkpoint itself says what the order was: ``state["model"]`` lists the saved model's tensors in its
registration order. :func:`record_saved_order` (called by the model's ``load_state_dict``, after the
scheme's renames of older parameter names) gives every parameter its position in that order when it
differs from today's; the loading of the optimizer state (every optimizer built through
``fairseq.optim.build_optimizer``, see :mod:`.optim_groups`) then moves each state entry to the parameter of
the same name (:func:`in_current_order`) and refuses state that does not fit its parameter's shape. The
same mapping splits the one parameter group of a checkpoint saved before the groups depended only on the
model (a hyper-connections run saved with ``--weight-decay 0``) into today's groups.
"""
from typing import Dict, List

from torch import nn

from .user_errors import SettingError

#: the attribute holding a parameter's position among the trainable parameters of the saved model (set only
#: while the checkpoint's order differs from the model's)
SAVED_POSITION = "residual_saved_position"

#: optimizer state entries that have their parameter's shape (Adam, AdamW, SGD with momentum, Adagrad,
#: RMSprop, Adafactor's unfactored moments); others (Adafactor's row / column factors, step counts) are not
#: checked
PARAM_SHAPED = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "sum", "square_avg")


def record_saved_order(model: nn.Module, saved_tensors: List, state_dict: Dict) -> bool:
    """Mark each trainable parameter of ``model`` with its position in the saved model's parameter order.

    Args:
        model: the model the state was just loaded into.
        saved_tensors: the checkpoint's model tensors in the order it listed them (before any renaming).
        state_dict: the same tensors under today's names (after the scheme's upgrade and pruning).

    Returns:
        True when the saved order differs from the model's. The parameters carry :data:`SAVED_POSITION`
        unless the order cannot be told (a parameter the checkpoint lacks): the optimizer state then loads by
        position, as fairseq does.
    """
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for _, p in params:
        if hasattr(p, SAVED_POSITION):
            delattr(p, SAVED_POSITION)
    name_of = {}
    for key, value in state_dict.items():
        name_of.setdefault(id(value), key)
    trainable = {n for n, _ in params}
    saved = []
    for tensor in saved_tensors:
        name = name_of.get(id(tensor))
        if name in trainable and name not in saved:
            saved.append(name)
    if len(saved) != len(params):
        return False
    position = {n: i for i, n in enumerate(saved)}
    for n, p in params:
        setattr(p, SAVED_POSITION, position[n])
    return saved != [n for n, _ in params]


def in_current_order(param_groups: List[dict], state_dict: dict) -> dict:
    """The optimizer ``state_dict`` of a checkpoint with each parameter's state moved to where today's
    optimizer (``param_groups``: its groups, the parameters in each) holds that parameter.

    The saved optimizer held either the same groups (the same rule sorts parameters into them,
    :mod:`.optim_groups`) or one group (a checkpoint of a version that split groups only where the settings
    differed, e.g. saved with ``--weight-decay 0``), each group's parameters in the saved model's order
    (:data:`SAVED_POSITION`). From one saved group, every group takes the saved settings and its parameters'
    own ``optim_overrides``. Without positions the state is returned as it is. Either way, a state tensor that
    should have its parameter's shape (:data:`PARAM_SHAPED`) and does not is refused.

    Raises:
        ValueError: a parameter's saved state does not fit its shape, naming the fix (``--reset-optimizer``).
    """
    flat = [p for g in param_groups for p in g["params"]]
    saved_groups = state_dict.get("param_groups", [])
    saved_ids = [i for g in saved_groups for i in g["params"]]
    state = state_dict.get("state", {})
    regroup = len(saved_groups) == 1 < len(param_groups)
    if len(saved_ids) != len(flat) or (len(saved_groups) != len(param_groups) and not regroup):
        return state_dict  # torch refuses it, naming the group sizes
    if flat and all(hasattr(p, SAVED_POSITION) for p in flat):
        by_position = lambda q: getattr(q, SAVED_POSITION)  # noqa: E731
        saved_flat = sorted(flat, key=by_position) if regroup else \
            [p for g in param_groups for p in sorted(g["params"], key=by_position)]
        saved_index = {id(p): j for j, p in enumerate(saved_flat)}
        sources = [saved_ids[saved_index[id(p)]] for p in flat]
        if regroup:
            settings = {k: v for k, v in saved_groups[0].items() if k != "params"}
            groups, start = [], 0
            for g in param_groups:
                overrides = {k: v for p in g["params"] for k, v in (getattr(p, "optim_overrides", None) or {}).items()
                             if k in settings}
                groups.append(dict(settings, **overrides, params=list(range(start, start + len(g["params"])))))
                start += len(g["params"])
            state = {k: state[source] for k, source in enumerate(sources) if source in state}
            state_dict = dict(state_dict, state=state, param_groups=groups)
            saved_ids = list(range(len(flat)))
        else:
            state = {saved_ids[k]: state[source] for k, source in enumerate(sources) if source in state}
            state_dict = dict(state_dict, state=state)
    for k, p in enumerate(flat):
        for key, value in state.get(saved_ids[k], {}).items():
            if key in PARAM_SHAPED and hasattr(value, "shape") and value.shape != p.shape:
                raise SettingError(
                    f"the checkpoint's optimizer state '{key}' of parameter {k} has shape {tuple(value.shape)} but the "
                    f"parameter has shape {tuple(p.shape)}: the checkpoint's optimizer state belongs to another "
                    f"parameter layout; resume with --reset-optimizer (keeps the weights, restarts Adam's moments)"
                )
    return state_dict


def remap_on_load(optimizer) -> None:
    """Make ``optimizer.load_state_dict`` (a fairseq optimizer) apply :func:`in_current_order` first."""
    load = optimizer.load_state_dict

    def load_state_dict(state_dict, optimizer_overrides=None):
        return load(in_current_order(optimizer.param_groups, state_dict), optimizer_overrides)

    optimizer.load_state_dict = load_state_dict

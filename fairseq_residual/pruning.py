"""Loading a pruned model: fairseq's LayerDrop pruning (``--encoder-layers-to-keep`` /
``--decoder-layers-to-keep``, Fan et al. 2019, arXiv 1909.11556) done so that a pruned model also trains,
saves, resumes and translates.

fairseq prunes at load time (``fairseq/checkpoint_utils.py``, ``prune_state_dict``): the state dict of the
trained N-layer stack is renumbered to the kept layers. Three things go wrong there for a model that was
*trained* pruned (``fairseq-train --encoder-layers-to-keep 1``), and one for any pruned load:

* its checkpoint already holds only the kept layers, and pruning them again drops them;
* a stack without a list loses every layer (a key whose layer number is in no pruning pass is dropped);
* ``prune_state_dict`` then sets the model configuration's ``*_layers_to_keep`` to None in place: when
  training resumes, that is the trainer's own configuration, saved with the next checkpoint, which then
  describes a full model around pruned weights.

:func:`prune_to_kept_layers` is used instead of it: per stack with a list, a state dict of the trained N
layers is renumbered to the kept ones, a state dict that already holds exactly the kept layers is taken as
it is, and a stack without a list is left alone; the configuration is not touched.
"""
import re
from collections import OrderedDict
from typing import Dict, List

from torch import Tensor

from .user_errors import SettingError, advice_for_this_tool

STACKS = ("encoder", "decoder")


def held_layers(state_dict: Dict[str, Tensor], prefix: str) -> List[int]:
    """The layer indices a state dict holds under ``{prefix}layers.<i>.`` (``prefix`` e.g. ``"encoder."``),
    sorted."""
    pattern = re.compile(rf"^{re.escape(prefix)}layers\.(\d+)\.")
    return sorted({int(m.group(1)) for m in map(pattern.match, state_dict) if m})


def prune_to_kept_layers(state_dict: Dict[str, Tensor], options) -> Dict[str, Tensor]:
    """The state dict renumbered to the layers the model holds (``options``: the model's
    :class:`~fairseq_residual.schemes.SchemeOptions`; ``options.kept(stack)`` are the kept layers' indices in
    the trained ``options.depth(stack)``-layer model).

    Per stack: a state dict holding the trained model's ``depth`` layers keeps the kept ones, renumbered
    ``0..len(kept)-1`` in the kept order; one holding ``len(kept)`` layers (a pruned model's own checkpoint)
    is taken as it is; keys outside ``{stack}.layers.`` are never dropped.

    Raises:
        ValueError: a stack of the state dict holds neither the trained model's layers nor the kept ones
            (a list that does not match how the checkpoint was trained, or a depth changed at load), naming
            both counts and the fix.
    """
    renames = {}
    for stack in STACKS:
        depth, kept = options.depth(stack), tuple(options.kept(stack))
        held = held_layers(state_dict, f"{stack}.")
        if not held or held == list(range(len(kept))):  # as the model holds them (pruned or whole)
            continue
        if held != list(range(depth)) and len(kept) == depth:  # every layer kept: the depth itself differs
            fix = advice_for_this_tool(
                f"a --model-overrides of {stack}_layers or {stack}_layers_to_keep changed the model the checkpoint "
                f"was trained as: drop it (a trained model's depth cannot change at load; a model trained pruned "
                f"loads with the {stack}_layers_to_keep it was trained with)",
                f"train with --{stack}-layers {len(held)}, as the checkpoint was, or start from another checkpoint "
                f"(--restore-file, --finetune-from-model)")
            raise SettingError(
                f"this model is built with {depth} {stack} layers ({stack}_layers {depth}, every layer kept), but "
                f"the checkpoint holds {len(held)} {stack} layers: {fix}"
            )
        if held != list(range(depth)):
            raise SettingError(
                f"this model holds {len(kept)} of the trained model's {depth} {stack} layers "
                f"({stack}_layers_to_keep {','.join(map(str, kept)) if len(kept) < depth else 'not set'}), but the "
                f"checkpoint holds {len(held)} {stack} layers: it was trained pruned, so load it with the "
                f"{stack}_layers_to_keep it was trained with (drop the --model-overrides of it), or prune the "
                f"checkpoint of the whole {depth}-layer model"
            )
        renames[stack] = {old: new for new, old in enumerate(kept)}
    if not renames:
        return state_dict
    pattern = re.compile(r"^(encoder|decoder)\.layers\.(\d+)(\..*)$")
    pruned = OrderedDict()
    for key, value in state_dict.items():
        m = pattern.match(key)
        if m and m.group(1) in renames:
            new = renames[m.group(1)].get(int(m.group(2)))
            if new is None:  # a layer that is not kept
                continue
            key = f"{m.group(1)}.layers.{new}{m.group(3)}"
        pruned[key] = value
    return pruned

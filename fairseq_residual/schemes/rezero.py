"""ReZero (Bachlechner et al. 2021, "ReZero is All You Need: Fast Convergence at Large Depth", arXiv
2003.04887, UAI): no LayerNorm anywhere, every sub-layer's branch scaled by one trainable scalar per
layer that starts at zero,

    x = x + alpha_l * drop(F(x))        alpha_l shared by the sub-layers of layer l, alpha_l = 0 at init

and the stack output ``x`` (no final LayerNorm), as majumderb/rezero computes it
(``rezero/transformer/rztx.py``: ``resweight`` per layer, used by self-attention and the FFN of an encoder
layer and by self-attention, cross-attention and the FFN of a decoder layer; its README leaves PyTorch's
stack ``norm=None``). The reference applies the dropout after (encoder) or before (decoder) the scalar:
the same computation. At initialisation every layer is the identity, so only the alphas get gradients on
the first update.

Encoder-decoder: as the reference (cross-attention shares its layer's alpha). Parameters: the layer's
alpha is ``layers.i.self_attn_residual.resweight`` (the reference's name), held by the first sub-layer's
residual and handed to the layer's other sub-layers through the protocol's context (key ``rezero.alpha``;
the state holds only the stream).
"""
from typing import Dict, List, Tuple

import torch
from torch import Tensor, nn

from ..residual import NORM_NONE, SublayerResidual, with_main
from .base import ResidualScheme


class ReZeroResidual(SublayerResidual):
    """``x = x + alpha_l * h``, ``h = drop(F(x))``, no LayerNorm; state ``[x]`` (T x B x C), alpha_l (a scalar)
    read from the context (``ctx["rezero.alpha"]``), put there by the layer's first sub-layer
    (:class:`ReZeroFirstResidual`).

    Args:
        site: the sub-layer.
    """

    NORM = NORM_NONE

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        return with_main(state, state[0] + ctx["rezero.alpha"] * out)


class ReZeroFirstResidual(ReZeroResidual):
    """The layer's first sub-layer (self-attention): holds the layer's ``resweight`` (alpha_l, init 0) and
    hands it to the layer's other sub-layers through the context."""

    def __init__(self, site):
        super().__init__(site)
        self.resweight = nn.Parameter(torch.zeros(()))

    def prepare(self, state: List[Tensor], ctx: Dict[str, Tensor]) -> Tuple[Tensor, List[Tensor]]:
        ctx["rezero.alpha"] = self.resweight
        return state[0], state


class ReZero(ResidualScheme):
    name = "rezero"
    label = "ReZero"
    scheme_id = 11
    builds_on = "post_ln"
    color = "black"
    update = ("x = x + alpha_l * drop(F(x)), one alpha per layer shared by its sub-layers (cross-attention "
              "included, as the reference), no LayerNorm anywhere")
    output = "x"
    init = "`alpha_l = 0`"
    source = "Bachlechner et al. 2021, arXiv 2003.04887, eq. 3"
    reference = "majumderb/rezero `rezero/transformer/rztx.py`"
    recipe = ("the reference ships no training recipe (the paper trains 12-layer enwik8 models). `alpha = 0` makes "
              "every layer the identity at the start, so the first update moves only the alphas. Users report "
              "divergence on large data (advice: Adafactor or a separate learning rate for alpha) and alphas "
              "drifting to about 0 in deep stacks (majumderb/rezero issue 16).")
    fp16_advice = ("fp16 as is at the measured depths (fixed-scale stream); in `--memory-efficient-fp16` a branch "
                   "weight's first gradients carry alpha (0 at the start) and may underflow")
    final_norm_eps = None
    has_layer_norm = False

    def sublayer_residual(self, cfg, site):
        return ReZeroFirstResidual(site) if site.kind == "self_attn" else ReZeroResidual(site)


SCHEME = ReZero()

"""SiameseNorm (Li et al. 2026, arXiv 2602.08064, ICML 2026): two residual streams through shared sub-layers, a
Post-LN-like stream x and a Pre-LN-like stream y, as Qwen-Applications/SiameseNorm computes its ``post_pre``
form (``deit-model-siamesenorm.py``, ``Block.forward`` and ``forward_features``). Per sub-layer of layer l
(0-based), with the same branch output o feeding both streams:

    u = LN_post(x)
    o = drop(F(LN_in(u + LN_pre(y))))
    x = u + o / c_l,    y = y + o,      c_l = sqrt(S (l + 1))

both streams starting at the embedding output (after dropout), and the stack output
``LN_final(LN_a(x) + LN_b(y))``. S is the number of sub-layers per layer: the reference's
``sqrt(2 (l + 1))`` is the square root of the number of updates accumulated in y, written for S = 2; the
decoder's layers have three sub-layers (S = 3).

The project's reading of the encoder-decoder case (the reference is a ViT / DiT / decoder-only LM): per
stack; cross-attention reads both streams like self-attention (its keys and values are the encoder
output) and counts as one of the decoder's S = 3 sub-layers.

Parameters: ``LN_in`` is the sub-layer's fairseq LayerNorm (``self_attn_layer_norm``, ...); ``LN_post`` and
``LN_pre`` are ``{kind}_residual.post_layer_norm`` / ``pre_layer_norm``; ``LN_a`` / ``LN_b`` are
``{encoder,decoder}.residual.x_layer_norm`` / ``y_layer_norm`` (the reference names them the other way
round, ``pre_norm`` on x and ``post_norm`` on y) and ``LN_final`` the stack's ``layer_norm``; all affine,
gamma 1, beta 0. The view (``inner_states``) is x, the extra stream y.
"""
import math
from typing import Dict, List, Tuple

import torch
from torch import Tensor

from fairseq.modules import LayerNorm

from ..residual import NORM_INPUT, StackResidual, SublayerResidual
from .base import ResidualScheme


class SiameseResidual(SublayerResidual):
    """One sub-layer of SiameseNorm over the state ``[x, y]``.

    Args:
        site: the sub-layer (its layer index l and the layer's sub-layer count S give c_l).
        export: TorchScript-exportable LayerNorms.
    """

    NORM = NORM_INPUT

    def __init__(self, site, export: bool = False):
        super().__init__(site)
        self.post_layer_norm = LayerNorm(site.embed_dim, export=export)
        self.pre_layer_norm = LayerNorm(site.embed_dim, export=export)
        self.inv_c = 1.0 / math.sqrt(site.per_layer * (site.layer + 1))

    def prepare(self, state: List[Tensor], ctx: Dict[str, Tensor]) -> Tuple[Tensor, List[Tensor]]:
        u = self.post_layer_norm(state[0])
        return u + self.pre_layer_norm(state[1]), [u, state[1]]

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        return [state[0] + out * self.inv_c, state[1] + out]

    def extra_repr(self):
        return f"c_l={1 / self.inv_c:.4f}"


class SiameseStack(StackResidual):
    """x and y start at the embedding output; the stack output is ``LN_final(LN_a(x) + LN_b(y))``."""

    def __init__(self, stack: str, num_layers: int, embed_dim: int, export: bool = False):
        super().__init__(stack, num_layers, embed_dim)
        self.x_layer_norm = LayerNorm(embed_dim, export=export)
        self.y_layer_norm = LayerNorm(embed_dim, export=export)

    def start(self, x: Tensor) -> List[Tensor]:
        return [x, x]

    def final_input(self, state: List[Tensor]) -> Tensor:
        return self.x_layer_norm(state[0]) + self.y_layer_norm(state[1])

    @torch.jit.unused
    def streams(self, state: List[Tensor]) -> Dict[str, Tensor]:
        return {"y": state[1]}


class SiameseNorm(ResidualScheme):
    name = "siamese_norm"
    label = "SiameseNorm"
    scheme_id = 15
    color = "magenta"
    update = "u = LN_post(x); o = drop(F(LN_in(u + LN_pre(y)))); x = u + o/c_l; y = y + o; c_l = sqrt(S(l+1))"
    output = "LN_final(LN_a(x) + LN_b(y))"
    final_norm_needed = "its stack output is LN_final(LN_a(x) + LN_b(y)) (as the authors' code computes it)"
    source = "Li et al. 2026, arXiv 2602.08064"
    reference = "Qwen-Applications/SiameseNorm `deit-model-siamesenorm.py` (`post_pre` form)"
    reading = ("per stack; cross-attention reads both streams like self-attention; `c_l = sqrt(S (l + 1))` counts "
               "the updates that accumulate in y: S = 2 in the encoder (the reference's `sqrt(2 (l + 1))`), S = 3 in "
               "the decoder")
    recipe = ("the reference's OLMo-1B configs are named for lr 2e-3 (the configs themselves are not in its "
              "repository); DeiT / DiT: their official recipes unchanged.")
    fp16_advice = "as Pre-LN, for its stream y: no scale; measure a checkpoint"

    def sublayer_residual(self, cfg, site):
        return SiameseResidual(site, export=cfg.export)

    def stack_residual(self, cfg, stack, num_layers, embed_dim):
        return SiameseStack(stack, num_layers, embed_dim, export=cfg.export)


SCHEME = SiameseNorm()

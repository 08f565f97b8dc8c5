"""B2T connection (Takase et al., Findings of ACL 2023, arXiv 2206.00330, section 3 and figure 3):
Post-LN plus one term per layer, the layer's input added before the layer's **last** LayerNorm.

For an encoder layer with input ``x`` (before any LayerNorm of the layer):

    h = LN_sa(x + drop(SA(x)))
    y = LN_ffn(h + drop(FFN(h)) + x)

and for a decoder layer:

    h1 = LN_sa(x + drop(SA(x)))
    h2 = LN_ca(h1 + drop(CA(h1, enc)))
    y  = LN_ffn(h2 + drop(FFN(h2)) + x)

All inner LayerNorms are kept, no stack LayerNorm, as takase/b2t_connection computes it
(``fairseq/modules/transformer_layer.py``, the ``--residual-bottom-to-top`` branch of the encoder and
decoder layers). The extra term carries the gradient of the output straight to the layer input past
every inner LayerNorm (the paper's point: Post-LN's last-layer-dominated gradients vanish in the lower
layers without it).

Initialisation follows the reference's HEAD (commit 4d80167 "Modify initialization", 2023-05-18,
``rescaling_init`` in the same file): after fairseq's default initialisation every layer parameter whose
name contains ``weight`` and not ``layer_norm`` (q/k/v/out projections of self- and cross-attention, fc1,
fc2) is multiplied by ``L^(-1/2)``, with L = N for encoder layers and L = M for decoder layers; biases,
LayerNorms and embeddings keep fairseq's. The code of June 2022 and the ResiDual preprint (April 2023)
predate that change and used fairseq's initialisation unscaled.

Over the residual protocol: the first sub-layer's residual keeps the layer input in the state
(``[x, x_in]``), the last one adds it before its LayerNorm and drops it (``[x + h + x_in]``); the
sub-layers and their parameter names are fairseq's. The extra term is the layer input at the same
position, so incremental decoding needs no cached state.
"""
import math
from typing import Dict, List, Tuple

from torch import Tensor

from ..residual import NORM_OUTPUT, SublayerResidual, with_main
from .base import ResidualScheme


class B2TResidual(SublayerResidual):
    """Post-LN's ``x = LN(x + h)``; the layer's first sub-layer keeps the layer input ``x_in`` in the state
    and the last adds it before its LayerNorm, ``y = LN(x + h + x_in)``.

    Args:
        site: the sub-layer (first of its layer: self-attention; last: the FFN).
    """

    NORM = NORM_OUTPUT

    def __init__(self, site):
        super().__init__(site)
        self.first = site.kind == "self_attn"
        self.last = site.kind == "ffn"

    def prepare(self, state: List[Tensor], ctx: Dict[str, Tensor]) -> Tuple[Tensor, List[Tensor]]:
        if self.first:
            return state[0], [state[0], state[0]]  # [x, x_in]
        return state[0], state

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        if self.last:
            return [state[0] + out + state[1]]
        return with_main(state, state[0] + out)


def b2t_init_scale(layers: int) -> float:
    """The reference's ``rescaling_init`` factor ``L^(-1/2)`` for a stack of ``layers`` layers."""
    return 1.0 / math.sqrt(layers)


class B2T(ResidualScheme):
    name = "b2t"
    label = "B2T"
    scheme_id = 7
    builds_on = "post_ln"
    color = "tab:olive"
    update = "Post-LN, and the layer input x_in added before each layer's last LN: y = LN(h + drop(FFN(h)) + x_in)"
    output = "x"
    init = "every layer weight (not LayerNorms, not biases) x `L^(-1/2)`, L = N or M"
    source = "Takase et al. 2023, arXiv 2206.00330, sec. 3, fig. 3"
    reference = ("takase/b2t_connection `fairseq/modules/transformer_layer.py` (HEAD: its `rescaling_init` of "
                 "2023-05-18; the code before it used fairseq's initialisation unscaled)")
    recipe = ("WMT En-De recipe of the reference: lr 1e-3, warm-up 4000, clip-norm 0.1, dropout 0.3 (6L) / 0.5 "
              "(18L); it has no IWSLT recipe.")
    fp16_advice = "fp16 as is: renormalised after every sub-layer"
    final_norm_eps = None

    def sublayer_residual(self, cfg, site):
        return B2TResidual(site)

    def initialize(self, model, options):
        """Multiply every layer weight but the LayerNorms' by ``L^(-1/2)`` (encoder: L = N, decoder: M)."""
        for stack in ("encoder", "decoder"):
            layers = getattr(model, stack).layers
            scale = b2t_init_scale(len(layers))
            for name, param in layers.named_parameters():
                if "weight" in name and "layer_norm" not in name:
                    param.data.mul_(scale)


SCHEME = B2T()

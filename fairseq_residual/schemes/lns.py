"""LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth in Large Language Models", arXiv 2502.05795,
NeurIPS 2025): Pre-LN with every sub-layer's normalised input scaled down by the square root of its
layer's depth,

    x = x + drop(F(LN(x) / sqrt(l)))        l = 1-based index of the layer in its stack

the same factor for every sub-layer of a layer, and an unscaled final LayerNorm ``LN_final(x)``. No
parameters. From the formula (paper eq. 3; ``1/sqrt(layer_index + 1)``): the reference repository
lmsdss/LayerNorm-Scaling builds identity blocks at its HEAD (its ``NORM_TYPE`` is lower-cased and then
compared with ``'LNS'``, so no branch matches since commit 33c3899, 2025-04-22), so it cannot be run to
check numbers; its first upload (5d4dd11) computed the formula above.

Encoder-decoder (the project's reading): l counts per stack; cross-attention is scaled like
self-attention. The authors advise against combining it with a 1/sqrt(2L)-scaled output-projection
initialisation; fairseq's initialisation has none.
"""
import math

from ..residual import SublayerResidual
from .base import ResidualScheme


class LNSResidual(SublayerResidual):
    """Pre-LN's ``x = x + drop(F(LN(x) * input_scale))`` with ``input_scale = 1/sqrt(l)``, l = layer + 1."""

    def __init__(self, site):
        super().__init__(site)
        self.input_scale = 1.0 / math.sqrt(site.layer + 1)


class LNS(ResidualScheme):
    name = "lns"
    label = "LayerNorm Scaling"
    scheme_id = 10
    color = "gold"
    update = "x = x + drop(F(LN(x) / sqrt(l))), l = 1-based layer index in its stack"
    output = "LN_final(x)"
    source = "LayerNorm Scaling, Sun et al. 2025, arXiv 2502.05795, eq. 3"
    reference = ("from the formula: lmsdss/LayerNorm-Scaling builds identity layers at HEAD (`NORM_TYPE` is "
                 "lower-cased, then compared with `'LNS'`, since commit 33c3899); its first upload computed the formula")
    reading = "l counts per stack; cross-attention is scaled like self-attention"
    recipe = ("LLaMA on C4: Adam, no weight decay, bf16, no clipping, 10% warm-up, lr 1e-3 (130M, 250M) to 5e-4 "
              "(350M, 1B); plain normal initialisation (the authors advise against a 1/sqrt(2L)-scaled output init).")
    fp16_advice = "its stream grows with depth and training and has no scale: measure a checkpoint, and train in bf16 where the peak nears a tenth of 65,504"

    def sublayer_residual(self, cfg, site):
        return LNSResidual(site)


SCHEME = LNS()

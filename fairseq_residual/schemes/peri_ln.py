"""Peri-LN (Kim et al. 2025, "Peri-LN: Revisiting Normalization Layer in the Transformer Architecture",
arXiv 2502.02732, ICML 2025): a LayerNorm on both sides of every sub-layer,

    x = x + LN_out(drop(F(LN_in(x))))        per sub-layer F (self-attention, cross-attention, FFN)

and a final LayerNorm at the end of each stack, ``LN_final(x)``. The output LayerNorm sees the
dropped-out branch, as the released code of its predecessor Sandwich-LN computes it (Ding et al. 2021,
CogView, arXiv 2105.13290; THUDM/CogView ``mpu/sparse_transformer.py``, ``GPT2ParallelTransformerLayer``:
the dropout is inside the attention / MLP module, then ``third_layernorm`` / ``fourth_layernorm``);
Peri-LN has no official code. fairseq's NormFormer ``--scale-attn`` puts an LN after self-attention but
before the dropout, and only in the decoder: not this scheme.

Encoder-decoder (the project's reading; the authors define a decoder-only LM): every sub-layer of both
stacks, cross-attention included, gets both LayerNorms; both stacks keep their final LayerNorm.

Parameters: ``LN_in`` is the sub-layer's fairseq LayerNorm (``self_attn_layer_norm``,
``encoder_attn_layer_norm``, ``final_layer_norm``); ``LN_out`` is ``{kind}_residual.out_layer_norm``,
affine, gamma 1 and beta 0 (Peri-LN: a frozen output gamma hurts, so it is learnable); every other weight
keeps fairseq's initialisation (CogView's 0.02 / sqrt(2L) output init is not part of the scheme).
"""
from typing import Dict, List

from fairseq.modules import LayerNorm
from torch import Tensor

from ..residual import NORM_INPUT, SublayerResidual, with_main
from .base import ResidualScheme


class PeriLNResidual(SublayerResidual):
    """``x = x + LN_out(h)``, ``h = drop(F(LN_in(x)))``.

    Args:
        site: the sub-layer; ``export`` builds a TorchScript-exportable LayerNorm.
    """

    NORM = NORM_INPUT

    def __init__(self, site, export: bool = False):
        super().__init__(site)
        self.out_layer_norm = LayerNorm(site.embed_dim, export=export)

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        return with_main(state, state[0] + self.out_layer_norm(out))


class PeriLN(ResidualScheme):
    name = "peri_ln"
    label = "Peri-LN"
    scheme_id = 8
    color = "tab:pink"
    update = "x = x + LN_out(drop(F(LN_in(x))))"
    output = "LN_final(x)"
    init = "one affine `LN_out` per sub-layer (gamma 1, beta 0)"
    source = "Kim et al. 2025, arXiv 2502.02732; Sandwich-LN, Ding et al. 2021, arXiv 2105.13290"
    reference = ("THUDM/CogView `mpu/sparse_transformer.py` (Sandwich-LN: the output LN after the dropout; Peri-LN has "
                 "no public code; fairseq's NormFormer `--scale-attn` puts it before the dropout, decoder only: not "
                 "this scheme)")
    reading = "both LayerNorms around every sub-layer of both stacks, cross-attention included"
    recipe = ("decoder-only LMs (400M-3.2B, Megatron-LM), learning rate swept: Pre-LN and Peri-LN both best at "
              "2e-3; no translation recipe.")
    fp16_advice = "its stream grows with depth and training and has no scale: measure a checkpoint, and train in bf16 where the peak nears a tenth of 65,504"

    def sublayer_residual(self, cfg, site):
        return PeriLNResidual(site, export=cfg.export)


SCHEME = PeriLN()

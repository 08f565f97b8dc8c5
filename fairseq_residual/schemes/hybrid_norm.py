"""HybridNorm (Zhuo et al. 2025, "HybridNorm: Towards Stable and Efficient Transformer Training via Hybrid
Normalization", arXiv 2503.04598): attention without an input LayerNorm but with per-head LayerNorms on
its queries, keys and values (QKV-Norm), and a Post-LN-style LayerNorm between attention and FFN whose
output also starts the FFN's residual:

    encoder:  y = x + drop(SA(x));                      z = LN(y);  x = z + drop(FFN(z))
    decoder:  y = x + drop(SA(x));  y = y + drop(CA(y)); z = LN(y);  x = z + drop(FFN(z))
    output:   LN_final(x)

where SA and CA normalise q, k and v per head right after their projections (LayerNorm over head_dim,
affine, shared across heads), as BryceZhuo/HybridNorm computes it (``dense_model/olmo/model.py``,
``OLMoSequentialBlock.forward`` and the q/k/v norms of its attention). The paper's HybridNorm* variant
(the first layer Pre-Norm) is not offered.

Encoder-decoder (the project's reading): cross-attention normalises q (from the decoder stream) and k, v
(from the encoder output) with its own per-head norms, and sits between self-attention and the
LayerNorm that precedes the FFN.

Parameters: the per-head norms are ``{self_attn,encoder_attn}.{q,k,v}_proj.norm`` (the projection's
``nn.Linear`` parameters keep fairseq's names and initialisation); ``LN`` is the layer's
``final_layer_norm``; the attention sub-layers have no LayerNorm of their own. The reference's
Megatron-style small initialisation (std sqrt(2/(5d)), output projections / sqrt(2L)) is not part of the
scheme: fairseq's initialisation.

fairseq's ``MultiheadAttention`` computes the projections inside ``F.multi_head_attention_forward`` in its
fast path; the HybridNorm attention takes fairseq's explicit path (``skip_embed_dim_check``), where each
projection module is called, so that the norms apply.
"""
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.modules import LayerNorm

from ..layers import ResidualDecoderLayer, ResidualEncoderLayer
from ..residual import NORM_NONE, NORM_STREAM, SublayerResidual
from .base import ResidualScheme


class HeadNormLinear(nn.Linear):
    """A q, k or v projection followed by a LayerNorm over each head's ``head_dim`` features (QKV-Norm).

    Input ... x C_in, output ... x C (heads x head_dim), normalised per head. The ``nn.Linear`` part keeps
    fairseq's parameter names (``weight``, ``bias``); the norm is ``norm``.
    """

    def __init__(self, linear: nn.Linear, num_heads: int, export: bool = False):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None)
        self.weight, self.bias = linear.weight, linear.bias  # fairseq's initialisation, no new draw
        self.num_heads = num_heads
        self.head_dim = linear.out_features // num_heads
        self.norm = LayerNorm(self.head_dim, export=export)

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight, self.bias)
        shape = y.shape
        return self.norm(y.view(shape[:-1] + (self.num_heads, self.head_dim))).view(shape)


def with_head_norms(attn, export: bool = False):
    """``attn`` (fairseq's ``MultiheadAttention``) with per-head norms on q, k, v, on fairseq's explicit path.

    fairseq's quant-noise (``--quant-noise-pq``, ``fairseq/modules/quant_noise.py``) is a forward pre-hook on
    each projection that drops blocks of its ``weight`` in training; the hook moves to the new projection,
    which computes with the same ``weight``.

    Raises:
        ValueError: a projection that is not fairseq's ``nn.Linear`` (another wrapper, e.g. weight
            normalisation), which the norms cannot wrap.
    """
    for name in ("q_proj", "k_proj", "v_proj"):
        proj = getattr(attn, name)
        if type(proj) is not nn.Linear or getattr(proj, "weight_orig", None) is not None:
            raise ValueError(f"--residual-scheme hybrid_norm needs fairseq's plain nn.Linear as {name}, got "
                             f"{type(proj).__name__}: drop the option that wraps the attention's projections")
        head_norm = HeadNormLinear(proj, attn.num_heads, export=export)
        head_norm._forward_pre_hooks.update(proj._forward_pre_hooks)  # quant-noise, as fairseq applied it
        setattr(attn, name, head_norm)
    attn._set_skip_embed_dim_check()  # fairseq's explicit path calls q_proj / k_proj / v_proj
    return attn


class HybridNormEncoderLayer(ResidualEncoderLayer):
    """The protocol's encoder layer with QKV-Norm self-attention."""

    def build_self_attention(self, embed_dim, cfg):
        return with_head_norms(super().build_self_attention(embed_dim, cfg), cfg.export)


class HybridNormDecoderLayer(ResidualDecoderLayer):
    """The protocol's decoder layer with QKV-Norm self- and cross-attention."""

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return with_head_norms(super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn),
                               cfg.export)

    def build_encoder_attention(self, embed_dim, cfg):
        return with_head_norms(super().build_encoder_attention(embed_dim, cfg), cfg.export)


class AttentionResidual(SublayerResidual):
    """``y = x + drop(Attn(x))``: no LayerNorm (the attention normalises q, k, v itself)."""

    NORM = NORM_NONE


class FFNResidual(SublayerResidual):
    """``z = LN(y); x = z + drop(FFN(z))``: the LayerNorm on the stream before the FFN reads it."""

    NORM = NORM_STREAM


class HybridNorm(ResidualScheme):
    name = "hybrid_norm"
    label = "HybridNorm"
    scheme_id = 12
    color = "teal"
    update = ("attention: y = x + drop(Attn(x)), q/k/v normalised per head; FFN: z = LN(y), "
              "x = z + drop(FFN(z))")
    output = "LN_final(x)"
    init = "q/k/v LayerNorms of size head_dim (gamma 1, beta 0)"
    source = "Zhuo et al. 2025, arXiv 2503.04598, sec. 3"
    reference = "BryceZhuo/HybridNorm `dense_model/olmo/model.py` (`OLMoSequentialBlock`)"
    reading = ("cross-attention normalises q (from the decoder) and k, v (from the encoder output) per head, and "
               "sits between self-attention and the LayerNorm before the FFN")
    recipe = ("OLMo 1.2B: AdamW (0.9, 0.95), lr 3e-4, weight decay 0.1, cosine schedule, clip 1.0, bf16, with a "
              "Megatron-style small initialisation (std sqrt(2/(5d)), output projections / sqrt(2L)) that is not part "
              "of the scheme here; a reimplementation without that init and warm-up did not converge "
              "(BryceZhuo/HybridNorm issue 2). The paper's HybridNorm* (first layer Pre-Norm) is not offered.")
    fp16_advice = "fp16 as is: renormalised after every sub-layer"

    def sublayer_residual(self, cfg, site):
        return FFNResidual(site) if site.kind == "ffn" else AttentionResidual(site)

    def encoder_layer(self, cfg, residuals):
        return HybridNormEncoderLayer(cfg, residuals)

    def decoder_layer(self, cfg, residuals, no_encoder_attn):
        return HybridNormDecoderLayer(cfg, residuals, no_encoder_attn=no_encoder_attn, scheme=self.name)


SCHEME = HybridNorm()

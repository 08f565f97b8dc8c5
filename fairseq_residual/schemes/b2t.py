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

The layers keep fairseq's sub-modules and parameter names; only ``forward`` is written here (fairseq's
layer has no hook for a term that skips a LayerNorm). Incremental decoding is fairseq's: the extra term
is the layer input at the same position, so it needs no cached state.
"""
import math
from typing import Dict, List, Optional

from torch import Tensor

from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from ..layers import DecoderSublayers, EncoderSublayers, additive_attn_mask, refuse_decoder_extras
from .base import ResidualScheme


class B2TEncoderLayer(EncoderSublayers, TransformerEncoderLayerBase):
    """Post-LN encoder layer with the bottom-to-top connection (``y = LN_ffn(h + drop(FFN(h)) + x)``).

    Args:
        cfg: fairseq ``TransformerConfig`` (Post-LN: ``cfg.encoder.normalize_before`` False).

    Source: Takase et al. 2023, figure 3 (b); takase/b2t_connection, fairseq/modules/transformer_layer.py.
    """

    def __init__(self, cfg):
        super().__init__(cfg, return_fc=False)

    def forward(self, x: Tensor, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        """fairseq's encoder-layer interface.

        Args:
            x: layer input, T x B x C.
            encoder_padding_mask: B x T, True at padding, or None.
            attn_mask: T x T, 1 where attention is forbidden, or None.

        Returns:
            the layer output, T x B x C.
        """
        bottom = x
        h = self.self_attn_sublayer(x, encoder_padding_mask, additive_attn_mask(attn_mask, x))
        x = self.self_attn_layer_norm(self.residual_connection(h, x))
        h = self.ffn_sublayer(x)
        return self.final_layer_norm(self.residual_connection(h, x) + bottom)


class B2TDecoderLayer(DecoderSublayers, TransformerDecoderLayerBase):
    """Post-LN decoder layer with the bottom-to-top connection before its last LayerNorm.

    Args:
        cfg: fairseq ``TransformerConfig``; NormFormer options and ``--cross-self-attention`` are refused.
        no_encoder_attn: build no encoder-decoder attention.

    Source: Takase et al. 2023, figure 3 (b); takase/b2t_connection, fairseq/modules/transformer_layer.py.
    """

    def __init__(self, cfg, no_encoder_attn=False):
        refuse_decoder_extras(cfg, "b2t")
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)

    def forward(
        self,
        x: Tensor,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        prev_self_attn_state: Optional[List[Tensor]] = None,
        prev_attn_state: Optional[List[Tensor]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        """fairseq's decoder-layer interface (``prev_*_state`` are refused: fairseq's own decoder never
        passes them).

        Args:
            x: layer input, T x B x C (T = 1 in incremental decoding).
            encoder_out: S x B x C, or None.
            encoder_padding_mask: B x S, True at padding, or None.
            incremental_state: fairseq's attention key/value cache, or None.
            self_attn_mask: T x T additive future mask, or None.
            self_attn_padding_mask: B x T, True at padding, or None.
            need_attn, need_head_weights: return the cross-attention weights (as fairseq).

        Returns:
            ``(x, attn, None)``: T x B x C, the cross-attention weights or None, and no ONNX state.
        """
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise ValueError("prev_self_attn_state / prev_attn_state are not supported with --residual-scheme b2t")
        if need_head_weights:
            need_attn = True
        bottom = x
        h = self.self_attn_sublayer(x, incremental_state, self_attn_mask, self_attn_padding_mask)
        x = self.self_attn_layer_norm(self.residual_connection(h, x))
        attn: Optional[Tensor] = None
        if self.encoder_attn is not None and encoder_out is not None:
            h, attn = self.cross_attn_sublayer(
                x, encoder_out, encoder_padding_mask, incremental_state, need_attn, need_head_weights
            )
            x = self.encoder_attn_layer_norm(self.residual_connection(h, x))
        h = self.ffn_sublayer(x)
        return self.final_layer_norm(self.residual_connection(h, x) + bottom), attn, None


def b2t_init_scale(layers: int) -> float:
    """The reference's ``rescaling_init`` factor ``L^(-1/2)`` for a stack of ``layers`` layers."""
    return 1.0 / math.sqrt(layers)


class B2T(ResidualScheme):
    name = "b2t"
    label = "B2T"
    scheme_id = 7
    color = "tab:olive"
    update = "Post-LN; last LN of each layer: y = LN(h + drop(FFN(h)) + x_in); init of layer weights x L^-1/2"
    output = "x"
    source = "Takase et al. 2023, arXiv 2206.00330, section 3, figure 3"
    reference = "takase/b2t_connection, fairseq/modules/transformer_layer.py"

    def encoder_layer(self, cfg):
        return B2TEncoderLayer(cfg)

    def decoder_layer(self, cfg, no_encoder_attn):
        return B2TDecoderLayer(cfg, no_encoder_attn)

    def initialize(self, model, args):
        """Multiply every layer weight but the LayerNorms' by ``L^(-1/2)`` (encoder: L = N, decoder: M)."""
        for stack in ("encoder", "decoder"):
            layers = getattr(model, stack).layers
            scale = b2t_init_scale(len(layers))
            for name, param in layers.named_parameters():
                if "weight" in name and "layer_norm" not in name:
                    param.data.mul_(scale)


SCHEME = B2T()

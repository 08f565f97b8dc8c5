"""ResiDual (Pre-Post-LN) encoder and decoder layers.

Each layer carries two streams (Xie et al. 2023, arXiv 2304.14802, section 3.2, eq. 4-5):

* ``x_a``, the Post-LN stream: ``x_a = LN(x_a + h)`` after every sub-layer, and
* ``x_d``, the dual (Pre-LN-like) stream: ``x_d = x_d + c * h``, never normalised inside the stack,

where ``h = dropout(F(x_a))`` is the *same* dropped-out output of the sub-layer ``F`` (self-attention,
encoder-decoder attention or FFN). ``x_d`` is therefore updated once per sub-layer: twice per encoder
layer and three times per decoder layer, as in the authors' code. The stack output
``alpha * x_a + LN_final(x_d)`` is formed by the encoder/decoder (``encoder_decoder.py``).

The layers subclass fairseq's :class:`TransformerEncoderLayerBase` / :class:`TransformerDecoderLayerBase`
and reuse their sub-modules and parameter names (``self_attn``, ``self_attn_layer_norm``,
``encoder_attn``, ``encoder_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``), so FSDP wrapping,
activation checkpointing, quant-noise and incremental decoding keep working. ``x_d`` at position t
depends only on position t's own sub-layer outputs, so incremental decoding needs no extra cached
state for it: the attention key/value caches (reordered by fairseq's ``reorder_incremental_state``)
are all that carries across time steps.
"""
from typing import Dict, Optional

import torch
from torch import Tensor

from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)


def add_to_dual_stream(x_d: Tensor, h: Tensor, scale: float) -> Tensor:
    """Dual-stream update ``x_d + c * h`` (one fused op; paper eq. 5).

    Args:
        x_d: dual stream, T x B x C.
        h: dropped-out sub-layer output, T x B x C.
        scale: the stack's dual-stream scale c, 0 < c <= 1.
    """
    return torch.add(x_d, h, alpha=scale) if scale != 1.0 else x_d + h


def _refuse_decoder_extras(cfg):
    """Refuse the decoder options that change the sub-layers (NormFormer, cross-self-attention).

    ResiDual decoder layers implement the plain sub-layers only; fairseq's NormFormer options
    act on the decoder alone.

    Raises:
        ValueError: naming the unsupported option and the fix.
    """
    for key in ("cross_self_attention", "scale_attn", "scale_heads", "scale_fc", "scale_resids"):
        if getattr(cfg, key, False):
            flag = "--" + key.replace("_", "-")
            raise ValueError(
                f"{flag} is not supported with --residual-scheme resi_dual; "
                f"drop {flag} or use --residual-scheme post_ln / pre_ln"
            )


class ResiDualEncoderLayer(TransformerEncoderLayerBase):
    """Encoder layer of ResiDual: self-attention and FFN sub-layers, each feeding both streams.

    Args:
        cfg: fairseq ``TransformerConfig`` (``cfg.encoder.normalize_before`` must be False: the
            ``x_a`` stream is Post-LN).
        dual_scale: the encoder's dual-stream scale c.

    Mirrors :class:`fairseq.modules.TransformerEncoderLayerBase` with normalize_before=False for
    ``x_a``; the only difference is that each sub-layer's dropped-out output ``h`` is also added to
    ``x_d``.
    """

    def __init__(self, cfg, dual_scale: float = 1.0):
        if cfg.encoder.normalize_before:
            raise ValueError("ResiDual encoder layers need encoder.normalize_before=False")
        super().__init__(cfg, return_fc=False)
        self.dual_scale = float(dual_scale)

    def self_attn_sublayer(
        self, x: Tensor, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor]
    ) -> Tensor:
        """``h = dropout(SelfAttn(x))``, T x B x C."""
        x, _ = self.self_attn(
            query=x,
            key=x,
            value=x,
            key_padding_mask=encoder_padding_mask,
            need_weights=False,
            attn_mask=attn_mask,
        )
        return self.dropout_module(x)

    def ffn_sublayer(self, x: Tensor) -> Tensor:
        """``h = dropout(fc2(act_dropout(act(fc1(x)))))``, T x B x C."""
        x = self.activation_fn(self.fc1(x))
        x = self.activation_dropout_module(x)
        return self.dropout_module(self.fc2(x))

    def forward(
        self,
        x: Tensor,
        x_d: Tensor,
        encoder_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor] = None,
    ):
        """
        Args:
            x: the Post-LN stream ``x_a``, T x B x C.
            x_d: the dual stream, T x B x C.
            encoder_padding_mask: B x T, True at padding, or None.
            attn_mask: T_tgt x T_src, 1 where attention is forbidden (as in fairseq), or None.

        Returns:
            ``(x_a, x_d)``, both T x B x C.
        """
        if attn_mask is not None:  # same convention as TransformerEncoderLayerBase
            attn_mask = attn_mask.masked_fill(
                attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4
            )
        h = self.self_attn_sublayer(x, encoder_padding_mask, attn_mask)
        x = self.self_attn_layer_norm(self.residual_connection(h, x))
        x_d = add_to_dual_stream(x_d, h, self.dual_scale)

        h = self.ffn_sublayer(x)
        x = self.final_layer_norm(self.residual_connection(h, x))
        x_d = add_to_dual_stream(x_d, h, self.dual_scale)
        return x, x_d


class ResiDualDecoderLayer(TransformerDecoderLayerBase):
    """Decoder layer of ResiDual: self-attention, encoder-decoder attention and FFN sub-layers.

    Args:
        cfg: fairseq ``TransformerConfig`` (``cfg.decoder.normalize_before`` must be False).
        no_encoder_attn: build no encoder-decoder attention (decoder-only use).
        dual_scale: the decoder's dual-stream scale c.

    Mirrors :class:`fairseq.modules.TransformerDecoderLayerBase` with normalize_before=False for
    ``x_a``. NormFormer options (``--scale-attn`` etc.) and ``--cross-self-attention`` are refused.
    """

    def __init__(self, cfg, no_encoder_attn=False, dual_scale: float = 1.0):
        if cfg.decoder.normalize_before:
            raise ValueError("ResiDual decoder layers need decoder.normalize_before=False")
        _refuse_decoder_extras(cfg)
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        self.dual_scale = float(dual_scale)

    def self_attn_sublayer(
        self,
        x: Tensor,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
        self_attn_mask: Optional[Tensor],
        self_attn_padding_mask: Optional[Tensor],
    ) -> Tensor:
        """``h = dropout(SelfAttn(x))`` with the key/value cache in ``incremental_state``."""
        x, _ = self.self_attn(
            query=x,
            key=x,
            value=x,
            key_padding_mask=self_attn_padding_mask,
            incremental_state=incremental_state,
            need_weights=False,
            attn_mask=self_attn_mask,
        )
        return self.dropout_module(x)

    def cross_attn_sublayer(
        self,
        x: Tensor,
        encoder_out: Tensor,
        encoder_padding_mask: Optional[Tensor],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
        need_attn: bool,
        need_head_weights: bool,
    ):
        """``h = dropout(CrossAttn(x, encoder_out))``; returns ``(h, attention weights or None)``."""
        x, attn = self.encoder_attn(
            query=x,
            key=encoder_out,
            value=encoder_out,
            key_padding_mask=encoder_padding_mask,
            incremental_state=incremental_state,
            static_kv=True,
            need_weights=need_attn or (not self.training and self.need_attn),
            need_head_weights=need_head_weights,
        )
        return self.dropout_module(x), attn

    def ffn_sublayer(self, x: Tensor) -> Tensor:
        """``h = dropout(fc2(act_dropout(act(fc1(x)))))``, T x B x C."""
        x = self.activation_fn(self.fc1(x))
        x = self.activation_dropout_module(x)
        return self.dropout_module(self.fc2(x))

    def forward(
        self,
        x: Tensor,
        x_d: Tensor,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        """
        Args:
            x: the Post-LN stream ``x_a``, T x B x C (T = 1 during incremental decoding).
            x_d: the dual stream, T x B x C.
            encoder_out: encoder output, S x B x C, or None.
            encoder_padding_mask: B x S, True at padding, or None.
            incremental_state: fairseq's decoding cache (attention keys/values), or None.
            self_attn_mask: T x T future mask (additive, -inf above the diagonal), or None.
            self_attn_padding_mask: B x T, True at padding, or None.
            need_attn, need_head_weights: return the cross-attention weights (as fairseq).

        Returns:
            ``(x_a, x_d, attn)``: two T x B x C tensors and the cross-attention weights
            (heads x B x T x S when ``need_head_weights``, B x T x S when ``need_attn``) or None.
        """
        if need_head_weights:
            need_attn = True
        h = self.self_attn_sublayer(x, incremental_state, self_attn_mask, self_attn_padding_mask)
        x = self.self_attn_layer_norm(self.residual_connection(h, x))
        x_d = add_to_dual_stream(x_d, h, self.dual_scale)

        attn: Optional[Tensor] = None
        if self.encoder_attn is not None and encoder_out is not None:
            h, attn = self.cross_attn_sublayer(
                x, encoder_out, encoder_padding_mask, incremental_state, need_attn, need_head_weights
            )
            x = self.encoder_attn_layer_norm(self.residual_connection(h, x))
            x_d = add_to_dual_stream(x_d, h, self.dual_scale)

        h = self.ffn_sublayer(x)
        x = self.final_layer_norm(self.residual_connection(h, x))
        x_d = add_to_dual_stream(x_d, h, self.dual_scale)
        return x, x_d, attn

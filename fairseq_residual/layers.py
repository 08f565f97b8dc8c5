"""Sub-layers shared by the schemes that write their own layer ``forward``.

A scheme's layer is fairseq's :class:`TransformerEncoderLayerBase` / :class:`TransformerDecoderLayerBase`
(same sub-modules and parameter names: ``self_attn``, ``self_attn_layer_norm``, ``encoder_attn``,
``encoder_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``, so FSDP wrapping, activation
checkpointing, quant-noise, checkpoints and incremental decoding keep working) plus these mixins, which
return each sub-layer's dropped-out branch output ``h = drop(F(x))`` without adding any residual.
Where the residual goes is the scheme's business (``fairseq_residual/schemes/``).
"""
from typing import Dict, Optional

import torch
from torch import Tensor


def additive_attn_mask(attn_mask: Optional[Tensor], x: Tensor) -> Optional[Tensor]:
    """fairseq's encoder-layer convention: a 0/1 mask (1 = forbidden) becomes an additive one
    (-1e8 in fp32, -1e4 otherwise), as in ``TransformerEncoderLayerBase.forward``."""
    if attn_mask is None:
        return None
    return attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4)


def refuse_decoder_extras(cfg, scheme: str):
    """Refuse the decoder options that change the sub-layers (NormFormer, cross-self-attention).

    Layers built on :class:`DecoderSublayers` implement the plain sub-layers only; fairseq's
    NormFormer options act on the decoder alone.

    Raises:
        ValueError: naming the unsupported option and the fix.
    """
    for key in ("cross_self_attention", "scale_attn", "scale_heads", "scale_fc", "scale_resids"):
        if getattr(cfg, key, False):
            flag = "--" + key.replace("_", "-")
            raise ValueError(
                f"{flag} is not supported with --residual-scheme {scheme}; "
                f"drop {flag} or use --residual-scheme post_ln / pre_ln"
            )


class EncoderSublayers:
    """Branch outputs of an encoder layer (mixin for ``TransformerEncoderLayerBase`` subclasses)."""

    def self_attn_sublayer(
        self, x: Tensor, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor]
    ) -> Tensor:
        """``h = dropout(SelfAttn(x))``, T x B x C; ``attn_mask`` already additive."""
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


class DecoderSublayers(EncoderSublayers):
    """Branch outputs of a decoder layer (mixin for ``TransformerDecoderLayerBase`` subclasses)."""

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
        """``h = dropout(CrossAttn(x, encoder_out))``; returns ``(h, attention weights or None)``:
        heads x B x T x S when ``need_head_weights``, B x T x S when ``need_attn``."""
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

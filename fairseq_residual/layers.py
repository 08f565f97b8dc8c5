"""The one encoder layer and the one decoder layer of every scheme that is not fairseq's own Post-LN /
Pre-LN path: fairseq's layers with their forward pass written over the residual protocol
(:mod:`fairseq_residual.residual`).

They subclass :class:`TransformerEncoderLayerBase` / :class:`TransformerDecoderLayerBase`, so the
sub-modules, their parameter names (``self_attn``, ``self_attn_layer_norm``, ``encoder_attn``,
``encoder_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``), their initialisation (the same random
draws as fairseq's layers), quant-noise and FSDP wrapping are fairseq's. Per sub-layer ``F`` the forward
pass is::

    state = [LN(state[0])] + state[1:]      if the residual's NORM is NORM_STREAM
    x, state = residual.prepare(state, ctx)
    x = LN(x) * residual.input_scale         (LN only if NORM is NORM_INPUT)
    h = dropout(F(x, ctx))                   (attention: attend_self / attend_encoder, given the context)
    state = residual.update(state, h, ctx)
    state = [LN(state[0])] + state[1:]      if NORM is NORM_OUTPUT

with ``LN`` the sub-layer's own LayerNorm (removed from the layer when NORM is NORM_NONE) and ``ctx`` the
context of the residual protocol (:mod:`fairseq_residual.residual`). A layer takes the residual state (a
list of tensors) and the context, and returns both (the decoder layer also the cross-attention weights); it
adds to a copy of the context it was given. The attention of a branch is a method of the layer
(:meth:`_ResidualLayer.attend_self`, :meth:`_ResidualLayer.attend_encoder`): fairseq's ``MultiheadAttention``
over the branch input, reading nothing from the context; a scheme whose attention takes per-branch inputs or
extra tensors from the context, or hands back intermediates, gives its own layer classes (as HybridNorm does)
that override them, and :meth:`_ResidualLayer.branch_input` normalises a per-branch input as the branch
input is. Activation checkpointing (``--checkpoint-activations``, ``--offload-activations``) is done here
with torch's non-reentrant checkpoint, which follows the tensors inside the state list (fairseq's
``checkpoint_wrapper`` passes only positional tensors through its autograd function).

Not supported by these layers, refused at build with the flag and the fix: fairseq's NormFormer
options and ``--cross-self-attention``, which change fairseq's own sub-layer code.
"""
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from .residual import NORM_INPUT, NORM_NONE, NORM_OUTPUT, NORM_STREAM, SublayerResidual, with_main
from .user_errors import SettingError

#: the LayerNorm of each sub-layer kind, by fairseq's name
LAYER_NORM_OF = {"self_attn": "self_attn_layer_norm", "encoder_attn": "encoder_attn_layer_norm",
                 "ffn": "final_layer_norm"}


def additive_attn_mask(attn_mask: Optional[Tensor], x: Tensor) -> Optional[Tensor]:
    """fairseq's encoder-layer convention: a 0/1 mask (1 = forbidden) becomes an additive one
    (-1e8 in fp32, -1e4 otherwise), as in ``TransformerEncoderLayerBase.forward``."""
    if attn_mask is None:
        return None
    return attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4)


def refuse_decoder_extras(cfg, scheme: str):
    """Refuse the decoder options that change fairseq's sub-layer code (NormFormer, cross-self-attention).

    Raises:
        ValueError: naming the unsupported option and the fix.
    """
    for key in ("cross_self_attention", "scale_attn", "scale_heads", "scale_fc", "scale_resids"):
        if getattr(cfg, key, False):
            flag = "--" + key.replace("_", "-")
            raise SettingError(
                f"{flag} is not supported with --residual-scheme {scheme}; "
                f"drop {flag} or use --residual-scheme post_ln / pre_ln"
            )


class _ResidualLayer:
    """What the encoder and the decoder layer share: the residual objects, where their LayerNorms go,
    activation checkpointing. Sub-layer slots: 0 self-attention, 1 cross-attention, 2 FFN."""

    def _init_residuals(self, residuals: Dict[str, SublayerResidual], checkpoint: bool, offload: bool):
        self.norm_at: List[int] = [NORM_NONE, NORM_NONE, NORM_NONE]
        self.input_scale: List[float] = [1.0, 1.0, 1.0]
        # per slot, where its LayerNorm goes, as booleans (TorchScript reads no module-level constants)
        self.norm_stream: List[bool] = [False, False, False]
        self.norm_input: List[bool] = [False, False, False]
        self.norm_output: List[bool] = [False, False, False]
        for slot, kind in enumerate(("self_attn", "encoder_attn", "ffn")):
            res = residuals.get(kind)
            setattr(self, f"{kind}_residual", res)
            if res is None:  # the encoder's (or a decoder without cross-attention's) missing slot
                continue
            self.norm_at[slot] = res.NORM
            self.input_scale[slot] = float(res.input_scale)
            self.norm_stream[slot] = res.NORM == NORM_STREAM
            self.norm_input[slot] = res.NORM == NORM_INPUT
            self.norm_output[slot] = res.NORM == NORM_OUTPUT
            if res.NORM == NORM_NONE:  # the sub-layer has no LayerNorm: none in the checkpoint either
                setattr(self, LAYER_NORM_OF[kind], None)
        self.checkpoint_activations = bool(checkpoint)
        self.offload_activations = bool(offload)
        # fairseq's layer name for --retain-dropout-modules (the class name of fairseq's own layer)
        name = "TransformerEncoderLayerBase" if isinstance(self, TransformerEncoderLayerBase) else \
            "TransformerDecoderLayerBase"
        self.dropout_module.module_name = self.activation_dropout_module.module_name = name

    def _norm(self, slot: int, x: Tensor) -> Tensor:
        if slot == 0:
            if self.self_attn_layer_norm is not None:
                return self.self_attn_layer_norm(x)
        elif slot == 1:
            if self.encoder_attn_layer_norm is not None:
                return self.encoder_attn_layer_norm(x)
        else:
            if self.final_layer_norm is not None:
                return self.final_layer_norm(x)
        return x

    def _before(self, slot: int, state: List[Tensor]) -> List[Tensor]:
        if self.norm_stream[slot]:
            return with_main(state, self._norm(slot, state[0]))
        return state

    def _input(self, slot: int, x: Tensor) -> Tensor:
        if self.norm_input[slot]:
            x = self._norm(slot, x)
        if self.input_scale[slot] != 1.0:
            x = x * self.input_scale[slot]
        return x

    def _after(self, slot: int, state: List[Tensor]) -> List[Tensor]:
        if self.norm_output[slot]:
            return with_main(state, self._norm(slot, state[0]))
        return state

    def branch_input(self, slot: int, x: Tensor) -> Tensor:
        """``x`` (T x B x C) as the branch of sub-layer ``slot`` reads its input: the sub-layer's LayerNorm when
        its NORM is NORM_INPUT, times its input scale; for a per-branch input a scheme put in the context."""
        return self._input(slot, x)

    def attend_self(
        self,
        x: Tensor,
        ctx: Dict[str, Tensor],
        key_padding_mask: Optional[Tensor],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
        attn_mask: Optional[Tensor],
    ) -> Tensor:
        """The self-attention of the branch, T x B x C (before dropout): fairseq's ``MultiheadAttention`` with
        ``x`` (T x B x C, the normalised branch input) as queries, keys and values; ``ctx`` is not read.
        ``key_padding_mask`` B x T, ``attn_mask`` the additive T x T mask (or None), ``incremental_state``
        fairseq's cache (decoder) or None. A scheme's layer class overrides it to take per-branch inputs or
        extra tensors from ``ctx`` and to add intermediates to it."""
        out, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=key_padding_mask,
                                incremental_state=incremental_state, need_weights=False, attn_mask=attn_mask)
        return out

    def attend_encoder(
        self,
        x: Tensor,
        ctx: Dict[str, Tensor],
        encoder_out: Tensor,
        encoder_padding_mask: Optional[Tensor],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
        need_weights: bool,
        need_head_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """The cross-attention of the branch: ``(output T x B x C before dropout, weights or None)``, fairseq's
        ``MultiheadAttention`` with queries ``x`` (T x B x C) and keys and values the encoder output (S x B x C,
        ``encoder_padding_mask`` B x S); ``ctx`` is not read (overridable as :meth:`attend_self`)."""
        return self.encoder_attn(query=x, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
                                 incremental_state=incremental_state, static_kv=True, need_weights=need_weights,
                                 need_head_weights=need_head_weights)

    def _ffn(self, x: Tensor) -> Tensor:
        """``h = dropout(fc2(act_dropout(act(fc1(x)))))``, T x B x C."""
        x = self.activation_fn(self.fc1(x))
        x = self.activation_dropout_module(x)
        return self.dropout_module(self.fc2(x))



def checkpointed(forward, *args, offload: bool = False):
    """``forward(*args)`` under torch's non-reentrant activation checkpoint, with the saved activations
    on the CPU when ``offload`` (``--offload-activations``); eager training only."""
    from torch.utils.checkpoint import checkpoint

    if offload:
        with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()):
            return checkpoint(forward, *args, use_reentrant=False)
    return checkpoint(forward, *args, use_reentrant=False)


class ResidualEncoderLayer(_ResidualLayer, TransformerEncoderLayerBase):
    """fairseq's encoder layer over the residual protocol: self-attention, then FFN.

    Args:
        cfg: fairseq ``TransformerConfig``.
        residuals: ``{"self_attn": ..., "ffn": ...}``, the sub-layers' :class:`SublayerResidual`.
    """

    def __init__(self, cfg, residuals: Dict[str, SublayerResidual]):
        super().__init__(cfg, return_fc=False)
        self.encoder_attn_layer_norm = None  # no cross-attention in the encoder (shared slot code)
        self._init_residuals(residuals, cfg.checkpoint_activations, cfg.offload_activations)

    def forward(
        self,
        state: List[Tensor],
        encoder_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor] = None,
        ctx: Optional[Dict[str, Tensor]] = None,
    ) -> Tuple[List[Tensor], Dict[str, Tensor]]:
        """
        Args:
            state: the residual state (element 0: T x B x C, or n x T x B x C for n streams).
            encoder_padding_mask: B x T, True at padding, or None.
            attn_mask: T x T, 1 where attention is forbidden (fairseq's convention), or None.
            ctx: the context of the residual protocol from the layer below (None: empty).

        Returns:
            ``(state, ctx)``: the residual state after the layer and the context with what the layer added.
        """
        if ctx is None:
            ctx = {}
        if self.checkpoint_activations and self.training and not torch.jit.is_scripting():
            return self._checkpointed_forward(state, encoder_padding_mask, attn_mask, ctx)
        return self._forward(state, encoder_padding_mask, attn_mask, ctx)

    @torch.jit.unused
    def _checkpointed_forward(
        self, state: List[Tensor], encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor],
        ctx: Dict[str, Tensor],
    ) -> Tuple[List[Tensor], Dict[str, Tensor]]:
        return checkpointed(self._forward, state, encoder_padding_mask, attn_mask, ctx,
                            offload=self.offload_activations)

    def _forward(
        self, state: List[Tensor], encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor],
        ctx: Dict[str, Tensor],
    ) -> Tuple[List[Tensor], Dict[str, Tensor]]:
        ctx = ctx.copy()  # the caller's (and a recomputation's) context stays as it was
        state = self._before(0, state)
        x, state = self.self_attn_residual.prepare(state, ctx)
        x = self._input(0, x)
        x = self.attend_self(x, ctx, encoder_padding_mask, None, additive_attn_mask(attn_mask, x))
        state = self._after(0, self.self_attn_residual.update(state, self.dropout_module(x), ctx))

        state = self._before(2, state)
        x, state = self.ffn_residual.prepare(state, ctx)
        state = self.ffn_residual.update(state, self._ffn(self._input(2, x)), ctx)
        return self._after(2, state), ctx


class ResidualDecoderLayer(_ResidualLayer, TransformerDecoderLayerBase):
    """fairseq's decoder layer over the residual protocol: self-attention, cross-attention (unless built
    without), FFN.

    Args:
        cfg: fairseq ``TransformerConfig``; NormFormer options and ``--cross-self-attention`` are refused.
        residuals: ``{"self_attn": ..., "encoder_attn": ..., "ffn": ...}`` (no ``encoder_attn`` when
            ``no_encoder_attn``).
        no_encoder_attn: build no cross-attention.
        scheme: the scheme's name, for the refusal messages.
    """

    def __init__(self, cfg, residuals: Dict[str, SublayerResidual], no_encoder_attn=False, scheme=""):
        refuse_decoder_extras(cfg, scheme)
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        self._init_residuals(residuals, cfg.checkpoint_activations, cfg.offload_activations)

    def forward(
        self,
        state: List[Tensor],
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
        ctx: Optional[Dict[str, Tensor]] = None,
    ) -> Tuple[List[Tensor], Optional[Tensor], Dict[str, Tensor]]:
        """
        Args:
            state: the residual state (element 0: T x B x C; T = 1 in incremental decoding).
            encoder_out: S x B x C, or None.
            encoder_padding_mask: B x S, True at padding, or None.
            incremental_state: fairseq's attention key/value cache, or None.
            self_attn_mask: T x T additive future mask, or None (incremental decoding).
            self_attn_padding_mask: B x T, True at padding, or None.
            need_attn, need_head_weights: return the cross-attention weights (as fairseq's layer).
            ctx: the context of the residual protocol from the layer below (None: empty).

        Returns:
            ``(state, attn, ctx)``: the residual state after the layer, the cross-attention weights
            (heads x B x T x S with ``need_head_weights``, B x T x S with ``need_attn``) or None, and the context
            with what the layer added.
        """
        if ctx is None:
            ctx = {}
        if self.checkpoint_activations and self.training and not torch.jit.is_scripting():
            return self._checkpointed_forward(state, encoder_out, encoder_padding_mask, incremental_state,
                                              self_attn_mask, self_attn_padding_mask, need_attn,
                                              need_head_weights, ctx)
        return self._forward(state, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask,
                             self_attn_padding_mask, need_attn, need_head_weights, ctx)

    @torch.jit.unused
    def _checkpointed_forward(
        self,
        state: List[Tensor],
        encoder_out: Optional[Tensor],
        encoder_padding_mask: Optional[Tensor],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
        self_attn_mask: Optional[Tensor],
        self_attn_padding_mask: Optional[Tensor],
        need_attn: bool,
        need_head_weights: bool,
        ctx: Dict[str, Tensor],
    ) -> Tuple[List[Tensor], Optional[Tensor], Dict[str, Tensor]]:
        return checkpointed(self._forward, state, encoder_out, encoder_padding_mask, incremental_state,
                            self_attn_mask, self_attn_padding_mask, need_attn, need_head_weights, ctx,
                            offload=self.offload_activations)

    def _forward(
        self,
        state: List[Tensor],
        encoder_out: Optional[Tensor],
        encoder_padding_mask: Optional[Tensor],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
        self_attn_mask: Optional[Tensor],
        self_attn_padding_mask: Optional[Tensor],
        need_attn: bool,
        need_head_weights: bool,
        ctx: Dict[str, Tensor],
    ) -> Tuple[List[Tensor], Optional[Tensor], Dict[str, Tensor]]:
        if need_head_weights:
            need_attn = True
        ctx = ctx.copy()  # the caller's (and a recomputation's) context stays as it was
        state = self._before(0, state)
        x, state = self.self_attn_residual.prepare(state, ctx)
        x = self._input(0, x)
        x = self.attend_self(x, ctx, self_attn_padding_mask, incremental_state, self_attn_mask)
        state = self._after(0, self.self_attn_residual.update(state, self.dropout_module(x), ctx))

        attn: Optional[Tensor] = None
        if self.encoder_attn is not None and encoder_out is not None:
            state = self._before(1, state)
            x, state = self.encoder_attn_residual.prepare(state, ctx)
            x = self._input(1, x)
            x, attn = self.attend_encoder(x, ctx, encoder_out, encoder_padding_mask, incremental_state,
                                          need_attn or (not self.training and self.need_attn), need_head_weights)
            state = self._after(1, self.encoder_attn_residual.update(state, self.dropout_module(x), ctx))

        state = self._before(2, state)
        x, state = self.ffn_residual.prepare(state, ctx)
        state = self.ffn_residual.update(state, self._ffn(self._input(2, x)), ctx)
        return self._after(2, state), attn, ctx

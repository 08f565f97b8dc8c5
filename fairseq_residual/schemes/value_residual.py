"""Value residual learning, ResFormer (Zhou et al. 2025, "Value Residual Learning", arXiv 2410.17897 v5, ACL
2025, ResFormer's update ``V_n = lambda_1 V_1 + lambda_2 V_n``): Pre-LN whose self-attention in every layer
after the first mixes its values with the values of the stack's first self-attention,

    V_1 = LN_1(x_1) W_V^1 + b_V^1                                   T x B x C, layer 1 (its attention is unchanged)
    V_n = lambda_1 V_1 + lambda_2 (LN_n(x_n) W_V^n + b_V^n)          T x B x C, layers n = 2..L
    x = x + drop(Attn(Q_n, K_n, V_n))                                the residual is Pre-LN's, untouched
    output: LN_final(x)

with ``lambda_1 = lambda_2 = 0.5`` (``--value-residual-mix fixed``, the default), as the official code computes
it (Zcchill/Value-Residual-Learning, ``src/modeling/modeling_llama_resformer.py``, ``LlamaAttention.forward``:
``0.5*formal_layer_values[0] + 0.5*value_states``, V_1 not detached), or, with ``--value-residual-mix learned``,
a per-token, per-head gate computed from the attention's normalised input, as lucidrains/x-transformers does it
(``x_transformers/x_transformers.py``, ``Attention.to_value_residual_mix`` and ``value_residual.lerp(v, mix)``):

    g = sigmoid(LN_n(x_n) W_g + b_g)                                 T x B x H, W_g C x H, one gate per head
    V_n = V_1 + g (V_n' - V_1) = (1 - g) V_1 + g V_n'                 g broadcast over each head's C / H features

``W_g`` and ``b_g`` start at zero (x-transformers draws ``nn.Linear``'s default): the learned variant starts as
the fixed one, and no random number is drawn, so a model of either variant starts from the same draws as Pre-LN.
Layer 1 has no gate. V_1 is the values of the first self-attention that runs in the forward pass: layer 1's, or
under LayerDrop / ``--*-layers-to-keep`` the first layer kept.

Encoder-decoder (the project's reading): each stack mixes its own V_1 (encoder self-attention the encoder's first
layer's, decoder self-attention the decoder's). Cross-attention is left as fairseq's: its values in every layer
are projections of the same encoder output, so mixing in the first cross-attention's values
(``0.5 E W_V^1 + 0.5 E W_V^n``, what x-transformers does with a fixed 0.5) is a reparametrisation of
``W_V^n`` that brings in no shallower representation, which is what the paper adds; and a per-token gate from the
decoder positions cannot weigh values that live on the source positions (x-transformers gives cross-attention
the fixed mix only).

Incremental decoding: each later layer caches its *mixed* values in fairseq's key/value cache, so a decoding
step needs V_1 of the current position only, which layer 1 computes in the same step and hands on in the
context (``ctx['value_residual.first']``, 1 x B x C, not kept across steps). The cost per generated token is
nothing beyond fairseq's own cache (2 C per layer and position); the extra work is layer 1's value projection
computed once more outside its attention. In training each later layer keeps its stacked ``[LN(x); V_1]`` for the
backward pass: one T x B x C more per layer than Pre-LN, and its attention runs fairseq's explicit path, not the
fused one.

Mechanics: the later layers' attention is fairseq's ``MultiheadAttention`` on its explicit path with keys and
values from separate inputs (``self_attention = False``, the path fairseq takes when keys and values differ
from the queries), values ``[LN(x); V_1]`` stacked (2 x T x B x C), and its ``v_proj`` replaced by
:class:`MixedValueProjection`, which keeps the parameters ``v_proj.weight`` / ``v_proj.bias`` and computes the
mix; the learned gate is ``v_proj.residual_mix_weight`` (H x C) / ``v_proj.residual_mix_bias`` (H).
"""
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import ResidualDecoderLayer, ResidualEncoderLayer
from ..residual import SublayerResidual
from .base import Option, ResidualScheme

MIXES = ("fixed", "learned")


@dataclass(frozen=True)
class ValueResidualOptions:
    """Attributes: mix: ``fixed`` (lambda_1 = lambda_2 = 0.5) or ``learned`` (a per-token, per-head gate)."""

    mix: str = "fixed"


class MixedValueProjection(nn.Module):
    """fairseq's ``v_proj`` that mixes in V_1: input ``x`` (T x B x C) gives ``x W_V + b_V`` (a first layer's
    values); input ``[x; V_1]`` (2 x T x B x C) gives ``0.5 V_1 + 0.5 (x W_V + b_V)``. Keeps the projection's
    parameters (``weight``, ``bias``) and its quant-noise hook."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # fairseq's initialisation, no new draw
        self._forward_pre_hooks.update(linear._forward_pre_hooks)  # quant-noise, as fairseq applied it

    def forward(self, u: Tensor) -> Tensor:
        if u.dim() == 3:
            return F.linear(u, self.weight, self.bias)
        return 0.5 * u[1] + 0.5 * F.linear(u[0], self.weight, self.bias)


class GatedValueProjection(MixedValueProjection):
    """As :class:`MixedValueProjection`, with ``V_1 + g (x W_V + b_V - V_1)`` for ``[x; V_1]``, ``g = sigmoid(x W_g +
    b_g)`` per head (T x B x H), ``W_g`` = ``residual_mix_weight`` (H x C) and ``b_g`` = ``residual_mix_bias`` (H),
    both zero at the start."""

    def __init__(self, linear: nn.Linear, num_heads: int):
        super().__init__(linear)
        self.head_dim = linear.out_features // num_heads
        self.residual_mix_weight = nn.Parameter(torch.zeros(num_heads, linear.in_features))
        self.residual_mix_bias = nn.Parameter(torch.zeros(num_heads))

    def forward(self, u: Tensor) -> Tensor:
        if u.dim() == 3:
            return F.linear(u, self.weight, self.bias)
        x, first = u[0], u[1]
        gate = torch.sigmoid(F.linear(x, self.residual_mix_weight, self.residual_mix_bias))  # T x B x H
        gate = gate.repeat_interleave(self.head_dim, dim=-1)  # T x B x C, each head's features share its gate
        return first + gate * (F.linear(x, self.weight, self.bias) - first)


def with_value_mix(attn, mix: str):
    """``attn`` (fairseq's self-attention ``MultiheadAttention``) taking values ``[x; V_1]``: its ``v_proj``
    mixes them, and it runs fairseq's explicit path with separate key and value inputs."""
    proj = attn.v_proj
    if not isinstance(proj, nn.Linear) or getattr(proj, "weight_orig", None) is not None:
        raise ValueError(f"--residual-scheme value_residual needs fairseq's plain nn.Linear as v_proj, got "
                         f"{type(proj).__name__}: drop the option that wraps the attention's projections")
    attn.v_proj = GatedValueProjection(proj, attn.num_heads) if mix == "learned" else MixedValueProjection(proj)
    attn.self_attention = False  # keys and values from their own inputs (fairseq's general path)
    attn._set_skip_embed_dim_check()  # never the fused path, which reads v_proj.weight itself
    return attn


class SelfAttentionResidual(SublayerResidual):
    """Pre-LN's residual of a self-attention, knowing whether its layer is the stack's first (``first``: its
    values are V_1 and it has no mix)."""

    def __init__(self, site):
        super().__init__(site)
        self.first = site.layer == 0


class _ValueResidualAttention:
    """The self-attention of both layers: V_1 from the context, or, for the first layer that runs, its own
    values put there."""

    def attend_self(
        self,
        x: Tensor,
        ctx: Dict[str, Tensor],
        key_padding_mask: Optional[Tensor],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
        attn_mask: Optional[Tensor],
    ) -> Tensor:
        """Self-attention of ``x`` (T x B x C, normalised) whose values are mixed with ``ctx['value_residual.first']``
        (T x B x C, V_1); without it (the first layer) the plain attention, whose values become V_1."""
        if "value_residual.first" in ctx:
            value = torch.stack([x, ctx["value_residual.first"]])  # 2 x T x B x C
        else:
            ctx["value_residual.first"] = self.self_attn.v_proj(x)
            value = x
        out, _ = self.self_attn(query=x, key=x, value=value, key_padding_mask=key_padding_mask,
                                incremental_state=incremental_state, need_weights=False, attn_mask=attn_mask)
        return out


def _mix_unless_first(layer, mix: str):
    if not layer.self_attn_residual.first:
        with_value_mix(layer.self_attn, mix)


class ValueResidualEncoderLayer(_ValueResidualAttention, ResidualEncoderLayer):
    """The protocol's encoder layer whose self-attention mixes in the stack's V_1 (not in the first layer)."""

    def __init__(self, cfg, residuals, mix: str = "fixed"):
        super().__init__(cfg, residuals)
        _mix_unless_first(self, mix)


class ValueResidualDecoderLayer(_ValueResidualAttention, ResidualDecoderLayer):
    """The protocol's decoder layer whose self-attention mixes in the stack's V_1 (cross-attention: fairseq's)."""

    def __init__(self, cfg, residuals, no_encoder_attn=False, scheme="", mix: str = "fixed"):
        super().__init__(cfg, residuals, no_encoder_attn=no_encoder_attn, scheme=scheme)
        _mix_unless_first(self, mix)


class ValueResidual(ResidualScheme):
    name = "value_residual"
    label = "Value residual"
    scheme_id = 19
    color = "maroon"
    update = ("x = x + drop(Attn(LN(x))) with the values of every self-attention after the first "
              "V_n = 0.5 V_1 + 0.5 V_n (learned: V_1 + g (V_n - V_1), g a per-token, per-head sigmoid gate); "
              "FFN and cross-attention as Pre-LN")
    output = "LN_final(x)"
    init = "learned gate `W_g = 0, b_g = 0` (`g = 0.5`: starts as the fixed mix)"
    source = "Zhou et al. 2025 (ResFormer), arXiv 2410.17897 v5, `V_n = lambda_1 V_1 + lambda_2 V_n`"
    reference = ("Zcchill/Value-Residual-Learning `src/modeling/modeling_llama_resformer.py` (`LlamaAttention`); "
                 "the learned gate: lucidrains/x-transformers `x_transformers/x_transformers.py` "
                 "(`to_value_residual_mix`)")
    reading = ("each stack mixes its own first layer's values; cross-attention is not mixed (its values in every "
               "layer project the same encoder output, so mixing is a reparametrisation of W_V; x-transformers "
               "mixes the first cross-attention's values with a fixed 0.5)")
    recipe = ("the reference trains LLaMA-like decoder-only language models on SlimPajama "
              "(Zcchill/Value-Residual-Learning `README.md`); no translation recipe. Decoding caches the mixed values: "
              "no memory per token beyond fairseq's key/value cache.")
    fp16_advice = ("as Pre-LN: its stream grows with depth and training and has no scale: measure a checkpoint, "
                   "and train in bf16 where the peak nears a tenth of 65,504")
    normalize_before = True
    OPTIONS = (
        Option("value_residual_mix", str, "fixed", "how every self-attention after the first mixes the first "
               "layer's values V_1 into its own: fixed (0.5 V_1 + 0.5 V_n, the paper's code) or learned (a "
               "per-token, per-head sigmoid gate from the attention input, starting at 0.5)", choices=MIXES,
               metavar="MIX"),
    )

    def options(self, args):
        return ValueResidualOptions(mix=str(args.value_residual_mix))

    def sublayer_residual(self, cfg, site):
        return SelfAttentionResidual(site) if site.kind == "self_attn" else SublayerResidual(site)

    def encoder_layer(self, cfg, residuals):
        return ValueResidualEncoderLayer(cfg, residuals, mix=cfg.residual_options.params.mix)

    def decoder_layer(self, cfg, residuals, no_encoder_attn):
        return ValueResidualDecoderLayer(cfg, residuals, no_encoder_attn=no_encoder_attn, scheme=self.name,
                                         mix=cfg.residual_options.params.mix)


SCHEME = ValueResidual()

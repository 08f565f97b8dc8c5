"""The reordered norm of OLMo 2 (Team OLMo 2024, "2 OLMo 2 Furious", arXiv 2501.00656, the
stability changes of its architecture): the LayerNorm moves from the branch input to the branch output, and the input is not normalised,

    x = x + LN_out(drop(F(x)))        per sub-layer F (self-attention, cross-attention, FFN), x: T x B x C

with a final LayerNorm at the end of each stack, ``LN_final(x)`` (OLMo 2 normalises the last block's output
before its output projection). As allenai/OLMo-core computes it (``src/olmo_core/nn/transformer/block.py``,
``ReorderedNormTransformerBlock.forward``: ``h = x + attention_norm(attention(x))``, then
``h + feed_forward_norm(feed_forward(h))``). Unlike Peri-LN (``peri_ln``) there is no LayerNorm on the branch
input, and unlike Post-LN the stream itself is never normalised.

QK-norm (``--reordered-norm-qk-norm``, off by default), as OLMo 2 trains with it: in every attention the
queries and the keys are RMS-normalised after their projections, over the whole width C (not per head), each
with its own learned gain (OLMo-core ``src/olmo_core/nn/attention/__init__.py``, ``q_norm`` / ``k_norm`` of
size ``d_model``; HF ``transformers/models/olmo2/modeling_olmo2.py``, ``Olmo2Attention``):

    q = RMSNorm_q(x W_Q + b_Q),  k = RMSNorm_k(s W_K + b_K)       T x B x C and S x B x C
    RMSNorm(z) = z / sqrt(mean_C(z^2) + 1e-6) * g                  g: C, init 1; eps 1e-6 as OLMo 2's configs

before the split into heads and fairseq's ``1/sqrt(C/H)`` scaling of the queries.

What differs from OLMo 2, by design of this plugin: the branch-output and final norms are fairseq's LayerNorm
(eps 1e-5, affine), as every other scheme here, where OLMo 2 uses RMSNorm; QK-norm is RMSNorm as OLMo 2's.
The output norm sees the dropped-out branch (the layer applies the residual dropout before the residual's
update, as for Peri-LN); OLMo-core adds the dropout after the norm (``ResidualStream``), and OLMo 2 trains with
dropout 0, where the two agree.

Encoder-decoder (the project's reading; OLMo 2 is decoder-only): every sub-layer of both stacks, cross-attention
included, gets the output norm; with QK-norm the queries of cross-attention (decoder positions) and its keys
(projections of the encoder output) are normalised too; both stacks keep their final LayerNorm.

Parameters: ``LN_out`` is ``{kind}_residual.out_layer_norm`` (gamma 1, beta 0, the name Peri-LN uses); the
sub-layers' own fairseq LayerNorms are removed (nothing normalises the input). QK-norm's gains are
``self_attn.q_proj.norm.weight`` / ``k_proj.norm.weight`` (and ``encoder_attn.``), kept beside the
projection's own ``weight`` / ``bias``. Every weight keeps fairseq's initialisation.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import ResidualDecoderLayer, ResidualEncoderLayer
from ..residual import NORM_NONE
from .base import Option, ResidualScheme
from .peri_ln import PeriLNResidual

#: eps of QK-norm's RMSNorm (OLMo 2's ``layer_norm_eps``)
QK_NORM_EPS = 1e-6


@dataclass(frozen=True)
class ReorderedNormOptions:
    """Attributes: qk_norm: RMS-normalise queries and keys after their projections."""

    qk_norm: bool = False


class ReorderedNormResidual(PeriLNResidual):
    """``x = x + LN_out(h)``, ``h = drop(F(x))``: Peri-LN's output norm without its input norm (the layer keeps
    no LayerNorm for the sub-layer)."""

    NORM = NORM_NONE


class RMSNorm(nn.Module):
    """``z / sqrt(mean(z^2) + eps) * weight`` over the last dimension, computed in float32 and returned in the
    input's dtype (as OLMo-core's ``RMSNorm``). ``weight``: C, init 1."""

    def __init__(self, dim: int, eps: float = QK_NORM_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, z: Tensor) -> Tensor:
        y = z.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(z.dtype)


class NormedProjection(nn.Module):
    """fairseq's ``q_proj`` / ``k_proj`` followed by QK-norm: ``RMSNorm(x W + b)``, x: T x B x C. Keeps the
    projection's parameters (``weight``, ``bias``: fairseq's initialisation, no new draw) and its quant-noise
    hook; the gain is ``norm.weight``."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._forward_pre_hooks.update(linear._forward_pre_hooks)
        self.norm = RMSNorm(linear.out_features)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(F.linear(x, self.weight, self.bias))


def with_qk_norm(attn):
    """``attn`` (fairseq's ``MultiheadAttention``) with RMS-normalised queries and keys. fairseq's fused path reads
    ``q_proj.weight`` itself and would skip the norm: the attention is kept on its explicit path."""
    for name in ("q_proj", "k_proj"):
        proj = getattr(attn, name)
        if not isinstance(proj, nn.Linear) or getattr(proj, "weight_orig", None) is not None:
            raise ValueError(f"--reordered-norm-qk-norm needs fairseq's plain nn.Linear as {name}, got "
                             f"{type(proj).__name__}: drop the option that wraps the attention's projections")
        setattr(attn, name, NormedProjection(proj))
    attn._set_skip_embed_dim_check()
    return attn


class ReorderedNormEncoderLayer(ResidualEncoderLayer):
    """The protocol's encoder layer whose self-attention has QK-norm."""

    def __init__(self, cfg, residuals):
        super().__init__(cfg, residuals)
        with_qk_norm(self.self_attn)


class ReorderedNormDecoderLayer(ResidualDecoderLayer):
    """The protocol's decoder layer whose self- and cross-attention have QK-norm."""

    def __init__(self, cfg, residuals, no_encoder_attn=False, scheme=""):
        super().__init__(cfg, residuals, no_encoder_attn=no_encoder_attn, scheme=scheme)
        with_qk_norm(self.self_attn)
        if self.encoder_attn is not None:
            with_qk_norm(self.encoder_attn)


class ReorderedNorm(ResidualScheme):
    name = "reordered_norm"
    label = "Reordered norm"
    scheme_id = 22
    color = "olive"
    update = ("x = x + LN_out(drop(F(x))), no LayerNorm on the branch input; optional QK-norm "
              "q = RMSNorm(x W_Q), k = RMSNorm(x W_K) over the width C")
    output = "LN_final(x)"
    init = "one affine `LN_out` per sub-layer (gamma 1, beta 0); QK-norm gains 1"
    source = "Team OLMo 2024 (OLMo 2), arXiv 2501.00656 (reordered norm and QK-norm)"
    reference = ("allenai/OLMo-core `src/olmo_core/nn/transformer/block.py` (`ReorderedNormTransformerBlock`); "
                 "QK-norm: `src/olmo_core/nn/attention/__init__.py` (`q_norm`, `k_norm` over d_model); OLMo 2 "
                 "uses RMSNorm everywhere, here the branch-output and final norms are fairseq's LayerNorm")
    reading = ("the output norm on every sub-layer of both stacks, cross-attention included; QK-norm on every "
               "attention, cross-attention's keys (the encoder output) included; both stacks keep their final "
               "LayerNorm")
    recipe = ("decoder-only LMs of 7B and 13B parameters (OLMo 2, trained with dropout 0), whose stability "
              "ablations introduce the reordered norm together with QK-norm; no translation recipe.")
    fp16_advice = ("its stream grows with depth and training and has no scale: measure a checkpoint, and train "
                   "in bf16 where the peak nears a tenth of 65,504")
    formula_norms = "QK-norm's RMSNorm (`--reordered-norm-qk-norm`, OLMo 2's)"
    OPTIONS = (
        Option("reordered_norm_qk_norm", bool, False, "RMS-normalise the queries and keys of every attention after "
               "their projections, over the width C, as OLMo 2 (--reordered-norm-qk-norm) or not "
               "(--reordered-norm-no-qk-norm, the default)", negative="--reordered-norm-no-qk-norm"),
    )

    def options(self, args):
        return ReorderedNormOptions(qk_norm=bool(args.reordered_norm_qk_norm))

    def sublayer_residual(self, cfg, site):
        return ReorderedNormResidual(site, export=cfg.export)

    def encoder_layer(self, cfg, residuals):
        if not cfg.residual_options.params.qk_norm:
            return super().encoder_layer(cfg, residuals)
        return ReorderedNormEncoderLayer(cfg, residuals)

    def decoder_layer(self, cfg, residuals, no_encoder_attn):
        if not cfg.residual_options.params.qk_norm:
            return super().decoder_layer(cfg, residuals, no_encoder_attn)
        return ReorderedNormDecoderLayer(cfg, residuals, no_encoder_attn=no_encoder_attn, scheme=self.name)


SCHEME = ReorderedNorm()

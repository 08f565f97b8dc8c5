"""ResiDual (Pre-Post-LN; Xie et al. 2023, arXiv 2304.14802, section 3.2, eq. 4-6).

Each stack carries two streams, updated once per **sub-layer** (twice per encoder layer, three times per
decoder layer) with the *same* dropped-out branch output ``h = drop(F(x_a))``:

* ``x_a``, the Post-LN stream: ``x_a = LN(x_a + h)``, and
* ``x_d``, the dual stream: ``x_d = x_d + c * h``, never normalised inside the stack.

Both start from the embedding output (``x_a = emb``, ``x_d = c * emb``), and the stack output is
``alpha * x_a + LN_final(x_d)``, with ``LN_final`` eps 1e-7, for the encoder (its output feeds
cross-attention) and the decoder (its output goes to the output projection); this is what the authors'
code (github.com/microsoft/ResiDual, ``resi_dual/``) computes. ``c`` (``--resi-dual-scale``, per stack)
keeps the running sum inside the fp16 range: ``LN(c*x) = LN(x)`` up to eps. ``alpha`` is the weight of the
Post-LN stream in the output (1 in the paper).

Ablation, off by default: ``--resi-dual-start-from zeros`` starts the dual stream from zeros instead of the
embedding output (the authors' code has that line commented out). With ``x_d = c * emb`` and shared
embeddings, ``LN_final(x_d)`` of a shallow or young model is dominated by the input token's embedding, so
the decoder output carries a copy of the previous token into the logits; starting from zeros removes that
term: ``x_d = c * sum(h)``.

``x_d`` at position t depends only on position t's own sub-layer outputs, so incremental decoding needs
no cached state for it: the attention key/value caches (reordered by fairseq's
``reorder_incremental_state``) are all that carries across time steps.
"""
import math
from dataclasses import dataclass
from typing import List, Optional

import torch
from torch import Tensor

from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from ..layers import DecoderSublayers, EncoderSublayers, additive_attn_mask, refuse_decoder_extras
from .base import STACKS, ResidualScheme

# eps of ResiDual's final LayerNorm over the dual stream (the authors' value; fairseq's default is 1e-5).
# LN(c * x_d) == LN(x_d) only when eps is negligible against var(c * x_d), hence the tiny value.
FINAL_LN_EPS = 1e-7
#: What the dual stream can start from: the embedding output (the authors' code) or zeros (ablation).
START_FROM = ("embedding", "zeros")


@dataclass(frozen=True)
class ResiDualOptions:
    """ResiDual's constants of one model.

    Attributes:
        encoder_scale, decoder_scale: dual-stream scale c per stack, 0 < c <= 1.
        encoder_alpha, decoder_alpha: weight alpha of ``x_a`` in the stack output, finite.
        start_from: what the dual stream starts from, ``embedding`` (the authors' code) or ``zeros``.
    """

    encoder_scale: float = 1.0
    decoder_scale: float = 1.0
    encoder_alpha: float = 1.0
    decoder_alpha: float = 1.0
    start_from: str = "embedding"

    def __post_init__(self):
        for name in ("encoder_scale", "decoder_scale"):
            c = getattr(self, name)
            if not (isinstance(c, (int, float)) and math.isfinite(c) and 0.0 < c <= 1.0):
                flag = "--" + name.replace("_scale", "-resi-dual-scale")
                raise ValueError(
                    f"{flag} (or --resi-dual-scale) must be in (0, 1], got {c!r}: it scales the dual "
                    f"stream x_d = c*emb + c*sum(h); use 1.0 for fp32/bf16 and e.g. 0.05 for fp16"
                )
        for name in ("encoder_alpha", "decoder_alpha"):
            a = getattr(self, name)
            if not (isinstance(a, (int, float)) and math.isfinite(a)):
                flag = "--" + name.replace("_alpha", "-resi-dual-alpha")
                raise ValueError(f"{flag} must be a finite number, got {a!r}")
        if self.start_from not in START_FROM:
            raise ValueError(
                f"--resi-dual-start-from must be one of {', '.join(START_FROM)}, got {self.start_from!r}"
            )

    def scale(self, stack):
        """Dual-stream scale c of ``stack`` ('encoder' or 'decoder')."""
        return self.encoder_scale if stack == "encoder" else self.decoder_scale

    def alpha(self, stack):
        """Output weight alpha of ``stack`` ('encoder' or 'decoder')."""
        return self.encoder_alpha if stack == "encoder" else self.decoder_alpha


def add_to_dual_stream(x_d: Tensor, h: Tensor, scale: float) -> Tensor:
    """Dual-stream update ``x_d + c * h`` (one fused op; paper eq. 5).

    Args:
        x_d: dual stream, T x B x C.
        h: dropped-out sub-layer output, T x B x C.
        scale: the stack's dual-stream scale c, 0 < c <= 1.
    """
    return torch.add(x_d, h, alpha=scale) if scale != 1.0 else x_d + h


class ResiDualEncoderLayer(EncoderSublayers, TransformerEncoderLayerBase):
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
        h = self.self_attn_sublayer(x, encoder_padding_mask, additive_attn_mask(attn_mask, x))
        x = self.self_attn_layer_norm(self.residual_connection(h, x))
        x_d = add_to_dual_stream(x_d, h, self.dual_scale)

        h = self.ffn_sublayer(x)
        x = self.final_layer_norm(self.residual_connection(h, x))
        x_d = add_to_dual_stream(x_d, h, self.dual_scale)
        return x, x_d


class ResiDualDecoderLayer(DecoderSublayers, TransformerDecoderLayerBase):
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
        refuse_decoder_extras(cfg, "resi_dual")
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        self.dual_scale = float(dual_scale)

    def forward(
        self,
        x: Tensor,
        x_d: Tensor,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state=None,
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


class ResiDual(ResidualScheme):
    name = "resi_dual"
    label = "ResiDual"
    scheme_id = 2
    color = "tab:green"
    update = "h = drop(F(x_a)); x_a = LN(x_a + h); x_d = x_d + c*h"
    output = "alpha * x_a + LN_final(x_d)"
    source = "Xie et al. 2023, arXiv 2304.14802, section 3.2, eq. 4-6"
    reference = "github.com/microsoft/ResiDual, resi_dual/"

    def add_args(self, parser):
        parser.add_argument(
            "--resi-dual-scale",
            type=float,
            metavar="C",
            help="ResiDual: scale c of the dual stream, x_d = c*emb + c*sum(h), for both stacks; "
            "0 < c <= 1 (default 1.0); a small c (e.g. 0.05) keeps x_d inside the fp16 range without "
            "changing the output, since LN(c*x) = LN(x)",
        )
        for stack in STACKS:
            parser.add_argument(
                f"--{stack}-resi-dual-scale",
                type=float,
                metavar="C",
                help=f"ResiDual: dual-stream scale c of the {stack} (default: --resi-dual-scale)",
            )
        for stack in STACKS:
            parser.add_argument(
                f"--{stack}-resi-dual-alpha",
                type=float,
                metavar="A",
                help=f"ResiDual: weight alpha of the Post-LN stream in the {stack} output "
                "alpha*x_a + LN(x_d) (default 1.0)",
            )

        parser.add_argument(
            "--resi-dual-start-from",
            choices=START_FROM,
            help="ResiDual: start the dual stream from the embedding output, x_d = c*emb (default, the "
            "authors' code), or from zeros, x_d = c*sum(h) (ablation)",
        )

    def fill_defaults(self, args):
        shared = getattr(args, "resi_dual_scale", None)
        args.resi_dual_scale = 1.0 if shared is None else shared
        for stack in STACKS:
            if getattr(args, f"{stack}_resi_dual_scale", None) is None:
                setattr(args, f"{stack}_resi_dual_scale", args.resi_dual_scale)
            if getattr(args, f"{stack}_resi_dual_alpha", None) is None:
                setattr(args, f"{stack}_resi_dual_alpha", 1.0)
        if getattr(args, "resi_dual_start_from", None) is None:
            args.resi_dual_start_from = "embedding"

    def options(self, args):
        return ResiDualOptions(
            encoder_scale=float(args.encoder_resi_dual_scale),
            decoder_scale=float(args.decoder_resi_dual_scale),
            encoder_alpha=float(args.encoder_resi_dual_alpha),
            decoder_alpha=float(args.decoder_resi_dual_alpha),
            start_from=getattr(args, "resi_dual_start_from", "embedding"),
        )

    def encoder_layer(self, cfg):
        return ResiDualEncoderLayer(cfg, dual_scale=cfg.residual_options.params.encoder_scale)

    def decoder_layer(self, cfg, no_encoder_attn):
        return ResiDualDecoderLayer(cfg, no_encoder_attn, dual_scale=cfg.residual_options.params.decoder_scale)

    def init_stack(self, stack, cfg):
        opts: ResiDualOptions = cfg.residual_options.params
        stack.dual_scale = opts.scale(stack.stack)
        stack.resi_dual_alpha = opts.alpha(stack.stack)
        stack.dual_start_zeros = opts.start_from == "zeros"
        embed_dim = stack.embed_dim if stack.stack == "decoder" else stack.embed_tokens.embedding_dim
        # LN_final over the dual stream; same parameter name as fairseq's Pre-LN final norm.
        stack.layer_norm = LayerNorm(embed_dim, eps=FINAL_LN_EPS, export=cfg.export)

    own_loop = True

    @staticmethod
    def start_dual_stream(stack, x: Tensor) -> Tensor:
        """``x_d = c * x`` from the embedding output x (T x B x C); x itself when c == 1 (no copy:
        the dual stream is only ever updated out of place); zeros with ``--resi-dual-start-from zeros``."""
        if stack.dual_start_zeros:
            return torch.zeros_like(x)
        return x if stack.dual_scale == 1.0 else x * stack.dual_scale

    @staticmethod
    def output(stack, x_a: Tensor, x_d: Tensor) -> Tensor:
        """Stack output ``alpha * x_a + LN_final(x_d)`` (paper eq. 6), T x B x C."""
        return torch.add(stack.layer_norm(x_d), x_a, alpha=stack.resi_dual_alpha)

    def encoder_loop(self, encoder, x, padding_mask, return_all_hiddens):
        """Dual-stream loop; ``encoder_states`` holds the ``x_a`` stream after each layer."""
        x_d = self.start_dual_stream(encoder, x)
        encoder_states: List[Tensor] = [x] if return_all_hiddens else []
        for layer in encoder.layers:
            x, x_d = layer(x, x_d, padding_mask)
            if return_all_hiddens:
                encoder_states.append(x)
        return self.output(encoder, x, x_d), encoder_states

    def decoder_loop(self, decoder, x, inputs, alignment_layer):
        """Dual-stream loop; ``inner_states`` holds the ``x_a`` stream after the embedding and each layer."""
        x_d = self.start_dual_stream(decoder, x)
        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        for idx, layer in enumerate(decoder.layers):
            x, x_d, layer_attn = layer(
                x,
                x_d,
                inputs.encoder_out,
                inputs.encoder_padding_mask,
                inputs.incremental_state,
                self_attn_mask=inputs.self_attn_mask,
                self_attn_padding_mask=inputs.self_attn_padding_mask,
                need_attn=bool(idx == alignment_layer),
                need_head_weights=bool(idx == alignment_layer),
            )
            inner_states.append(x)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn
        return self.output(decoder, x, x_d), attn, inner_states


SCHEME = ResiDual()

"""Encoder and decoder of ``residual_transformer``: fairseq's stacks with a selectable residual scheme.

* ``post_ln`` / ``pre_ln``: fairseq's own :class:`TransformerEncoderBase` / :class:`TransformerDecoderBase`
  layers and forward passes, with ``normalize_before`` False / True. Nothing is re-implemented, so the
  two schemes are fairseq's transformer bit for bit (``tests/test_exactness.py``).
* ``resi_dual``: :class:`~fairseq_residual.layers.ResiDualEncoderLayer` /
  :class:`~fairseq_residual.layers.ResiDualDecoderLayer`, with the dual stream started from the
  embedding output, ``x_d = c * x_a`` (reference notes section 1), and the stack output
  ``alpha * x_a + LN_final(x_d)`` with ``LN_final`` eps 1e-7, replacing fairseq's final LayerNorm under
  the same parameter name (``layer_norm``).

Every stack stores its scheme in the buffer ``residual_scheme_id`` so that loading a checkpoint of
another scheme fails with an error naming both; checkpoints of fairseq's stock ``transformer`` (no
such buffer) load into the matching scheme (``post_ln`` without a final LayerNorm, ``pre_ln`` with one).
"""
from typing import Dict, List, Optional

import torch
from torch import Tensor

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules import LayerNorm
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from .config import RESI_DUAL, RESI_DUAL_FINAL_LN_EPS, SCHEME_IDS, SCHEMES, ResidualOptions
from .layers import ResiDualDecoderLayer, ResiDualEncoderLayer


class SchemeMismatchError(ValueError):
    """A checkpoint of one residual scheme was loaded into a model of another."""


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as ``TransformerEncoderBase.build_encoder_layer``."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    # if we are checkpointing, enforce that FSDP always wraps the checkpointed layer
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class _ResidualStackMixin:
    """What the encoder and the decoder share: scheme bookkeeping and the checkpoint check."""

    stack = "encoder"

    def _init_residual(self, cfg, embed_dim):
        opts: ResidualOptions = cfg.residual_options
        self.residual_scheme = opts.scheme
        self.register_buffer(
            "residual_scheme_id", torch.tensor(SCHEME_IDS[opts.scheme], dtype=torch.long)
        )
        if opts.scheme == RESI_DUAL:
            self.dual_scale = opts.scale(self.stack)
            self.resi_dual_alpha = opts.alpha(self.stack)
            # LN_final over the dual stream; same parameter name as fairseq's Pre-LN final norm.
            self.layer_norm = LayerNorm(embed_dim, eps=RESI_DUAL_FINAL_LN_EPS, export=cfg.export)

    def start_dual_stream(self, x: Tensor) -> Tensor:
        """``x_d = c * x`` from the embedding output x (T x B x C); x itself when c == 1 (no copy:
        the dual stream is only ever updated out of place)."""
        return x if self.dual_scale == 1.0 else x * self.dual_scale

    def resi_dual_output(self, x_a: Tensor, x_d: Tensor) -> Tensor:
        """Stack output ``alpha * x_a + LN_final(x_d)`` (paper eq. 6), T x B x C."""
        return torch.add(self.layer_norm(x_d), x_a, alpha=self.resi_dual_alpha)

    def upgrade_state_dict_named(self, state_dict, name):
        """fairseq's upgrade, then the scheme check.

        Raises:
            SchemeMismatchError: the state dict was saved by a model of another residual scheme.
        """
        state_dict = super().upgrade_state_dict_named(state_dict, name)
        prefix = f"{name}." if name else ""
        key = prefix + "residual_scheme_id"
        if key in state_dict:
            saved = SCHEMES[int(state_dict[key])]
        else:  # fairseq's stock transformer: Pre-LN iff it has a final LayerNorm
            saved = "pre_ln" if prefix + "layer_norm.weight" in state_dict else "post_ln"
            state_dict[key] = torch.tensor(SCHEME_IDS[saved], dtype=torch.long)
        if saved != self.residual_scheme:
            raise SchemeMismatchError(
                f"the checkpoint's {self.stack} was trained with residual scheme '{saved}' but this "
                f"model's {self.stack} uses residual scheme '{self.residual_scheme}': load it with "
                f"--residual-scheme {saved} (model.residual_scheme={saved}), or train the "
                f"'{self.residual_scheme}' model from scratch in a new --save-dir"
            )
        return state_dict


class ResidualTransformerEncoder(_ResidualStackMixin, TransformerEncoderBase):
    """Transformer encoder with a selectable residual scheme (subclass of ``TransformerEncoderBase``).

    Args:
        cfg: fairseq ``TransformerConfig`` with the attribute ``residual_options``
            (:class:`~fairseq_residual.config.ResidualOptions`).
        dictionary: source dictionary.
        embed_tokens: source embedding (``nn.Embedding``).

    ``forward`` returns fairseq's encoder dict; ``encoder_out`` is T x B x C. Under ``resi_dual``,
    ``encoder_states`` (``return_all_hiddens``) holds the ``x_a`` stream after each layer.
    """

    stack = "encoder"

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self._init_residual(cfg, embed_tokens.embedding_dim)

    def build_encoder_layer(self, cfg):
        opts: ResidualOptions = cfg.residual_options
        if opts.scheme != RESI_DUAL:
            return super().build_encoder_layer(cfg)
        if self.return_fc:
            raise ValueError("return_fc is not supported with --residual-scheme resi_dual")
        return wrap_layer(ResiDualEncoderLayer(cfg, dual_scale=opts.encoder_scale), cfg)

    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[torch.Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[torch.Tensor] = None,
    ):
        """Encode ``src_tokens`` (B x T). Post-LN / Pre-LN: fairseq's code; ResiDual: dual stream.

        Returns:
            dict as :meth:`TransformerEncoderBase.forward`: ``encoder_out`` [T x B x C],
            ``encoder_padding_mask`` [B x T], ``encoder_embedding`` [B x T x C],
            ``encoder_states``, ``src_lengths`` [B x 1].
        """
        if self.residual_scheme != RESI_DUAL:
            return super().forward_scriptable(
                src_tokens, src_lengths, return_all_hiddens, token_embeddings
            )
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = bool(encoder_padding_mask.any())

        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if has_pads:  # zero the padded positions, as fairseq does
            x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        x_d = self.start_dual_stream(x)

        encoder_states: List[Tensor] = [x] if return_all_hiddens else []
        for layer in self.layers:
            x, x_d = layer(x, x_d, encoder_padding_mask if has_pads else None)
            if return_all_hiddens:
                encoder_states.append(x)
        x = self.resi_dual_output(x, x_d)

        src_lengths = (
            src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        )
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [encoder_padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": encoder_states,  # List[T x B x C]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }


class ResidualTransformerDecoder(_ResidualStackMixin, TransformerDecoderBase):
    """Transformer decoder with a selectable residual scheme (subclass of ``TransformerDecoderBase``).

    Args:
        cfg: fairseq ``TransformerConfig`` with the attribute ``residual_options``.
        dictionary: target dictionary.
        embed_tokens: target embedding.
        no_encoder_attn: build no encoder-decoder attention.

    Incremental decoding (``fairseq-generate``) is fairseq's: under ``resi_dual`` the dual stream of
    the current step is rebuilt from that step's embedding and sub-layer outputs, and the attention
    caches are reordered by the inherited ``reorder_incremental_state``.
    """

    stack = "decoder"

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(
            cfg,
            dictionary,
            embed_tokens,
            no_encoder_attn=no_encoder_attn,
            output_projection=output_projection,
        )
        self._init_residual(cfg, self.embed_dim)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        opts: ResidualOptions = cfg.residual_options
        if opts.scheme != RESI_DUAL:
            return super().build_decoder_layer(cfg, no_encoder_attn)
        layer = ResiDualDecoderLayer(cfg, no_encoder_attn, dual_scale=opts.decoder_scale)
        return wrap_layer(layer, cfg)

    def embed(self, prev_output_tokens, incremental_state=None):
        """Token + position embedding after dropout, B x T x C (only the last step when incremental).

        The embedding part of :meth:`TransformerDecoderBase.extract_features_scriptable`.
        """
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]
        prev_output_tokens = prev_output_tokens.contiguous()
        x = self.embed_scale * self.embed_tokens(prev_output_tokens)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x += positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return self.dropout_module(x), prev_output_tokens

    def extract_features_scriptable(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        """Decoder features, B x T x C, and ``{"attn": [B x T x S or None], "inner_states": [...]}``.

        Post-LN / Pre-LN: fairseq's code. ResiDual: the dual-stream loop; ``inner_states`` holds the
        ``x_a`` stream (T x B x C) after the embedding and after each layer.
        """
        if self.residual_scheme != RESI_DUAL:
            return super().extract_features_scriptable(
                prev_output_tokens,
                encoder_out,
                incremental_state,
                full_context_alignment,
                alignment_layer,
                alignment_heads,
            )
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        enc: Optional[Tensor] = None
        padding_mask: Optional[Tensor] = None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            padding_mask = encoder_out["encoder_padding_mask"][0]

        x, prev_output_tokens = self.embed(prev_output_tokens, incremental_state)
        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        x_d = self.start_dual_stream(x)

        self_attn_padding_mask: Optional[Tensor] = None
        if prev_output_tokens.eq(self.padding_idx).any():
            self_attn_padding_mask = prev_output_tokens.eq(self.padding_idx)
        self_attn_mask = None
        if incremental_state is None and not full_context_alignment:
            self_attn_mask = self.buffered_future_mask(x)

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        for idx, layer in enumerate(self.layers):
            x, x_d, layer_attn = layer(
                x,
                x_d,
                enc,
                padding_mask,
                incremental_state,
                self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask,
                need_attn=bool(idx == alignment_layer),
                need_head_weights=bool(idx == alignment_layer),
            )
            inner_states.append(x)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)
        if attn is not None:
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)  # average over heads

        x = self.resi_dual_output(x, x_d).transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}

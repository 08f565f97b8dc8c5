"""Encoder and decoder of ``residual_transformer``: fairseq's stacks with a selectable residual scheme.

The stacks know nothing about any particular scheme: they ask the scheme object
(:mod:`fairseq_residual.schemes`) which layers to build, what to add to the stack after fairseq built it,
and, for a scheme that needs one (ResiDual's dual stream, DLCL's layer history), for its own loop over the
layers. Everything else is fairseq's :class:`TransformerEncoderBase` / :class:`TransformerDecoderBase`:
a scheme that keeps fairseq's layers and loop (Post-LN, Pre-LN) is fairseq's transformer bit for bit
(``tests/test_exactness.py``).

Every stack stores its scheme in the buffer ``residual_scheme_id`` so that loading a checkpoint of
another scheme fails with an error naming both; checkpoints of fairseq's stock ``transformer`` (no
such buffer) load into the matching scheme (``post_ln`` without a final LayerNorm, ``pre_ln`` with one).
"""
from typing import Dict, List, NamedTuple, Optional

import torch
from torch import Tensor

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from .schemes import get_scheme, scheme_by_id


class SchemeMismatchError(ValueError):
    """A checkpoint of one residual scheme was loaded into a model of another."""


class DecoderInputs(NamedTuple):
    """What every decoder layer receives besides its input (fairseq's decoder-layer arguments).

    Attributes:
        encoder_out: S x B x C, or None.
        encoder_padding_mask: B x S, True at padding, or None.
        incremental_state: fairseq's decoding cache, or None.
        self_attn_mask: T x T additive future mask, or None (incremental decoding).
        self_attn_padding_mask: B x T, True at padding, or None.
    """

    encoder_out: Optional[Tensor]
    encoder_padding_mask: Optional[Tensor]
    incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]]
    self_attn_mask: Optional[Tensor]
    self_attn_padding_mask: Optional[Tensor]


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as ``TransformerEncoderBase.build_encoder_layer``."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    # if we are checkpointing, enforce that FSDP always wraps the checkpointed layer
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class _ResidualStackMixin:
    """What the encoder and the decoder share: the scheme object and the checkpoint check."""

    stack = "encoder"

    def _init_residual(self, cfg):
        self.residual_options = cfg.residual_options
        self.scheme = get_scheme(cfg.residual_options.scheme)
        self.residual_scheme = self.scheme.name
        self.register_buffer(
            "residual_scheme_id", torch.tensor(self.scheme.scheme_id, dtype=torch.long)
        )
        self.scheme.init_stack(self, cfg)

    def upgrade_state_dict_named(self, state_dict, name):
        """fairseq's upgrade, then the scheme check.

        Raises:
            SchemeMismatchError: the state dict was saved by a model of another residual scheme.
        """
        state_dict = super().upgrade_state_dict_named(state_dict, name)
        prefix = f"{name}." if name else ""
        key = prefix + "residual_scheme_id"
        if key in state_dict:
            saved = scheme_by_id(int(state_dict[key])).name
        else:  # fairseq's stock transformer: Pre-LN iff it has a final LayerNorm
            saved = "pre_ln" if prefix + "layer_norm.weight" in state_dict else "post_ln"
            state_dict[key] = torch.tensor(get_scheme(saved).scheme_id, dtype=torch.long)
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
            (:class:`~fairseq_residual.schemes.SchemeOptions`).
        dictionary: source dictionary.
        embed_tokens: source embedding (``nn.Embedding``).

    ``forward`` returns fairseq's encoder dict; ``encoder_out`` is T x B x C. For a scheme with its own
    loop, ``encoder_states`` (``return_all_hiddens``) holds what that scheme calls a layer's output.
    """

    stack = "encoder"

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self._init_residual(cfg)

    def build_encoder_layer(self, cfg):
        layer = get_scheme(cfg.residual_options.scheme).encoder_layer(cfg)
        if layer is None:
            return super().build_encoder_layer(cfg)
        if self.return_fc:
            raise ValueError(f"return_fc is not supported with --residual-scheme {cfg.residual_options.scheme}")
        return wrap_layer(layer, cfg)

    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[torch.Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[torch.Tensor] = None,
    ):
        """Encode ``src_tokens`` (B x T): fairseq's code, or the scheme's own layer loop.

        Returns:
            dict as :meth:`TransformerEncoderBase.forward`: ``encoder_out`` [T x B x C],
            ``encoder_padding_mask`` [B x T], ``encoder_embedding`` [B x T x C],
            ``encoder_states``, ``src_lengths`` [B x 1].
        """
        if not self.scheme.own_loop:
            return super().forward_scriptable(
                src_tokens, src_lengths, return_all_hiddens, token_embeddings
            )
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = bool(encoder_padding_mask.any())

        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if has_pads:  # zero the padded positions, as fairseq does
            x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        x, encoder_states = self.scheme.encoder_loop(
            self, x, encoder_padding_mask if has_pads else None, return_all_hiddens
        )
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

    Incremental decoding (``fairseq-generate``) is fairseq's: the attention caches are reordered by the
    inherited ``reorder_incremental_state``; a scheme with its own loop must keep every other state of a
    step a function of that step's position alone (each scheme module says why it does).
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
        self._init_residual(cfg)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        layer = get_scheme(cfg.residual_options.scheme).decoder_layer(cfg, no_encoder_attn)
        if layer is None:
            return super().build_decoder_layer(cfg, no_encoder_attn)
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

        fairseq's code, or the scheme's own layer loop between fairseq's embedding and output parts.
        """
        if not self.scheme.own_loop:
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

        self_attn_padding_mask: Optional[Tensor] = None
        if prev_output_tokens.eq(self.padding_idx).any():
            self_attn_padding_mask = prev_output_tokens.eq(self.padding_idx)
        self_attn_mask = None
        if incremental_state is None and not full_context_alignment:
            self_attn_mask = self.buffered_future_mask(x)

        inputs = DecoderInputs(enc, padding_mask, incremental_state, self_attn_mask, self_attn_padding_mask)
        x, attn, inner_states = self.scheme.decoder_loop(self, x, inputs, alignment_layer)
        if attn is not None:
            attn = attn.float().to(x)
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)  # average over heads

        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}

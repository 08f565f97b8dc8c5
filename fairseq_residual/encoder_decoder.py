"""Encoder and decoder of ``residual_transformer``: fairseq's stacks with a selectable residual scheme.

Two kinds of stack, chosen by the scheme (:attr:`~fairseq_residual.schemes.base.ResidualScheme.fairseq_path`):

* :class:`ResidualTransformerEncoder` / :class:`ResidualTransformerDecoder`: fairseq's
  :class:`TransformerEncoderBase` / :class:`TransformerDecoderBase` with fairseq's own layers and forward
  passes, untouched. Post-LN and Pre-LN run here and are fairseq's ``transformer`` bit for bit
  (``tests/test_exactness.py``).
* :class:`ProtocolEncoder` / :class:`ProtocolDecoder`: the one loop of every other scheme, over the layers
  of :mod:`fairseq_residual.layers` and the residual protocol of :mod:`fairseq_residual.residual`: the
  stack's :class:`~fairseq_residual.residual.StackResidual` (``encoder.residual``, ``decoder.residual``)
  starts the state from the embedding output, passes it between layers and ends it, and the protocol's
  context goes from layer to layer, empty at the start of every forward pass; ``layer_norm`` is the
  scheme's final LayerNorm (or None). fairseq's bookkeeping is kept: padding, ``return_all_hiddens``
  (``encoder_states`` / ``inner_states`` hold the residual's :meth:`view` after each layer), the
  alignment layer's attention averaged over heads, layer-drop, incremental decoding (fairseq's attention
  caches, reordered by the inherited ``reorder_incremental_state``: the residual state is per position).

Every stack stores its scheme in the buffer ``residual_scheme_id`` (and a ``--norm`` other than LayerNorm in
``residual_norm_id``) so that loading a checkpoint of another scheme (or norm) fails with an error naming both;
checkpoints of fairseq's stock ``transformer`` (no such buffer) load into the matching scheme (``post_ln``
without a final LayerNorm, ``pre_ln`` with one).
"""
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules import LayerNorm

from .norms import DEFAULT_NORM, NORM_BY_ID, NORM_IDS, NormMismatchError
from .residual import Site
from .schemes import get_scheme, scheme_by_id, stock_scheme
from .user_errors import UserInputError, advice_for_this_tool


#: the name fairseq gives the dropout modules of each part of its transformer (``module_name`` of
#: ``FairseqDropout``, which ``--retain-dropout-modules`` matches); this model's dropout modules carry them
DROPOUT_NAMES = {"encoder": "TransformerEncoder", "decoder": "TransformerDecoder",
                 "encoder_layer": "TransformerEncoderLayerBase", "decoder_layer": "TransformerDecoderLayerBase",
                 "attention": "MultiheadAttention"}


#: the registered model's name, for messages (model.py registers it; importing it here would be circular)
MODEL_NAME_FOR_MESSAGES = "residual_transformer"


class SchemeMismatchError(UserInputError, ValueError):
    """A checkpoint of one residual scheme was loaded into a model of another."""


class _ResidualStackMixin:
    """What every stack shares: the scheme object, its checkpoint id and the checkpoint check."""

    stack = "encoder"
    # plain Python objects, used at build and load time only: not part of a TorchScript module
    __jit_ignored_attributes__ = ["scheme", "residual_options", "residual_norm"]

    def _init_residual(self, cfg):
        # fairseq's name for the stack's dropout (--retain-dropout-modules TransformerEncoder / ...Decoder)
        self.dropout_module.module_name = DROPOUT_NAMES[self.stack]
        self.residual_options = cfg.residual_options
        self.scheme = cfg.residual_options.scheme
        self.residual_scheme = self.scheme.name
        self.register_buffer(
            "residual_scheme_id", torch.tensor(self.scheme.scheme_id, dtype=torch.long)
        )
        norm = cfg.residual_options.norm
        self.residual_norm = DEFAULT_NORM if norm is None else norm.kind
        if self.residual_norm != DEFAULT_NORM:  # a LayerNorm model's checkpoint holds no such buffer
            self.register_buffer("residual_norm_id", torch.tensor(NORM_IDS[self.residual_norm], dtype=torch.long))

    def upgrade_state_dict_named(self, state_dict, name):
        """fairseq's upgrade, the scheme's renames of older parameter names, then the scheme check.

        Raises:
            SchemeMismatchError: the state dict was saved by a model of another residual scheme.
            NormMismatchError: ... of another ``--norm`` (buffer ``residual_norm_id``, absent for LayerNorm).
        """
        prefix = f"{name}." if name else ""
        key = prefix + "residual_scheme_id"
        if key in state_dict:
            saved = scheme_by_id(int(state_dict[key])).name
        else:  # fairseq's stock transformer
            saved = stock_scheme(prefix + "layer_norm.weight" in state_dict)
            state_dict[key] = torch.tensor(get_scheme(saved).scheme_id, dtype=torch.long)
        if saved != self.residual_scheme:
            fix = advice_for_this_tool(
                f"the scheme is read from the checkpoint: drop residual_scheme from --model-overrides, or set it "
                f"to '{saved}' there (a stock fairseq checkpoint loaded as {MODEL_NAME_FOR_MESSAGES} records none)",
                f"resume with --residual-scheme {saved} (model.residual_scheme={saved}), or train the "
                f"'{self.residual_scheme}' model from scratch in a new --save-dir (checkpoint.save_dir) or from a "
                f"--restore-file (checkpoint.restore_file) of a '{self.residual_scheme}' model")
            raise SchemeMismatchError(
                f"the checkpoint's {self.stack} was trained with residual scheme '{saved}' but this "
                f"model's {self.stack} uses residual scheme '{self.residual_scheme}': {fix}"
            )
        norm_key = prefix + "residual_norm_id"
        saved_norm = NORM_BY_ID.get(int(state_dict[norm_key]), "unknown") if norm_key in state_dict else DEFAULT_NORM
        if saved_norm != self.residual_norm:
            fix = advice_for_this_tool(
                "the norm is read from the checkpoint: drop norm from --model-overrides",
                f"resume with --norm {saved_norm} (model.norm={saved_norm}), or train the --norm "
                f"{self.residual_norm} model from scratch in a new --save-dir (checkpoint.save_dir) or from a "
                f"--restore-file (checkpoint.restore_file) of such a model")
            raise NormMismatchError(
                f"the checkpoint's {self.stack} was trained with --norm {saved_norm} but this model's {self.stack} "
                f"uses --norm {self.residual_norm}: {fix}"
            )
        self.scheme.upgrade_state_dict(state_dict, prefix, self.stack, self.residual_options)
        return super().upgrade_state_dict_named(state_dict, name)

    def layer_view(self, output) -> Tuple[Tensor, Dict[str, Tensor]]:
        """What a layer of this stack returned, as the analysis tool reads it: ``(hidden state T x B x C,
        extra streams by name)``; fairseq's layers return the hidden state (decoder: first of a tuple)."""
        if isinstance(output, tuple):
            output = output[0]
        return output, {}


class ResidualTransformerEncoder(_ResidualStackMixin, TransformerEncoderBase):
    """fairseq's Transformer encoder, for the schemes that are fairseq's own code (Post-LN, Pre-LN).

    Args:
        cfg: fairseq ``TransformerConfig`` with the attribute ``residual_options``
            (:class:`~fairseq_residual.schemes.SchemeOptions`).
        dictionary: source dictionary.
        embed_tokens: source embedding (``nn.Embedding``).

    ``forward`` returns fairseq's encoder dict; ``encoder_out`` is T x B x C.
    """

    stack = "encoder"

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self._init_residual(cfg)


class ResidualTransformerDecoder(_ResidualStackMixin, TransformerDecoderBase):
    """fairseq's Transformer decoder, for the schemes that are fairseq's own code (Post-LN, Pre-LN).

    Args:
        cfg: fairseq ``TransformerConfig`` with the attribute ``residual_options``.
        dictionary: target dictionary.
        embed_tokens: target embedding.
        no_encoder_attn: build no encoder-decoder attention.
    """

    stack = "decoder"

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        self._init_residual(cfg)


class _ProtocolStackMixin(_ResidualStackMixin):
    """Building a stack of protocol layers: the layers with their sub-layers' residuals, the stack's
    residual and final LayerNorm, declared by the scheme."""

    def _build_protocol_layer(self, cfg, no_encoder_attn=False):
        options = cfg.residual_options
        scheme = options.scheme
        built = self._layers_built = getattr(self, "_layers_built", -1) + 1
        stack = self.stack
        # the layer's index and depth in the model as trained (--*-layers-to-keep builds a subset)
        index = options.kept(stack)[built] if options.kept(stack) else built
        layers = options.depth(stack) or (cfg.encoder.layers if stack == "encoder" else cfg.decoder.layers)
        kinds = ("self_attn", "ffn") if stack == "encoder" or no_encoder_attn else \
            ("self_attn", "encoder_attn", "ffn")
        embed_dim = cfg.encoder.embed_dim if stack == "encoder" else cfg.decoder.embed_dim
        residuals = {
            kind: scheme.sublayer_residual(cfg, Site(
                stack=stack, kind=kind, layer=index, layers=layers, index=index * len(kinds) + j,
                per_layer=len(kinds), embed_dim=embed_dim,
                encoder_layers=options.encoder_layers or cfg.encoder.layers,
                decoder_layers=options.decoder_layers or cfg.decoder.layers))
            for j, kind in enumerate(kinds)
        }
        if stack == "encoder":
            layer = scheme.encoder_layer(cfg, residuals)
        else:
            layer = scheme.decoder_layer(cfg, residuals, no_encoder_attn)
        # activation checkpointing is the layer's own (layers.py); FSDP wraps as fairseq does
        return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0)

    def _init_protocol(self, cfg, embed_dim):
        self._init_residual(cfg)
        scheme = self.scheme
        self.residual = scheme.stack_residual(cfg, self.stack, len(self.layers), embed_dim)
        eps = scheme.final_norm(cfg, self.stack)
        if self.stack == "decoder" and cfg.no_decoder_final_norm:  # as fairseq's Pre-LN decoder (check_args
            eps = None  # refused the flag where the scheme's output formula holds the LayerNorm)
        self.layer_norm = None if eps is None else LayerNorm(embed_dim, eps=eps, export=cfg.export)

    def layer_view(self, output) -> Tuple[Tensor, Dict[str, Tensor]]:
        """``(residual.view(state), residual.streams(state))`` of the state a layer returned."""
        state = output[0] if isinstance(output, tuple) else output
        return self.residual.view(state), self.residual.streams(state)


class ProtocolEncoder(_ProtocolStackMixin, TransformerEncoderBase):
    """The encoder of every scheme that is not fairseq's own code: one loop over
    :class:`~fairseq_residual.layers.ResidualEncoderLayer` with the scheme's residual state.

    Args: as :class:`ResidualTransformerEncoder`. ``encoder_states`` (``return_all_hiddens``) holds the
    embedding output and the residual's view after each layer.
    """

    stack = "encoder"

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        if return_fc:
            raise ValueError(f"return_fc is not supported with --residual-scheme {cfg.residual_options.name}")
        super().__init__(cfg, dictionary, embed_tokens, return_fc=False)
        self._init_protocol(cfg, embed_tokens.embedding_dim)

    def build_encoder_layer(self, cfg):
        return self._build_protocol_layer(cfg)

    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[torch.Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[torch.Tensor] = None,
    ):
        """Encode ``src_tokens`` (B x T).

        Returns:
            dict as :meth:`TransformerEncoderBase.forward`: ``encoder_out`` [T x B x C],
            ``encoder_padding_mask`` [B x T], ``encoder_embedding`` [B x T x C],
            ``encoder_states``, ``src_lengths`` [B x 1].
        """
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        padding_mask: Optional[Tensor] = None
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if bool(encoder_padding_mask.any()):  # zero the padded positions, as fairseq does
            x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x))
            padding_mask = encoder_padding_mask
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        encoder_states: List[Tensor] = []
        if return_all_hiddens:
            encoder_states.append(x)
        state = self.residual.start(x)
        ctx: Dict[str, Tensor] = {}  # the protocol's context, from layer to layer (empty for most schemes)
        for idx, layer in enumerate(self.layers):
            state, ctx = layer(state, encoder_padding_mask=padding_mask, ctx=ctx)
            if return_all_hiddens:
                encoder_states.append(self.residual.view(state))
            state = self.residual.between(idx, state)
        x = self.residual.final_input(state)
        if self.layer_norm is not None:
            x = self.residual.finish(state, self.layer_norm(x))
        else:
            x = self.residual.finish(state, x)

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


class ProtocolDecoder(_ProtocolStackMixin, TransformerDecoderBase):
    """The decoder of every scheme that is not fairseq's own code: one loop over
    :class:`~fairseq_residual.layers.ResidualDecoderLayer` with the scheme's residual state.

    Args: as :class:`ResidualTransformerDecoder`. ``inner_states`` holds the embedding output and the
    residual's view after each layer; at an incremental decoding step it holds None for the layers unless
    ``return_all_hiddens`` asks for them (a multi-stream view is a sum over the streams, computed after every
    layer of every step otherwise, for a list that beam search never reads).
    """

    stack = "decoder"

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        self._init_protocol(cfg, self.embed_dim)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return self._build_protocol_layer(cfg, no_encoder_attn)

    def embed(self, prev_output_tokens, incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None):
        """Token + position embedding after dropout, B x T x C (only the last step when incremental),
        and the tokens it embedded: the embedding part of
        :meth:`TransformerDecoderBase.extract_features_scriptable`."""
        positions: Optional[Tensor] = None
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

    def forward(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        features_only: bool = False,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
    ):
        """:meth:`TransformerDecoderBase.forward`, passing ``return_all_hiddens`` on to the layer loop."""
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state, full_context_alignment,
                                         alignment_layer, alignment_heads, return_all_hiddens)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
        return_all_hiddens: bool = False,
    ):
        return self.extract_features_scriptable(prev_output_tokens, encoder_out, incremental_state,
                                                full_context_alignment, alignment_layer, alignment_heads,
                                                return_all_hiddens)

    def extract_features_scriptable(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
        return_all_hiddens: bool = False,
    ):
        """Decoder features, B x T x C, and ``{"attn": [B x T x S or None], "inner_states": [...]}``;
        ``inner_states`` holds the residual's view after each layer, or None at an incremental decoding step
        that does not ask for it (``return_all_hiddens``)."""
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
        self_attn_mask: Optional[Tensor] = None
        if incremental_state is None and not full_context_alignment:
            self_attn_mask = self.buffered_future_mask(x)

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        state = self.residual.start(x)
        ctx: Dict[str, Tensor] = {}  # the protocol's context, from layer to layer (empty for most schemes)
        for idx, layer in enumerate(self.layers):
            state, layer_attn, ctx = layer(
                state,
                enc,
                padding_mask,
                incremental_state,
                self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask,
                need_attn=bool(idx == alignment_layer),
                need_head_weights=bool(idx == alignment_layer),
                ctx=ctx,
            )
            inner_states.append(self.residual.view(state) if incremental_state is None or return_all_hiddens
                                else None)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)
            state = self.residual.between(idx, state)
        x = self.residual.final_input(state)
        if self.layer_norm is not None:
            x = self.residual.finish(state, self.layer_norm(x))
        else:
            x = self.residual.finish(state, x)

        if attn is not None:
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)  # average over heads

        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}

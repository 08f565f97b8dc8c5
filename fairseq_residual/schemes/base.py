"""What a residual scheme is: the base class every scheme module subclasses.

A scheme decides, for the encoder and the decoder of ``residual_transformer``:

* which layers the stack builds (:meth:`ResidualScheme.encoder_layer` / :meth:`decoder_layer`; ``None``
  keeps fairseq's own ``TransformerEncoderLayerBase`` / ``TransformerDecoderLayerBase``, with
  ``normalize_before`` set from :attr:`ResidualScheme.normalize_before`),
* how a stack starts and ends (:meth:`init_stack`, and :meth:`encoder_forward` /
  :meth:`decoder_features` when the scheme needs its own loop over the layers; otherwise fairseq's
  forward runs unchanged),
* how the model is initialised after fairseq's own initialisation (:meth:`initialize`),
* its own command-line options, their defaults and its option checks (:meth:`add_args`,
  :meth:`fill_defaults`, :meth:`options`, :meth:`check_args`).

Everything else (embeddings, attention, FFN, output projection, incremental decoding caches) is
fairseq's. A scheme object is stateless: the per-model constants live in the options object that
:meth:`options` returns and that the stacks receive as ``cfg.residual_options``.
"""
import argparse
from dataclasses import dataclass
from typing import Any, Optional

STACKS = ("encoder", "decoder")


@dataclass(frozen=True)
class SchemeOptions:
    """The validated residual options of one model: the scheme's name and its own constants.

    Attributes:
        scheme: the scheme's registry name (``--residual-scheme``).
        params: the scheme's own options (a frozen dataclass defined by the scheme module, or None).
    """

    scheme: str
    params: Any = None


class ResidualScheme:
    """One residual/normalisation scheme of ``residual_transformer``.

    Class attributes every scheme sets:
        name: the ``--residual-scheme`` value and preset suffix (``post_ln``).
        label: the field's name for it (``Post-LN``), used in tables and plots.
        scheme_id: the integer stored in every checkpoint (buffer ``residual_scheme_id``); fixed
            forever once released, never reused.
        color: matplotlib colour of the scheme in every plot of the project.
        update: the update of one sub-layer ``F`` as a formula (README and ``--help``).
        output: the stack output as a formula.
        source: the paper (and equation or section) the formula comes from.
        reference: the reference implementation followed (repository and file), or "".
        normalize_before: fairseq's ``normalize_before`` for the stacks (True only for Pre-LN-like
            schemes); ``--{encoder,decoder}-normalize-before`` contradicting it is refused.
    """

    name: str = ""
    label: str = ""
    scheme_id: int = -1
    color: str = "tab:gray"
    update: str = ""
    output: str = ""
    source: str = ""
    reference: str = ""
    normalize_before: bool = False

    # ------------------------------------------------------------------ options
    def add_args(self, parser: argparse.ArgumentParser) -> None:
        """Add this scheme's own options to the model parser (no defaults: fairseq's presets fill
        them, see :meth:`fill_defaults`)."""

    def fill_defaults(self, args) -> None:
        """Fill this scheme's options the user did not give (fairseq ``--arch`` preset convention).
        Called for every registered scheme, whichever is selected, so checkpoints hold every key."""

    def options(self, args) -> Any:
        """This scheme's validated constants read from ``args`` (None when it has none).

        Raises:
            ValueError: an option value outside its range, naming the flag and the fix.
        """
        return None

    def check_args(self, args) -> None:
        """Refuse fairseq options this scheme cannot honour (called only for the selected scheme).

        The base check refuses a ``--{encoder,decoder}-normalize-before`` that contradicts
        :attr:`normalize_before`: the scheme decides where LayerNorm goes.

        Raises:
            ValueError: naming the option and the fix.
        """
        if self.normalize_before:
            return
        for stack in STACKS:
            if getattr(args, f"{stack}_normalize_before", False):
                raise ValueError(
                    f"--{stack}-normalize-before asks for Pre-LN but --residual-scheme is "
                    f"{self.name}: the scheme decides where LayerNorm goes; drop "
                    f"--{stack}-normalize-before or use --residual-scheme pre_ln"
                )

    # ------------------------------------------------------------------ building
    def encoder_layer(self, cfg) -> Optional[Any]:
        """The encoder layer to build, or None for fairseq's ``TransformerEncoderLayerBase``."""
        return None

    def decoder_layer(self, cfg, no_encoder_attn: bool) -> Optional[Any]:
        """The decoder layer to build, or None for fairseq's ``TransformerDecoderLayerBase``."""
        return None

    def init_stack(self, stack, cfg) -> None:
        """Add stack-level modules or constants after fairseq built the stack (``stack.stack`` is
        'encoder' or 'decoder'); e.g. ResiDual's final LayerNorm over the dual stream."""

    def initialize(self, model, args) -> None:
        """Re-initialise parameters after fairseq's own initialisation (depth-scaled schemes)."""

    #: True when the scheme runs its own loop over the layers (:meth:`encoder_forward`,
    #: :meth:`decoder_features`); False keeps fairseq's stack forward passes.
    own_loop: bool = False

    def encoder_loop(self, encoder, x, padding_mask, return_all_hiddens):
        """The encoder's loop over its layers, for a scheme with :attr:`own_loop`.

        Args:
            encoder: the :class:`~fairseq_residual.encoder_decoder.ResidualTransformerEncoder`.
            x: embedding output after dropout, padded positions zeroed, T x B x C.
            padding_mask: B x T, True at padding, or None when the batch has none.
            return_all_hiddens: also return the hidden state after the embedding and each layer.

        Returns:
            ``(encoder_out, encoder_states)``: T x B x C, and a list of T x B x C (empty unless
            ``return_all_hiddens``).
        """
        raise NotImplementedError(f"{self.name} runs fairseq's encoder loop")

    def decoder_loop(self, decoder, x, inputs, alignment_layer):
        """The decoder's loop over its layers, for a scheme with :attr:`own_loop`.

        Args:
            decoder: the :class:`~fairseq_residual.encoder_decoder.ResidualTransformerDecoder`.
            x: embedding output after dropout, T x B x C (T = 1 in incremental decoding).
            inputs: :class:`~fairseq_residual.encoder_decoder.DecoderInputs` (encoder output and
                its padding mask, incremental state, self-attention masks).
            alignment_layer: index of the layer whose cross-attention weights are returned.

        Returns:
            ``(features, attn, inner_states)``: T x B x C before the output projection, the
            alignment layer's attention (heads x B x T x S) or None, and the hidden states after the
            embedding and after each layer (list of T x B x C).
        """
        raise NotImplementedError(f"{self.name} runs fairseq's decoder loop")

    def __repr__(self):
        return f"<residual scheme {self.name} ({self.label})>"

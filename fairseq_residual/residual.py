"""The residual protocol: what a scheme is made of when it is not fairseq's own Post-LN / Pre-LN path.

In the spirit of x-transformers' ``Residual`` / ``HyperConnection`` objects (lucidrains/x-transformers,
``x_transformers/x_transformers.py``: ``prepare`` the branch input from the residual, then combine the
branch output with it), a residual scheme is two kinds of objects:

* one :class:`SublayerResidual` per sub-layer (self-attention, cross-attention, FFN), owned by its layer
  (``layers.i.self_attn_residual``, ``layers.i.encoder_attn_residual``, ``layers.i.ffn_residual``, so its
  parameters stay under ``layers.i.``), built knowing the sub-layer's identity (:class:`Site`). It says
  what the branch reads from the residual state and adds to the context (:meth:`SublayerResidual.prepare`),
  where the layer's own LayerNorm of that sub-layer goes (:attr:`SublayerResidual.NORM`), and how the branch
  output updates the state (:meth:`SublayerResidual.update`);
* one :class:`StackResidual` per stack (``encoder.residual``, ``decoder.residual``): how the state starts
  from the embedding output (:meth:`~StackResidual.start`), what happens between layers
  (:meth:`~StackResidual.between`, DLCL's layer history), how it ends (:meth:`~StackResidual.final_input`,
  normalised by the stack's ``layer_norm`` when the scheme has one, then :meth:`~StackResidual.finish`),
  and a :meth:`~StackResidual.view` of the state: the T x B x C that fairseq's ``inner_states`` /
  ``encoder_states`` (``return_all_hiddens``) and the analysis tool see, plus any extra streams by name
  (:meth:`~StackResidual.streams`) and the one whose fp16 range the analysis tool reports
  (:meth:`~StackResidual.ranged_stream`): the scheme describes its own state to the tool.

The **state** is a list of tensors. Element 0 is the main stream (T x B x C; for an n-stream scheme it
may be n x T x B x C); the scheme decides what the other elements are (ResiDual's dual stream, B2T's
layer input, DLCL's normalised history). A sub-layer receives the state, ``prepare`` returns the branch
input and the state to pass to ``update``; the layer in between computes the branch
``h = drop(F(LN(input)))`` (the LN only when :attr:`~SublayerResidual.NORM` is :data:`NORM_INPUT`). The state
is rebuilt, never modified in place. Everything in the state is a stream, one vector per position (values
that are not, as ReZero's alpha or a connection's coefficients, go in the context): incremental decoding
needs no cache beyond fairseq's attention keys and values.

The **context** (``ctx``, a ``Dict[str, Tensor]``) travels beside the state and holds what is not a stream
of the residual: values a layer's sub-layers share (ReZero's alpha), coefficients a sub-layer's ``prepare``
hands to its ``update`` (the multi-stream connections' ``B`` / ``H_post``), and what a branch exchanges with
its attention, as x-transformers passes ``prepare``'s keyword arguments to the residual and
``value_residual=`` into its attention, which returns ``intermediates`` (lucidrains/x-transformers,
``x_transformers/x_transformers.py``). ``prepare`` may add per-branch inputs to it (a key/value input that
differs from the query input, an extra input such as the first layer's values); the layer hands the context
to the branch's attention (:meth:`~fairseq_residual.layers.ResidualEncoderLayer.attend_self`,
:meth:`~fairseq_residual.layers.ResidualDecoderLayer.attend_encoder`), which a scheme's own layer class
overrides to read those inputs and to add its intermediates (its values); ``update`` and the later
sub-layers and layers read them. Each layer works on a copy of the context it receives and returns it to the
stack loop, which starts with an empty one at every forward pass (every decoding step): an activation
checkpoint recomputes a layer from the context it first saw. Keys are named by the scheme that writes them
(``"rezero.alpha"``), spelt out where they are used (TorchScript reads no module-level strings). Schemes that
use no context leave it empty: nothing is computed or kept for them. Fairseq's own attention reads nothing
from it.

The layers that run this protocol are :mod:`fairseq_residual.layers`, the loops over them
:mod:`fairseq_residual.encoder_decoder`; both are shared by every scheme, and TorchScript compiles them.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

#: where the layer applies the sub-layer's own LayerNorm (fairseq's ``self_attn_layer_norm``,
#: ``encoder_attn_layer_norm``, ``final_layer_norm``, which keep their names):
#: no LayerNorm: the layer has none for this sub-layer (T-Fixup, ReZero, HybridNorm's attention)
NORM_NONE = 0
#: on the branch input, ``h = drop(F(LN(input)))`` (Pre-LN)
NORM_INPUT = 1
#: on the main stream after the update, ``x = LN(update(x, h))`` (Post-LN)
NORM_OUTPUT = 2
#: on the main stream before the branch reads it, ``x = LN(x)``, then ``h = drop(F(x))`` (HybridNorm's FFN)
NORM_STREAM = 3

#: the sub-layer kinds, in their order within a layer
SUBLAYERS = ("self_attn", "encoder_attn", "ffn")


@dataclass(frozen=True)
class Site:
    """The identity of one sub-layer, given to the scheme that builds its residual.

    Attributes:
        stack: ``encoder`` or ``decoder``.
        kind: ``self_attn``, ``encoder_attn`` (cross-attention) or ``ffn``.
        layer: 0-based index of the layer in its stack.
        layers: the number of layers of the stack (N or M).
        index: 0-based index of the sub-layer in its stack, counting every sub-layer in order (encoder:
            SA, FFN, SA, FFN, ...; decoder: SA, CA, FFN, ...).
        per_layer: sub-layers per layer of the stack (2 in the encoder, 3 in a decoder with
            cross-attention).
        embed_dim: the stack's width C.
        encoder_layers, decoder_layers: N and M of the model (DeepNorm's constants use both).
    """

    stack: str
    kind: str
    layer: int
    layers: int
    index: int
    per_layer: int
    embed_dim: int
    encoder_layers: int
    decoder_layers: int


@dataclass(frozen=True)
class StreamRange:
    """An extra stream of the state whose range against fp16's the analysis tool reports
    (``fairseq-residual-analyze``'s ``dual_stream``: the largest magnitude after each layer, the headroom, and the
    largest scale from the 1-2-5 series that keeps the stream within a fraction of fp16's largest value), as a
    stack residual declares it (:meth:`StackResidual.ranged_stream`).

    Attributes:
        name: the stream's name among :meth:`StackResidual.streams`.
        scale: the constant the stream is built scaled by (ResiDual's c, ``--resi-dual-scale``): the stream is
            linear in it, so the measured stream divided by it is the stream at scale 1.
        norm_eps: the eps, at scale 1, of the LayerNorm that reads the stream (ResiDual's ``LN_final``), whose
            ratio to the stream's smallest variance the report gives; None when no LayerNorm reads it.
    """

    name: str
    scale: float = 1.0
    norm_eps: Optional[float] = None


def with_main(state: List[Tensor], x: Tensor) -> List[Tensor]:
    """The state with its main stream (element 0) replaced by ``x``."""
    return [x] + state[1:]


class SublayerResidual(nn.Module):
    """The residual connection of one sub-layer: by default Pre-LN's ``x = x + h`` with ``h`` the
    dropped-out branch of the normalised input (``NORM = NORM_INPUT``).

    Subclasses override :meth:`prepare` and/or :meth:`update` and the class constants. Methods must be
    TorchScript-compatible (typed, no Python objects); profiling or other eager-only machinery goes in
    methods marked ``@torch.jit.unused``.

    Class constants:
        NORM: where the layer applies the sub-layer's LayerNorm (:data:`NORM_NONE`, :data:`NORM_INPUT`,
            :data:`NORM_OUTPUT`, :data:`NORM_STREAM`).

    Attributes:
        input_scale: a constant multiplying the branch input after that LayerNorm, 1.0 unless a subclass sets
            it per instance (LayerNorm Scaling's ``1/sqrt(l)``).
    """

    NORM = NORM_INPUT

    def __init__(self, site: Site):
        super().__init__()
        self.input_scale = 1.0

    def prepare(self, state: List[Tensor], ctx: Dict[str, Tensor]) -> Tuple[Tensor, List[Tensor]]:
        """``(branch input before the layer's LayerNorm, T x B x C; the state update() receives)``.

        ``ctx`` is the context (see the module docstring): ``prepare`` may add to it what the branch or
        :meth:`update` reads (per-branch inputs, values shared by the layer's sub-layers); by default nothing."""
        return state[0], state

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        """The state after the sub-layer; ``out`` is the dropped-out branch output ``h``, T x B x C; ``ctx`` the
        context as :meth:`prepare` and the branch left it (it may add to it what later sub-layers or layers
        read)."""
        return with_main(state, state[0] + out)

    def extra_repr(self):
        return f"norm={('none', 'input', 'output', 'stream')[self.NORM]}" + (
            f", input_scale={self.input_scale:.4g}" if self.input_scale != 1.0 else "")


class PostLNResidual(SublayerResidual):
    """Post-LN's ``x = LN(x + h)``, ``h = drop(F(x))`` (Vaswani et al. 2017, section 3.1)."""

    NORM = NORM_OUTPUT


class PlainResidual(SublayerResidual):
    """``x = x + h``, ``h = drop(F(x))``, no LayerNorm (T-Fixup's sub-layers)."""

    NORM = NORM_NONE


class StackResidual(nn.Module):
    """How the residual state of one stack starts, passes between layers and ends: by default one
    stream, ``state = [x]``, the stack output ``LN_final(x)`` (or ``x`` when the scheme has no final
    LayerNorm), and ``x`` as the view.

    Args:
        stack: ``encoder`` or ``decoder``.
        num_layers: the stack's number of layers.
        embed_dim: the stack's width C.
    """

    def __init__(self, stack: str, num_layers: int, embed_dim: int):
        super().__init__()
        self.num_layers = num_layers

    def start(self, x: Tensor) -> List[Tensor]:
        """The state before the first layer, from the embedding output ``x`` (T x B x C, after dropout;
        padded encoder positions zeroed)."""
        return [x]

    def between(self, index: int, state: List[Tensor]) -> List[Tensor]:
        """The state after layer ``index`` (0-based) as the next layer (or :meth:`final_input`) takes it."""
        return state

    def final_input(self, state: List[Tensor]) -> Tensor:
        """What the stack's ``layer_norm`` normalises (when the scheme has one), T x B x C."""
        return state[0]

    def finish(self, state: List[Tensor], normed: Tensor) -> Tensor:
        """The stack output, T x B x C, from the state and ``normed`` = ``layer_norm(final_input(state))``
        (``final_input(state)`` itself when the stack has no final LayerNorm)."""
        return normed

    def view(self, state: List[Tensor]) -> Tensor:
        """The hidden state after a layer as fairseq reports it (``inner_states``), T x B x C."""
        return state[0]

    @torch.jit.unused
    def streams(self, state: List[Tensor]) -> Dict[str, Tensor]:
        """Extra named streams of the state after a layer, each T x B x C, for analysis (``{}`` for one
        stream): the analysis tool reports the cosine of each between consecutive layers and, for several
        streams, how alike they are."""
        return {}

    @torch.jit.unused
    def ranged_stream(self):
        """The :class:`StreamRange` of the extra stream whose fp16 range the analysis tool reports (one of
        :meth:`streams`), or None (the default: no stream of this scheme has a range to watch)."""
        return None

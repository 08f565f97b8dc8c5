"""MUDDFormer (Xiao, Meng, Li, Yuan 2025, "MUDDFormer: Breaking Residual Bottlenecks in Transformers via
Multiway Dynamic Dense Connections", arXiv 2502.12170, ICML 2025, section 2, eq. 3-6): Pre-LN layers whose
attention reads its queries, keys and values, and whose residual reads its stream, each from its own dynamic
dense mix of every earlier layer output of the stack,

    X_0 = embedding output (after dropout), X_i = output of layer i                     T x B x C each
    after layer i (1-based, i < L), for each stream s in (q, k, v, r):
        A^s(X_i) = W2 GELU(W1 RMSNorm(X_i))          one MLP per layer, all streams: C -> H_i -> S (i + 1)
        X^s = sum_{j=0}^{i} (b^s_{ij} + A^s_{ij}(X_i)) X_j                              T x B x C
    layer i + 1 (i >= 1):
        h = X^r + drop(Attn(q = LN_q(X^q), k = LN_k(X^k), v = LN_v(X^v)))
        X_{i+1} = h + drop(FFN(LN(h)))
    after layer L: only the residual stream, X^r = sum_j (b_{Lj} + A_{Lj}(X_L)) X_j
    output: LN_final(X^r)

with ``RMSNorm`` without gain (eps 1e-6) and the exact (erf) GELU. Layer 1 reads X_0 for every stream through
one LayerNorm, as the reference's first block. The coefficients are per position (T x B), not shared over
the sequence: the "dynamic" of the name; ``b`` is the static part.

As Caiyun-AI/MUDDFormer computes it (``pytorch/muddformer/modeling_muddformer.py``: ``MUDDFormer.forward``,
``MultiwayDynamicDenseBlock``, ``TransformerBlock`` with ``sepln``: separate norms for q, k, v from the second
block on; the residual is ``x[-1]``): the MLP's output is read as ``(S, i+1)`` with the stream index outer
(``'B T (C L) -> C B T L'``), the static ``b`` (``dense_bs``) is added to it, and the hidden size is the
reference's rule: ``H_i = (i+1) S`` (S streams; its ``(lidx+2) C``), times 4 after the last layer
(``expand_last``), then rounded up past a multiple of 64, ``(H // 64 + 1) * 64`` (``round64``; both on in the
released configs; ``--muddformer-no-round64`` leaves the product unrounded). The PyTorch code is
inference-only (``dense_bs`` is a random placeholder for JAX checkpoints); the initialisation is the JAX
training code's (``jax/MaxText/layers/llama2.py``): W1 normal with fan-in scaling (std ``C^(-1/2)``), W2 = 0,
``b`` one-hot 1 on the newest output X_i (0 on the others), so that a new model is the Pre-LN Transformer it
builds on (the same weights compute the same function, ``tests/test_muddformer.py``). What differs from the
reference, by design of this plugin: LayerNorm (affine, eps 1e-5) where it has RMSNorm (the Pre-LN model
here is fairseq's), fairseq's attention and FFN; the mixes are accumulated in fp32 and rounded once to the
model's dtype, and the coefficient MLP runs in fp32.

Storage of W1 and W2: as the reference stores them (the default), or, with ``--muddformer-unit-weights``, at
unit scale behind constant multipliers, ``W1 = w1 / sqrt(C)``, ``W2 = w2 / sqrt(H)`` with the stored w1 drawn
from N(0, 1) and w2 = 0: the same function and the same initial function. The coefficients are unbounded, and a
perturbation of the stored weights of a given size (an optimiser's step, a test's noise) moves them by
sqrt(fan_in) times more when W is stored itself: at C = H = 64, noise 0.3 per entry gives coefficients of about
+-15 whose cancelling mixes fp32 cannot resolve to 1e-5 (the tests perturb them by 0.05 instead). The unit
storage makes Adam's steps on W1 and W2 fan_in^(-1/2) times those on the reference's weights (1/sqrt(C) on W1,
1/8 on W2 at H = 64): a smaller effective learning rate for the dynamic part (b is stored as is), which is why
it is not the default.

Encoder-decoder (the project's reading; the paper and its code are decoder-only language models):

* Per stack: the encoder mixes its own X_0..X_N (X_0 the source embedding), the decoder its own X_0..X_M;
  nothing mixes the two stacks. The encoder output is LN_final of the encoder's last residual mix, and every
  decoder layer's cross-attention takes its keys and values from it, as in the Pre-LN model (the mixes choose a
  layer's inputs; cross-attention's memory is the encoder's output, not a decoder layer's input).
* A fifth stream in the decoder (with cross-attention), the cross-attention query c: after decoder layer i
  the MLP produces five streams (q, k, v, r, c), and layer i + 1 computes

      a = drop(SelfAttn(LN_q(X^q), LN_k(X^k), LN_v(X^v))),  h = X^r + a
      h = h + drop(CrossAttn(LN_c(X^c + a), encoder output)),  X_{i+1} = h + drop(FFN(LN(h)))

  The query of cross-attention is an input of an attention, which MUDD decouples from the residual as it
  decouples the self-attention's query (its thesis: the inputs of different roles want different mixes of
  earlier layers); its keys and values are the encoder's, fixed. It adds this layer's self-attention output
  ``a`` to X^c, so that cross-attention still sees its own layer's self-attention, as in Pre-LN, and at
  initialisation X^c = X^r = X_i makes ``X^c + a = h``, the Pre-LN decoder. The FFN reads the residual h, as in
  the reference. ``LN_c`` is fairseq's ``encoder_attn_layer_norm``. A decoder without cross-attention
  (``--no-cross-attention``) has the four streams.

Incremental decoding: a mix combines the outputs of different layers at one position, never different
positions, so a decoding step computes X_0..X_M and every stream of its own position in that step (the
reference's ``LayerCache`` likewise holds the current token's L + 1 outputs, overwritten each step). Between
steps nothing persists beyond fairseq's attention keys and values (the self-attention caches the projections of
``LN_k(X^k)`` and ``LN_v(X^v)`` at earlier positions, as it caches Pre-LN's): 0 floats per decoded token more
than Pre-LN, and beam reordering has nothing more to reorder. Within a step the working set is the stored
outputs and the streams, (M + 1 + S) x C floats per hypothesis, freed after the step. A full forward (training)
keeps the L + 1 outputs of each stack and, per layer, the coefficients (T x B x S(i+1)) for the mixes and
their gradients; the mixes are accumulated term by term, so autograd keeps the outputs themselves, not an
(i+1)-fold stacked copy per layer (the reference's ``torch.stack`` + ``einsum``).

Parameters: per stack ``{encoder,decoder}.residual.connections.{i}.w1`` (H_i x C), ``.w2`` (S_i (i+1) x H_i),
``.bias`` (S_i x (i+1)), S_i = 1 after the last layer; per layer from the second on ``k_layer_norm`` and
``v_layer_norm`` (LN_k, LN_v; LN_q is fairseq's ``self_attn_layer_norm``). At L = 6, C = 512 with rounding:
0.20 M parameters per stack in the connections, 10 k in LN_k and LN_v.

fairseq's layer-drop is refused: a dropped layer would shift the indices j of X_j, of the coefficients and of
the connections.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.modules import LayerNorm

from ..layers import ResidualDecoderLayer, ResidualEncoderLayer
from ..residual import StackResidual, SublayerResidual
from .base import Option, ResidualScheme

#: eps of the coefficient MLP's RMSNorm without gain (the reference's ``norm_eps``)
RMS_EPS = 1e-6
#: the streams, in the order of the MLP's output (the reference's ``qkvr``, then the cross-attention query)
STREAMS = ("q", "k", "v", "r", "c")


@dataclass(frozen=True)
class MuddFormerOptions:
    """Attributes: round64: round the MLPs' hidden sizes up past a multiple of 64, as the reference;
    unit_weights: store W1, W2 at unit scale behind constant multipliers ``fan_in^(-1/2)``."""

    round64: bool = True
    unit_weights: bool = False


def hidden_size(i: int, streams: int, last: bool, round64: bool = True) -> int:
    """The hidden size H of the coefficient MLP after layer ``i`` (1-based) of a stack with ``streams`` streams:
    ``(i + 1) * streams`` (``streams`` = 1 after the last layer, times 4 there), then, with ``round64``,
    ``(H // 64 + 1) * 64`` (the reference's ``MultiwayDynamicDenseBlock``: 64 for H < 64, 128 for H = 64)."""
    h = (i + 1) * (1 if last else streams)
    if last:
        h *= 4
    if round64:
        h = (h // 64 + 1) * 64
    return h


class DynamicDenseConnection(nn.Module):
    """The connection after layer ``i`` (1-based) of a stack: ``S`` streams, each a mix of X_0..X_i with the
    per-position coefficients ``b + W2 GELU(W1 RMSNorm(X_i))``.

    Args:
        i: the layer it follows (1-based).
        embed_dim: C.
        streams: S (1 after the last layer).
        hidden: H.
        unit_weights: W1 = w1 / sqrt(C), W2 = w2 / sqrt(H) with the stored w1, w2 (else W1 = w1, W2 = w2).
    """

    def __init__(self, i: int, embed_dim: int, streams: int, hidden: int, unit_weights: bool = False):
        super().__init__()
        self.inputs = i + 1
        self.streams = streams
        self.w1_scale = embed_dim ** -0.5 if unit_weights else 1.0
        self.w2_scale = hidden ** -0.5 if unit_weights else 1.0
        self.w1 = nn.Parameter(torch.zeros(hidden, embed_dim))  # drawn by MuddFormer.initialize
        self.w2 = nn.Parameter(torch.zeros(streams * (i + 1), hidden))
        bias = torch.zeros(streams, i + 1)
        bias[:, i] = 1.0  # one-hot on the newest output X_i: the Pre-LN model
        self.bias = nn.Parameter(bias)

    def coefficients(self, x: Tensor) -> Tensor:
        """``b + W2 GELU(W1 RMSNorm(x))`` in fp32, T x B x S x (i+1), from the newest output ``x`` (T x B x C)."""
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        u = x.to(acc)
        u = u * torch.rsqrt(u.pow(2).mean(dim=-1, keepdim=True) + 1e-6)  # RMS_EPS (TorchScript)
        w1, w2 = self.w1.to(acc), self.w2.to(acc)
        if self.w1_scale != 1.0:
            w1 = w1 * self.w1_scale
            w2 = w2 * self.w2_scale
        dw = F.linear(F.gelu(F.linear(u, w1)), w2)
        return dw.view(x.size(0), x.size(1), self.streams, self.inputs) + self.bias.to(acc)

    def forward(self, outputs: List[Tensor]) -> List[Tensor]:
        """The S streams (T x B x C each, in :data:`STREAMS` order) from ``outputs`` = X_0..X_i, accumulated in
        fp32 and rounded once to the outputs' dtype (a mixed-dtype ``addcmul`` per term keeps the outputs
        themselves for the backward pass, not fp32 copies)."""
        x = outputs[-1]
        dw = self.coefficients(x)
        mixed: List[Tensor] = []
        for s in range(self.streams):
            first = outputs[0]
            w = dw[:, :, s, 0:1]
            if first.dtype == torch.float32 or first.dtype == torch.float64:
                y = first * w
                for j in range(1, self.inputs):
                    y = y + outputs[j] * dw[:, :, s, j:j + 1]
            else:
                y = torch.addcmul(torch.zeros_like(first, dtype=torch.float32), first, w)
                for j in range(1, self.inputs):
                    y = torch.addcmul(y, outputs[j], dw[:, :, s, j:j + 1])
            mixed.append(y.to(x.dtype))
        return mixed

    def extra_repr(self):
        return f"inputs={self.inputs}, streams={self.streams}, hidden={self.w1.shape[0]}"


class MuddStack(StackResidual):
    """The dynamic dense connections of one stack: ``connections.{i-1}`` after layer i.

    State: ``[r, q, k, v, (c,) X_0, ..., X_i]``: the residual stream the layers update (element 0: the next
    layer's X^r before a layer, its output X_{i+1} after it, which is the view), the attention's input streams
    (c: the cross-attention query, decoder with cross-attention only), then the stored outputs. After the last
    layer: ``[X^r]``.

    Args:
        stack, num_layers, embed_dim: as :class:`~fairseq_residual.residual.StackResidual`.
        streams: 4, or 5 in a decoder with cross-attention.
        round64: the reference's rounding of the hidden sizes.
        unit_weights: see :class:`DynamicDenseConnection`.
    """

    def __init__(self, stack: str, num_layers: int, embed_dim: int, streams: int = 4, round64: bool = True,
                 unit_weights: bool = False):
        super().__init__(stack, num_layers, embed_dim)
        self.num_streams = streams
        self.connections = nn.ModuleList(
            DynamicDenseConnection(i, embed_dim, 1 if i == num_layers else streams,
                                   hidden_size(i, streams, i == num_layers, round64), unit_weights)
            for i in range(1, num_layers + 1))

    def start(self, x: Tensor) -> List[Tensor]:
        return [x for _ in range(self.num_streams)] + [x]

    def between(self, index: int, state: List[Tensor]) -> List[Tensor]:
        outputs = state[self.num_streams:] + [state[0]]  # X_0 .. X_i, i = index + 1
        mixed: List[Tensor] = []
        for j, connection in enumerate(self.connections):
            if j == index:
                mixed = connection(outputs)
        if index == self.num_layers - 1:
            return mixed  # [X^r]
        streams = [mixed[3], mixed[0], mixed[1], mixed[2]]  # r, q, k, v
        if self.num_streams == 5:
            streams.append(mixed[4])  # c
        return streams + outputs

    @torch.jit.unused
    def coefficients(self, index: int, x: Tensor) -> Tensor:
        """The coefficients of the connection after layer ``index + 1`` for the newest output ``x`` (T x B x C):
        T x B x S x (i+1), streams in :data:`STREAMS` order (analysis, tests)."""
        return self.connections[index].coefficients(x)

    def extra_repr(self):
        return f"layers={self.num_layers}, streams={self.num_streams}"


class SelfAttentionResidual(SublayerResidual):
    """Pre-LN's residual of a self-attention over the streams: the branch reads X^q (normalised by the layer's
    ``self_attn_layer_norm``) and, from the second layer on, hands X^k and X^v to the attention in the context
    (``muddformer.key`` / ``muddformer.value``, which the attention takes out again: a layer returns an empty
    context); ``X^r = X^r + a`` and, with cross-attention, ``X^c = X^c + a``."""

    def __init__(self, site):
        super().__init__(site)
        self.first = site.layer == 0
        self.cross = site.per_layer == 3

    def prepare(self, state: List[Tensor], ctx: Dict[str, Tensor]) -> Tuple[Tensor, List[Tensor]]:
        if not self.first:
            ctx["muddformer.key"] = state[2]
            ctx["muddformer.value"] = state[3]
        return state[1], state

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        if self.cross:
            return [state[0] + out, state[1], state[2], state[3], state[4] + out] + state[5:]
        return [state[0] + out] + state[1:]


class CrossAttentionResidual(SublayerResidual):
    """The cross-attention's residual: the branch reads ``X^c + a`` (normalised by ``encoder_attn_layer_norm``),
    ``h = h + drop(CrossAttn(.))``."""

    def prepare(self, state: List[Tensor], ctx: Dict[str, Tensor]) -> Tuple[Tensor, List[Tensor]]:
        return state[4], state


class _MuddAttention:
    """The self-attention of both layers: queries the normalised branch input (X^q), keys ``LN_k(X^k)`` and
    values ``LN_v(X^v)`` from the context (from the second layer on; the first reads X_0 for all three)."""

    def _init_streams(self, residuals, embed_dim: int, export: bool):
        if residuals["self_attn"].first:
            self.k_layer_norm = None
            self.v_layer_norm = None
        else:
            self.k_layer_norm = LayerNorm(embed_dim, export=export)
            self.v_layer_norm = LayerNorm(embed_dim, export=export)
            # keys and values from their own inputs: fairseq's general path (projections of key / value)
            self.self_attn.self_attention = False

    def attend_self(
        self,
        x: Tensor,
        ctx: Dict[str, Tensor],
        key_padding_mask: Optional[Tensor],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
        attn_mask: Optional[Tensor],
    ) -> Tensor:
        """Self-attention with queries ``x`` (T x B x C, ``LN_q(X^q)``), keys ``LN_k(ctx['muddformer.key'])`` and
        values ``LN_v(ctx['muddformer.value'])`` (T x B x C each, removed from the context); ``x`` for all three in
        the first layer."""
        key = x
        value = x
        if self.k_layer_norm is not None:
            key = self.k_layer_norm(ctx.pop("muddformer.key"))
        if self.v_layer_norm is not None:
            value = self.v_layer_norm(ctx.pop("muddformer.value"))
        out, _ = self.self_attn(query=x, key=key, value=value, key_padding_mask=key_padding_mask,
                                incremental_state=incremental_state, need_weights=False, attn_mask=attn_mask)
        return out


class MuddEncoderLayer(_MuddAttention, ResidualEncoderLayer):
    """The protocol's encoder layer whose self-attention takes its queries, keys and values from the streams."""

    def __init__(self, cfg, residuals):
        super().__init__(cfg, residuals)
        self._init_streams(residuals, cfg.encoder.embed_dim, cfg.export)


class MuddDecoderLayer(_MuddAttention, ResidualDecoderLayer):
    """The protocol's decoder layer whose self-attention takes its queries, keys and values from the streams and
    whose cross-attention its query (keys and values: the encoder output)."""

    def __init__(self, cfg, residuals, no_encoder_attn=False, scheme=""):
        super().__init__(cfg, residuals, no_encoder_attn=no_encoder_attn, scheme=scheme)
        self._init_streams(residuals, cfg.decoder.embed_dim, cfg.export)


class MuddFormer(ResidualScheme):
    name = "muddformer"
    label = "MUDDFormer"
    scheme_id = 17
    color = "chartreuse"
    update = ("Pre-LN layers whose attention reads q, k, v and whose residual reads r from their own mixes of the "
              "earlier outputs: after layer i, X^s = sum_(j<=i) (b^s_ij + A^s_ij(X_i)) X_j per stream s, "
              "A = W2 GELU(W1 RMSNorm(X_i)) per position; h = X^r + drop(Attn(LN_q(X^q), LN_k(X^k), LN_v(X^v))), "
              "X_(i+1) = h + drop(FFN(LN(h)))")
    output = "LN_final(X^r_L), X^r_L = sum_j (b_Lj + A_Lj(X_L)) X_j"
    init = ("`W1` normal, std `C^(-1/2)`; `W2 = 0`; `b` one-hot 1 on the newest output (the Pre-LN model); "
            "`LN_k`, `LN_v` gamma 1, beta 0; W1, W2 stored as the reference (`--muddformer-unit-weights`: at unit "
            "scale behind `fan_in^(-1/2)`)")
    source = "Xiao et al. 2025 (MUDDFormer), arXiv 2502.12170, sec. 2, eq. 3-6"
    reference = ("Caiyun-AI/MUDDFormer `pytorch/muddformer/modeling_muddformer.py` (`MultiwayDynamicDenseBlock`, "
                 "`MUDDFormer.forward`; inference only), initialisation from its JAX `jax/MaxText/layers/llama2.py`; "
                 "LayerNorm where it has RMSNorm")
    reading = ("mixes per stack over its own layers' outputs; in the decoder a fifth stream c is the cross-attention "
               "query, LN(X^c + a) with a the layer's self-attention output (Pre-LN at initialisation); keys and "
               "values of cross-attention are the encoder output")
    recipe = ("the reference trains decoder-only LLaMA-like (MUDDFormer) and Pythia-like (MUDDPythia) models on "
              "the Pile with its JAX/MaxText code; no translation recipe. Decoding keeps nothing per token beyond "
              "fairseq's key/value cache (the mixes are per position, recomputed in each step).")
    fp16_advice = ("train in bf16 or fp32: its learned mix coefficients have no bound, and its encoder's stored outputs "
                   "grew past fp16's range in training (largest entry 4.3 million after 3,000 updates at 12+12, width "
                   "64, rate 4e-3; 146,000 after 1,000; one fp32 run each); short runs stay far below it, so a "
                   "checkpoint's running sums (fairseq-residual-analyze) say where a run stands, not where it ends")
    normalize_before = True
    layerdrop = False
    no_layerdrop_reason = "a dropped layer would shift the indices j of X_j and of the dense connections"
    OPTIONS = (
        Option("muddformer_round64", bool, True, "round the hidden size of each coefficient MLP, (i+1) S (times 4 "
               "after the last layer), up past a multiple of 64 as the reference (--muddformer-round64, the "
               "default), or keep the product (--muddformer-no-round64)", negative="--muddformer-no-round64"),
        Option("muddformer_unit_weights", bool, False, "store the coefficient MLPs' W1 and W2 as the reference "
               "(--muddformer-no-unit-weights, the default) or at unit scale behind constant multipliers "
               "fan_in^(-1/2) (--muddformer-unit-weights: the same function and initial function, but Adam's steps "
               "on W1, W2 are fan_in^(-1/2) times those on the reference's weights)",
               negative="--muddformer-no-unit-weights"),
    )

    def options(self, args):
        return MuddFormerOptions(round64=bool(args.muddformer_round64),
                                 unit_weights=bool(args.muddformer_unit_weights))

    def sublayer_residual(self, cfg, site):
        if site.kind == "self_attn":
            return SelfAttentionResidual(site)
        if site.kind == "encoder_attn":
            return CrossAttentionResidual(site)
        return SublayerResidual(site)

    def stack_residual(self, cfg, stack, num_layers, embed_dim):
        streams = 5 if stack == "decoder" and not cfg.no_cross_attention else 4
        return MuddStack(stack, num_layers, embed_dim, streams=streams,
                         round64=cfg.residual_options.params.round64,
                         unit_weights=cfg.residual_options.params.unit_weights)

    def encoder_layer(self, cfg, residuals):
        return MuddEncoderLayer(cfg, residuals)

    def decoder_layer(self, cfg, residuals, no_encoder_attn):
        return MuddDecoderLayer(cfg, residuals, no_encoder_attn=no_encoder_attn, scheme=self.name)

    def initialize(self, model, options):
        """Draw every W1 from N(0, 1/C) (fan-in scaling, the JAX code's; the stored w1 from N(0, 1) with
        ``--muddformer-unit-weights``), after fairseq's initialisation, so that fairseq's own weights are the same
        draws as Pre-LN's; W2 and b keep their construction (0, one-hot)."""
        for stack in (model.encoder, model.decoder):
            for connection in stack.residual.connections:
                with torch.no_grad():
                    connection.w1.normal_(0.0, connection.w1.shape[1] ** -0.5 / connection.w1_scale)


SCHEME = MuddFormer()

"""Attention Residuals (Kimi Team 2026, "Attention Residuals", arXiv 2603.15031: Full AttnRes, and Block AttnRes
with the pseudo-code the official README reproduces): every sub-layer reads a softmax-weighted average over depth of the outputs before it,
instead of their plain sum,

    v_0 = embedding output (after dropout),   v_i = drop(F_i(LN_i(h_i)))          T x B x C each
    h_l = sum_{i<l} alpha_{i->l} v_i,         alpha_{i->l} = softmax_i(w_l . RMSNorm_l(v_i))
    output: LN_final(h_{L+1})                 h_{L+1} the same average with its own w, RMSNorm over all v_i

for the sub-layers l = 1..L of a stack in order (self-attention, cross-attention, FFN are each a sub-layer),
with one learned pseudo-query w_l in R^C per sub-layer; the softmax runs, at every position on its own, over the
sources i (not over positions). ``RMSNorm_l(v) = g_l * v / sqrt(mean(v^2) + 1e-6)`` over the width C, with a
learned gain g_l per sub-layer: the official pseudo-code has one RMSNorm module per sub-layer (``attn_res_norm``,
``mlp_res_norm``) without showing its gain or eps; the gain is the re-implementations' (as w_l . (g_l * u) =
(w_l * g_l) . u it changes how the logits learn, not what they can express), the eps 1e-6 a choice. The branch is
Pre-LN's: the sub-layer's own fairseq LayerNorm normalises h_l before F.

**Block AttnRes** (``--attn-res-blocks N``, N >= 1): the stack's layers are split into N consecutive blocks
(layer j of L in block floor(j N / L): S = L / N layers each where N divides L, as the paper's, sizes that
differ by one otherwise). Inside a block the outputs add up into a partial block sum as a standard residual;
the sources of a sub-layer are the completed block sums b_0 = v_0 (the embedding is its own block), b_1, ...,
b_{n-1} and the current partial sum b_n^i (absent at a block's first sub-layer, whose sources are the
completed blocks only: the official pseudo-code's ``blocks.append(partial_block)`` after the first
sub-layer's average, its layers counted from 0). The output's average reads the completed blocks and the last partial sum.
``--attn-res-blocks 0`` (the default) is Full AttnRes: every sub-layer output is a source of its own.

As MoonshotAI/Attention-Residuals ``README.md`` (its PyTorch-style pseudo-code, ``block_attn_res`` and the
layer's ``forward``) computes it: ``V = stack(blocks + [partial])``, ``K = norm(V)``, logits
``w . K``, ``softmax`` over the sources, ``sum alpha V``; the average before self-attention first, then a
block boundary; the README shows no code for the stack's output. The output's own pseudo-query and RMSNorm
(``final_attn_res_proj`` / ``final_attn_res_norm``) followed by the final norm are what public
re-implementations of Kimi Linear with AttnRes do (the project's reading: the paper's model ends in a
final norm and a head; an average over all sources gives the head what the next sub-layer would get).

Initialisation: every pseudo-query w = 0 (a uniform average of the sources at the start: h_l = mean_i v_i) and
every gain g = 1. The zero query is what the re-implementations and the secondary descriptions of the paper
state ("zero-initialised so that the initial weights are uniform"); the primary text was not available to
check it. It is not Pre-LN at the start (a mean, not a sum); karpathy/nanochat PR 646 instead kept the
standard residual and added AttnRes as a zero-gated correction, which is not this scheme.

Computation (``aggregate``): the logit of source v is ``rsqrt(mean(v^2) + eps) * (v . (g * w))``, the same
number as ``w . RMSNorm(v)`` without materialising the normalised sources; the sources are not stacked, so in
fp32 autograd keeps the outputs themselves, not (sources x T x B x C) copies per sub-layer. Norms, logits and
the softmax are computed in fp32, the average accumulated in fp32 and rounded once to the model's dtype; in
bf16 / fp16 the logits read an fp32 copy of each source, which autograd keeps: n fp32 vectors per position
for a sub-layer with n sources (Full: O(L^2) per stack, Block: at most N + 1 per sub-layer), the price of
fp32 coefficients. Parameters:
``layers.i.{self_attn,encoder_attn,ffn}_residual.{query,key_gain}`` and ``{encoder,decoder}.residual.{query,
key_gain}`` (2C per sub-layer plus 2C per stack), in fairseq's weight-decay group like every parameter; the
stack's first sub-layer has none: its only source is v_0, which it reads as it is (softmax over one source).

Encoder-decoder (the project's reading; the paper and the code are decoder-only language models):

* per stack: the encoder averages over its own sources (v_0 its source embedding), the decoder over its own
  (v_0 the target embedding); no source crosses stacks;
* the decoder's cross-attention is one more sub-layer, hence one more source: v = drop(CrossAttn(LN(h_l),
  memory)) with its own w_l, g_l; its keys and values (the memory) are the encoder's output LN_final(h_{N+1}),
  the same for every decoder layer (as Pre-LN's), not an average of the encoder's sources;
* blocks count layers, not sub-layers (a decoder layer's three outputs belong to one block), so a block of S
  layers holds 2S encoder or 3S decoder sub-layer outputs.

Incremental decoding: the average mixes outputs of one position only, never of other positions, so a decoding
step recomputes all of its own position's sources in that step: nothing persists between steps beyond
fairseq's attention keys and values (0 extra floats per decoded token and hypothesis), and beam reordering has
nothing more to reorder. Within a step the working set is, per hypothesis and C floats each, the sources of
the decoder: 1 + 3M (Full) or at most N + 1 (Block: N - 1 completed block sums, the embedding's and the
partial sum). A full forward (training) keeps for autograd the sources, which the branches' own activations
hold anyway, plus (sources) scalars per position and sub-layer.

fairseq's layer-drop and ``--*-layers-to-keep`` are refused: a dropped layer would remove sources and shift
the block boundaries and the pseudo-queries' sources.
"""
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch
from torch import Tensor, nn

from ..residual import SublayerResidual, StackResidual
from .base import Option, OptionError, ResidualScheme, STACKS, stack_depth

#: eps of the RMSNorm of the keys
KEY_EPS = 1e-6


@dataclass(frozen=True)
class AttnResOptions:
    """Attributes: blocks: N, the number of blocks per stack; 0 for Full AttnRes."""

    blocks: int = 0


def block_of(layer: int, num_layers: int, blocks: int) -> int:
    """The block (0-based) of layer ``layer`` (0-based) in a stack of ``num_layers`` split into ``blocks``:
    ``floor(layer * blocks / num_layers)``, i.e. ``layer // S`` when S = L / N is an integer."""
    return layer * blocks // num_layers


def starts_block(layer: int, num_layers: int, blocks: int) -> bool:
    """True when layer ``layer`` is the first of its block (every layer's first sub-layer reads the completed
    blocks only, and its output starts a new partial sum)."""
    return layer == 0 or block_of(layer, num_layers, blocks) != block_of(layer - 1, num_layers, blocks)


def aggregate(sources: List[Tensor], query: Tensor, gain: Tensor, eps: float) -> Tensor:
    """``sum_i softmax_i(w . RMSNorm(v_i)) v_i`` over ``sources`` (each T x B x C), ``RMSNorm(v) = g * v /
    sqrt(mean(v^2) + eps)``, ``query`` w and ``gain`` g of size C. Logits and softmax in fp32; the sum
    accumulated in fp32 and returned in the sources' dtype, T x B x C."""
    if len(sources) == 1:
        return sources[0]
    first = sources[0]
    acc = torch.promote_types(first.dtype, torch.float32)  # fp32, or fp64 for fp64 sources
    q = query.to(acc) * gain.to(acc)
    logits: List[Tensor] = []
    for v in sources:
        vf = v.to(acc)  # the source itself in fp32 training; a copy in bf16 / fp16
        logits.append(torch.matmul(vf, q) * torch.rsqrt(vf.pow(2).mean(-1) + eps))  # T x B
    alpha = torch.softmax(torch.stack(logits, dim=0), dim=0).unsqueeze(-1)  # n x T x B x 1
    if first.dtype == acc:
        h = first * alpha[0]
    else:
        h = torch.addcmul(torch.zeros_like(first, dtype=acc), first, alpha[0])
    for i in range(1, len(sources)):
        h = torch.addcmul(h, sources[i], alpha[i])
    return h.to(first.dtype)


def sources_of(state: List[Tensor]) -> List[Tensor]:
    """The sources in order, from the state ``[partial, b_0, ..., b_{n-1}]``: ``[b_0, ..., b_{n-1}, partial]``."""
    return state[1:] + [state[0]]


class AttnResResidual(SublayerResidual):
    """One sub-layer's AttnRes: its input is the average of the sources, its output joins them.

    State: ``[p, b_0, ..., b_{n-1}]``: p the newest source (Full: the last sub-layer's output; Block: the
    current partial block sum; at the stack's start, the embedding output), then the completed sources in order.

    Args:
        site: the sub-layer (:class:`~fairseq_residual.residual.Site`).
        starts: True when the sub-layer's output starts a new source (every sub-layer in Full AttnRes, a block's
            first sub-layer in Block AttnRes): p joins the completed sources and the output becomes the new p;
            else the output is added to p.
    """

    def __init__(self, site, starts: bool):
        super().__init__(site)
        self.starts = bool(starts)
        self.eps = KEY_EPS
        self.query = nn.Parameter(torch.zeros(site.embed_dim))
        self.key_gain = nn.Parameter(torch.ones(site.embed_dim))

    def prepare(self, state: List[Tensor], ctx: Dict[str, Tensor]) -> Tuple[Tensor, List[Tensor]]:
        return aggregate(sources_of(state), self.query, self.key_gain, self.eps), state

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        if self.starts:
            return [out] + sources_of(state)
        return [state[0] + out] + state[1:]

    def extra_repr(self):
        return super().extra_repr() + f", starts_source={self.starts}"


class FirstAttnResResidual(SublayerResidual):
    """The stack's first sub-layer: its only source is v_0 (a softmax over one source is 1), so it reads the
    embedding output as it is and has no pseudo-query or gain (they would get no gradient); its output starts
    the next source."""

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        return [out] + sources_of(state)


class AttnResStack(StackResidual):
    """The stack's side of AttnRes: the state starts as ``[v_0]``; the output is LN_final of the average of all
    sources with the stack's own ``query`` and ``key_gain``.

    Args:
        stack, num_layers, embed_dim: as :class:`~fairseq_residual.residual.StackResidual`.
        blocks: N (0: Full AttnRes), for :meth:`extra_repr`.
    """

    def __init__(self, stack: str, num_layers: int, embed_dim: int, blocks: int = 0):
        super().__init__(stack, num_layers, embed_dim)
        self.blocks = blocks
        self.eps = KEY_EPS
        self.query = nn.Parameter(torch.zeros(embed_dim))
        self.key_gain = nn.Parameter(torch.ones(embed_dim))

    def final_input(self, state: List[Tensor]) -> Tensor:
        return aggregate(sources_of(state), self.query, self.key_gain, self.eps)

    def view(self, state: List[Tensor]) -> Tensor:
        """The uniform average of the sources after a layer (what a sub-layer with w = 0 would read),
        T x B x C, summed in fp32 and rounded once."""
        acc = torch.promote_types(state[0].dtype, torch.float32)
        h = state[0].to(acc)
        for s in state[1:]:
            h = h + s.to(acc)
        return (h / float(len(state))).to(state[0].dtype)

    def extra_repr(self):
        return f"layers={self.num_layers}, " + (f"blocks={self.blocks}" if self.blocks else "full")


class AttnRes(ResidualScheme):
    name = "attn_res"
    label = "AttnRes"
    scheme_id = 18
    color = "deepskyblue"
    update = ("h_l = sum_(i<l) alpha_(i->l) v_i, alpha = softmax_i(w_l . RMSNorm_l(v_i)) over v_0 = embedding and "
              "the earlier sub-layers' outputs v_i = drop(F_i(LN(h_i))); Block (N blocks): the sources are the "
              "completed block sums and the current partial sum")
    output = "LN_final(sum_i alpha_i v_i), with the stack's own w and RMSNorm"
    init = ("pseudo-queries `w = 0` (uniform average of the sources), RMSNorm gains 1; the zero query from "
            "re-implementations and secondary accounts of the paper, not checked in its text")
    source = "Kimi Team 2026, arXiv 2603.15031 (Full AttnRes; Block AttnRes, its pseudo-code as the README gives it)"
    reference = ("MoonshotAI/Attention-Residuals `README.md` (`block_attn_res` and the layer's `forward`; no code "
                 "for the stack's output, whose own query and RMSNorm follow public re-implementations)")
    reading = ("per stack, each over its own sources (v_0 its embedding); cross-attention is one more sub-layer and "
               "source, with keys and values the encoder output LN_final(h_(N+1)); blocks count layers (a "
               "decoder layer's three outputs share a block)")
    recipe = ("Kimi Linear (48B total, 3B active MoE) on 1.4T tokens and scaling-law runs of decoder-only "
              "language models; Block AttnRes with about 8 blocks (the official README); no translation recipe. Position-wise over depth: decoding keeps nothing "
              "beyond fairseq's key/value cache (a step recomputes its position's sources: 1 + 3M, or at most "
              "N + 1, vectors of width C per hypothesis).")
    fp16_advice = ("its averages are bounded by the largest source, but a Block's partial sums grow inside the "
                   "block as Pre-LN's stream (Full: no sums); logits and sums in fp32; measure a checkpoint")
    normalize_before = True
    layerdrop = False
    no_layerdrop_reason = ("a dropped layer would remove sources and shift the block boundaries and the "
                           "pseudo-queries' sources")
    OPTIONS = (
        Option("attn_res_blocks", int, 0, "N, the number of blocks per stack (Block AttnRes: each stack's layers "
               "split into N consecutive blocks, summed inside a block, averaged across blocks; at most the depth "
               "of either stack); 0 for Full AttnRes (every sub-layer output a source)", low=0, high=64,
               metavar="N"),
    )

    def options(self, args):
        return AttnResOptions(blocks=int(args.attn_res_blocks))

    def check_args(self, args):
        """The base refusals (layer-drop), and a block count larger than a stack's depth.

        Raises:
            ValueError: naming the flag, the stack's depth and the fix.
        """
        super().check_args(args)
        blocks = getattr(args, "attn_res_blocks", None)
        if not blocks:
            return
        for stack in STACKS:
            depth = stack_depth(args, stack)
            if depth is not None and int(blocks) > int(depth):
                raise OptionError(
                    f"--attn-res-blocks {blocks} is larger than --{stack}-layers {depth}: a block needs at least "
                    f"one layer; use --attn-res-blocks {depth} or less, or 0 for Full AttnRes"
                )

    def sublayer_residual(self, cfg, site):
        if site.index == 0:
            return FirstAttnResResidual(site)
        blocks = cfg.residual_options.params.blocks
        starts = blocks == 0 or (site.kind == "self_attn" and starts_block(site.layer, site.layers, blocks))
        return AttnResResidual(site, starts)

    def stack_residual(self, cfg, stack, num_layers, embed_dim):
        return AttnResStack(stack, num_layers, embed_dim, blocks=cfg.residual_options.params.blocks)


SCHEME = AttnRes()

"""DenseFormer (Pagliardini, Mohtashami, Fleuret, Jaggi 2024, "DenseFormer: Enhancing Information Flow in
Transformers via Depth Weighted Averaging", arXiv 2402.02622, NeurIPS 2024, section 3): a depth-weighted
average (DWA) of the embedding output and every earlier layer output after each layer of a stack,

    X_0 = embedding output (after dropout),   Y_0 = X_0                      T x B x C each
    X_i = B_i(Y_{i-1})                        B_i: a Pre-LN layer, x = x + drop(F(LN(x))) per sub-layer
    Y_i = sum_{j in J(i)} alpha_{i,j} X_j     if i = 0 (mod p)        J(i) = {j : 0 <= j <= i, j = i (mod k)}
    Y_i = X_i                                 otherwise
    output: LN_final(Y_L)

for i = 1..L, with dilation k (``--denseformer-dilation``) and period p (``--denseformer-period``): the
paper's "k x p-DenseFormer" (section 3.2); 1 x 1, the default, is the dense DWA ``Y_i = sum_{j<=i}
alpha_{i,j} X_j``. alpha_{i,j} are learned scalars, initialised to the identity (alpha_{i,i} = 1, the others
0), so that a new model is the Pre-LN Transformer it builds on. A layer that has no DWA after it still
stores its output X_i, which later averages of its residue class read.

As epfml/DenseFormer computes it (``denseformer/denseformer.py``, ``DWAModules``): one weight vector per DWA
of length ``floor(i/k) + 1``, ordered by increasing j (its last entry, on X_i, set to 1 by ``_init_weights``),
applied to the stored outputs of i's residue class mod k. Its experiments' model
(``experiments/models/denseformer.py``, ``increase_T_every``) runs the same loop over groups of p blocks and
stores only each group's output; for p > 1 the package, and the paper's ``Y_i = X_i`` for i not a multiple of
p, store every output, which is what is computed here. The vectors are concatenated in the order of i into
one parameter per stack, ``{encoder,decoder}.residual.alpha``: at k = p = 1, L(L+3)/2 scalars (27 at L = 6).
The reference's global re-initialisation caveat does not arise: fairseq initialises ``nn.Linear`` /
``nn.Embedding`` modules, and alpha is neither. Like the reference (its DWA weights are ``nn.Linear``
weights, in the weight-decay group), alpha takes fairseq's ``--weight-decay`` like every other parameter.
The average is accumulated in fp32 and rounded once to the model's dtype, as a reduced-precision
``tensordot`` (the reference's) accumulates, and autograd keeps the layer outputs, not copies (the
reference's in-place accumulators serve the same end).

Encoder-decoder (the project's reading; the paper and its code are decoder-only language models):

* DWA per stack: the encoder averages its own X_0..X_N (X_0 the source embedding), the decoder its own
  X_0..X_M (the target embedding), each with its own alpha; nothing mixes the two stacks.
* Cross-attention is a sub-layer of the decoder block B_i, as in the Pre-LN layer DenseFormer builds on: its
  queries come from the block's own stream (Y_{i-1} plus the self-attention branch), its keys and values
  from the encoder output LN_final(Y_N), the same memory for every decoder layer, not a DWA of the encoder's
  layers (the DWA chooses a block's input; cross-attention's memory is not one).

Incremental decoding: a DWA mixes the outputs of different layers at one position, never different
positions, so a decoding step computes X_0..X_M of its own position in that step (as DLCL's history): no
cache beyond fairseq's attention keys and values persists between steps (0 floats per decoded token), and
beam reordering has nothing more to reorder. The step's working set is (M+1) x C floats per hypothesis,
freed after the step. A full forward (training) keeps the L+1 outputs, (L+1) x T x B x C per stack, for the
averages and their gradients, as the reference's accumulators do.

fairseq's layer-drop is refused: a dropped layer would shift the indices j of X_j and alpha_{i,j}.
"""
from dataclasses import dataclass
from typing import List

import torch
from torch import Tensor, nn

from ..residual import StackResidual
from .base import Option, OptionError, ResidualScheme, STACKS, stack_depth


@dataclass(frozen=True)
class DenseFormerOptions:
    """Attributes: dilation: k, a DWA after layer i reads X_j for j = i (mod k); period: p, a DWA follows
    every p-th layer only."""

    dilation: int = 1
    period: int = 1


def dwa_layout(num_layers: int, dilation: int, period: int) -> List[int]:
    """Where each layer's DWA weights start in the stack's alpha vector: entry i-1 for layer i = 1..L, -1 where
    no DWA follows layer i (i not a multiple of the period); the weights of layer i's DWA are the next
    ``i // dilation + 1`` entries, for j = i mod k, i mod k + k, ..., i."""
    offsets, n = [], 0
    for i in range(1, num_layers + 1):
        if i % period == 0:
            offsets.append(n)
            n += i // dilation + 1
        else:
            offsets.append(-1)
    return offsets


def identity_alpha(num_layers: int, dilation: int, period: int) -> Tensor:
    """The flat alpha of a new stack: 1 on each DWA's own layer (alpha_{i,i}, the last of its entries), 0
    elsewhere."""
    offsets = dwa_layout(num_layers, dilation, period)
    size = sum(i // dilation + 1 for i in range(1, num_layers + 1) if i % period == 0)
    alpha = torch.zeros(size)
    for i, o in enumerate(offsets, start=1):
        if o >= 0:
            alpha[o + i // dilation] = 1.0
    return alpha


class DenseFormerStack(StackResidual):
    """The DWAs of one stack: ``alpha``, one flat vector (:func:`dwa_layout`).

    State: ``[x, X_0, ..., X_i]``: element 0 the stream the layers update (the next layer's input Y_i
    before a layer, its output X_{i+1} after it, which is the view), then the stored outputs.

    Args:
        stack, num_layers, embed_dim: as :class:`~fairseq_residual.residual.StackResidual`.
        dilation, period: k and p.
    """

    def __init__(self, stack: str, num_layers: int, embed_dim: int, dilation: int = 1, period: int = 1):
        super().__init__(stack, num_layers, embed_dim)
        self.dilation = dilation
        self.period = period
        self.offsets: List[int] = dwa_layout(num_layers, dilation, period)
        self.alpha = nn.Parameter(identity_alpha(num_layers, dilation, period))

    def start(self, x: Tensor) -> List[Tensor]:
        return [x, x]

    def average(self, i: int, outputs: List[Tensor]) -> Tensor:
        """``Y_i = sum_{j in J(i)} alpha_{i,j} X_j`` (T x B x C) over ``outputs`` = X_0..X_i, accumulated in
        fp32 and rounded once to the outputs' dtype. In bf16 / fp16 each term is a mixed-dtype ``addcmul`` into
        the fp32 sum, so that autograd keeps the outputs themselves for the backward pass, not fp32 copies of
        them (which would cost O(L^2) activations per stack)."""
        o = self.offsets[i - 1]
        g = i % self.dilation
        alpha = self.alpha.float()
        first = outputs[g]
        if first.dtype == torch.float32:
            y = first * alpha[o]
        else:
            y = torch.addcmul(torch.zeros_like(first, dtype=torch.float32), first, alpha[o])
        for m in range(1, i // self.dilation + 1):
            y = torch.addcmul(y, outputs[g + m * self.dilation], alpha[o + m])
        return y.to(outputs[i].dtype)

    def between(self, index: int, state: List[Tensor]) -> List[Tensor]:
        outputs = state[1:] + [state[0]]  # X_0 .. X_i, i = index + 1
        i = index + 1
        if self.offsets[index] < 0:
            return [state[0]] + outputs
        return [self.average(i, outputs)] + outputs

    @torch.jit.unused
    def weights(self) -> Tensor:
        """alpha as the paper's (L+1) x (L+1) matrix, row i = the DWA after layer i (row 0: Y_0 = X_0), 0 where
        the DWA reads nothing (j > i, j != i mod k) and rows without a DWA the identity's."""
        L = self.num_layers
        w = torch.eye(L + 1, device=self.alpha.device, dtype=self.alpha.dtype)
        for i in range(1, L + 1):
            o = self.offsets[i - 1]
            if o >= 0:
                w[i].zero_()
                js = list(range(i % self.dilation, i + 1, self.dilation))
                w[i, js] = self.alpha.detach()[o:o + len(js)]
        return w

    def extra_repr(self):
        return f"layers={self.num_layers}, dilation={self.dilation}, period={self.period}, alphas={self.alpha.numel()}"


class DenseFormer(ResidualScheme):
    name = "denseformer"
    label = "DenseFormer"
    scheme_id = 16
    color = "springgreen"
    update = ("Pre-LN layers X_i = B_i(Y_(i-1)); after layer i: Y_i = sum_(j<=i, j=i mod k) alpha_ij X_j "
              "(X_0 = embedding) where p divides i, else Y_i = X_i")
    output = "LN_final(Y_L)"
    init = "`alpha_ii = 1`, other `alpha_ij = 0` (the Pre-LN model), learned"
    source = "Pagliardini et al. 2024, arXiv 2402.02622, sec. 3 (DWA), sec. 3.2 (dilation k, period p)"
    reference = "epfml/DenseFormer `denseformer/denseformer.py` (`DWAModules`), `experiments/models/denseformer.py`"
    reading = ("a DWA per stack over its own layers' outputs (X_0 = that stack's embedding); cross-attention is a "
               "sub-layer of each decoder block and reads the encoder output LN_final(Y_N), not a DWA of the "
               "encoder's layers")
    recipe = ("the reference's defaults (`config/base.py`), language modelling on OpenWebText2 / PG-19: AdamW "
              "(0.9, 0.95), lr 2e-3, 2% warm-up, cosine decay, weight decay 1e-3 (the DWA weights included), "
              "dropout 0.2, bf16, 24 blocks. No translation results.")
    fp16_advice = ("as Pre-LN: its averages mix unnormalised layer outputs (accumulated in fp32, rounded once); "
                   "measure a checkpoint, and train in bf16 where the peak nears a tenth of 65,504")
    normalize_before = True
    layerdrop = False
    no_layerdrop_reason = "a dropped layer would shift the indices j of X_j and alpha_ij"
    OPTIONS = (
        Option("denseformer_dilation", int, 1, "dilation k: the average after layer i reads the outputs X_j with "
               "j = i (mod k) only (at most the depth of either stack)", low=1, high=64, metavar="K"),
        Option("denseformer_period", int, 1, "period p: an average follows every p-th layer only, the others "
               "pass their output on (at most the depth of either stack)", low=1, high=64, metavar="P"),
    )

    def options(self, args):
        return DenseFormerOptions(dilation=int(args.denseformer_dilation), period=int(args.denseformer_period))

    def check_args(self, args):
        """The base refusals, and a dilation or period larger than a stack's depth.

        Raises:
            ValueError: naming the flag, the stack's depth and the fix.
        """
        super().check_args(args)
        for stack in STACKS:
            depth = stack_depth(args, stack)
            if depth is None:
                continue
            for dest, what in (("denseformer_period", "no layer of the {stack} would be followed by an average"),
                               ("denseformer_dilation", "every average of the {stack} would read its own layer's "
                                                        "output only")):
                value = getattr(args, dest, None)
                if value is not None and int(value) > int(depth):
                    flag = "--" + dest.replace("_", "-")
                    raise OptionError(
                        f"{flag} {value} is larger than --{stack}-layers {depth}: {what.format(stack=stack)}; "
                        f"use {flag} {depth} or less"
                    )

    def stack_residual(self, cfg, stack, num_layers, embed_dim):
        opts = cfg.residual_options.params
        return DenseFormerStack(stack, num_layers, embed_dim, dilation=opts.dilation, period=opts.period)


SCHEME = DenseFormer()

"""LAuReL, the learned augmented residual layer (Menghani, Kumar, Kumar 2025, "LAuReL: Learned Augmented Residual
Layer", ICML 2025, arXiv 2411.07501), on Pre-LN. The paper replaces the residual connection
``x_{i+1} = f(x_i) + x_i`` (eq. 1) by its general form (sec. 2, eq. 2)

    x_{i+1} = alpha f(x_i) + g(x_i, x_{i-1}, ..., x_0)

with ``alpha`` a learned scalar, ``g`` a learned linear function and ``x_j`` the output of the j-th residual
connection. Here ``f`` is a Pre-LN sub-layer's branch ``drop(F(LN(x)))``, ``x_i`` the stream a sub-layer reads
and every stream T x B x C. ``--laurel-variant``:

``rw`` (LAuReL-RW, sec. 2.1): ``g = beta x_i``, ``x_{i+1} = alpha f(x_i) + beta x_i``. The paper: "we cannot let
alpha and beta grow unbounded, and using a normalization function such as softmax or sigmoid helps". Here

    (alpha, beta) = softmax(w)                       w = (w_alpha, w_beta), two learned logits per sub-layer
    x = alpha drop(F(LN(x))) + beta x

``lr`` (LAuReL-LR, sec. 2.2, eq. 3): ``alpha = 1``, ``g = W x_i`` with ``W = I + B A`` of rank r (``--laurel-rank``),

    x = drop(F(LN(x))) + x + B (A x)                 A r x C, B C x r (A: C -> r, B: r -> C, as eq. 3 applies them)

``pa`` (LAuReL-PA, sec. 2.3, eq. 4): ``alpha = 1`` (footnote 1), k earlier activations (``--laurel-activations``),
``h_i`` "a low-rank product similar to the LAuReL-LR version" (the paper's practice), ``gamma_{i,j}`` learned scalars,

    x_{i+1} = f(x_i) + x_i + sum_{j=0..k-1} gamma_{i,j} h_i(x_{i-j}),     h_i(v) = B_i (A_i v)

computed as ``B_i (A_i sum_j gamma_{i,j} x_{i-j})`` (h_i is linear), the sum over the ``x_{i-j}`` that exist
(``i - j >= 0``). The stack output is Pre-LN's, ``LN_final(x)``.

Choices the paper leaves open, and why:

* Where: at every sub-layer's residual connection (self-attention, cross-attention, FFN, both stacks), each with its
  own parameters. The paper replaces "the regular residual connection"; a Transformer layer has one per sub-layer,
  each Pre-LN's ``x = x + f(x)`` (eq. 1). So ``i`` counts sub-layers within a stack: ``x_0`` is the stack's
  embedding output, ``x_i`` the stream that sub-layer i (0-based, all kinds in order) reads. Encoder-decoder: each
  stack keeps its own activations; cross-attention is a sub-layer like the others (``f`` reads the encoder output,
  ``x`` is the decoder's stream).
* Initialisation. RW: ``w = 0``, so ``alpha = beta = 1/2`` (softmax: the paper names it first; a symmetric start).
  LR and PA: ``B = 0`` and ``A`` the paper's "column orthogonal" initialisation for its LLMs (sec. 3.3, footnote 2,
  ``A_{i,j} = 1/sqrt(rD)`` if ``i mod r = j``, 0 otherwise, for its D x r ``A``; here its transpose), so both start
  as Pre-LN and draw no random number (the model's other parameters get Pre-LN's draws for the same seed).
  PA: ``gamma_{i,j} = 1`` (not given by the paper; with ``B = 0`` the term starts at zero whatever gamma is, and
  nonzero gammas let ``B`` get a gradient from every earlier activation at the first update).
* Defaults: r = 32 and k = 3, the paper's ablation (sec. 4.3); its LLMs used r in {32, 48, 64} (sec. 3.3).

Parameters (under ``layers.i.<sub-layer>_residual.``): RW ``w`` (2); LR ``A`` (r x C), ``B`` (C x r); PA ``A``,
``B`` and ``gamma`` (k): 2 r C + k per sub-layer (the paper's count).

Cost: RW two multiplications per element; LR ``4 r C`` multiply-adds per position and sub-layer; PA the same plus
k scaled additions. All are position-wise: incremental decoding computes a step's position as the full forward
pass does. PA's earlier activations are those of the same position at earlier sub-layers of the same step, which
the step computes anyway: per generated token it holds at most k - 1 earlier C-vectors per stack while the step
runs (the paper's Theta(kD), sec. 4.2) and keeps nothing across steps beyond fairseq's key/value cache. They travel
in the protocol's context (``ctx['laurel.x1']`` .. ``ctx['laurel.x{k-1}']``, ``x_{i-1}`` .. ``x_{i-k+1}``); they are
the stream tensors themselves, not copies, so training keeps no more than Pre-LN beyond the r-wide products.
"""
import math
from dataclasses import dataclass
from typing import Dict, List

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..residual import SublayerResidual, with_main
from .base import Option, ResidualScheme
from ..user_errors import SettingError

VARIANTS = ("rw", "lr", "pa")


@dataclass(frozen=True)
class LaurelOptions:
    """Attributes: variant: ``rw``, ``lr`` or ``pa``; rank: r of ``B A`` (``lr``, ``pa``); activations: k (``pa``)."""

    variant: str = "rw"
    rank: int = 32
    activations: int = 3


class LaurelRWResidual(SublayerResidual):
    """LAuReL-RW (sec. 2.1): ``x = alpha h + beta x``, ``(alpha, beta) = softmax(w)``, ``h = drop(F(LN(x)))``; state
    ``[x]`` (T x B x C); ``w`` two learned logits, 0 at init."""

    def __init__(self, site):
        super().__init__(site)
        self.w = nn.Parameter(torch.zeros(2))

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        weights = torch.softmax(self.w.float(), dim=0).to(out.dtype)  # the coefficients in fp32 under fp16 / bf16
        return with_main(state, weights[0] * out + weights[1] * state[0])


def column_orthogonal(rank: int, width: int) -> Tensor:
    """The paper's initialisation of A (sec. 3.3, footnote 2), as the r x C matrix applied here:
    ``A[j, i] = 1 / sqrt(r C)`` if ``i mod r = j``, else 0."""
    a = torch.zeros(rank, width)
    i = torch.arange(width)
    a[i % rank, i] = 1.0 / math.sqrt(rank * width)
    return a


class LaurelLRResidual(SublayerResidual):
    """LAuReL-LR (sec. 2.2, eq. 3): ``x = h + x + B (A x)``, ``h = drop(F(LN(x)))``; state ``[x]`` (T x B x C);
    ``A`` (r x C) column-orthogonal and ``B`` (C x r) zero at init.

    Args:
        site: the sub-layer (its width C).
        rank: r.
    """

    def __init__(self, site, rank: int):
        super().__init__(site)
        self.A = nn.Parameter(column_orthogonal(rank, site.embed_dim))
        self.B = nn.Parameter(torch.zeros(site.embed_dim, rank))

    def low_rank(self, v: Tensor) -> Tensor:
        """``B (A v)``, T x B x C."""
        return F.linear(F.linear(v, self.A), self.B)

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        x = state[0]
        return with_main(state, out + x + self.low_rank(x))

    def extra_repr(self):
        return super().extra_repr() + f", rank={self.A.shape[0]}"


class LaurelPAResidual(LaurelLRResidual):
    """LAuReL-PA (sec. 2.3, eq. 4): ``x_{i+1} = h + x_i + B (A sum_j gamma_j x_{i-j})``, j = 0..k-1 over the earlier
    streams that exist, read from the context (``ctx['laurel.x<j>']`` = ``x_{i-j}``, T x B x C), which it then
    shifts by one with ``x_i`` first; ``gamma`` (k) 1 at init.

    Args:
        site: the sub-layer (its width C).
        rank: r.
        activations: k.
    """

    def __init__(self, site, rank: int, activations: int):
        super().__init__(site, rank)
        self.activations = activations
        self.gamma = nn.Parameter(torch.ones(activations))

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        x = state[0]
        mixed = self.gamma[0] * x
        for j in range(1, self.activations):
            key = "laurel.x" + str(j)
            if key in ctx:
                mixed = mixed + self.gamma[j] * ctx[key]
        for j in range(self.activations - 1, 1, -1):  # x_{i-j+1} becomes the next sub-layer's x_{i+1-j}
            previous = "laurel.x" + str(j - 1)
            if previous in ctx:
                ctx["laurel.x" + str(j)] = ctx[previous]
        if self.activations > 1:
            ctx["laurel.x1"] = x
        return with_main(state, out + x + self.low_rank(mixed))

    def extra_repr(self):
        return super().extra_repr() + f", activations={self.activations}"


class Laurel(ResidualScheme):
    name = "laurel"
    label = "LAuReL"
    scheme_id = 21
    color = "darkgoldenrod"
    update = ("every sub-layer's residual x_{i+1} = alpha drop(F(LN(x_i))) + g(x_i, ..., x_0): RW (alpha, beta) = "
              "softmax(w), g = beta x_i; LR alpha = 1, g = x_i + B A x_i (A r x C, B C x r); PA alpha = 1, "
              "g = x_i + B A sum_{j<k} gamma_j x_{i-j} (i counts the stack's sub-layers)")
    output = "LN_final(x)"
    init = ("RW `w = 0` (`alpha = beta = 1/2`); LR, PA `B = 0`, `A` the paper's column-orthogonal "
            "`1/sqrt(rC)` pattern, PA `gamma = 1` (LR and PA start as Pre-LN)")
    source = ("Menghani et al. 2025 (LAuReL), arXiv 2411.07501, sec. 2: eq. 2, sec. 2.1 (RW), eq. 3 (LR), eq. 4 "
              "(PA); initialisation sec. 3.3, footnote 2")
    reference = "no code released with the paper; the paper's equations"
    reading = ("applied at every sub-layer's residual connection (cross-attention included), each with its own "
               "parameters; PA's activations are the stream at the stack's earlier sub-layers")
    recipe = ("the paper trains ResNet-50 on ImageNet-1K and 1B / 4B decoder-only language models (r = 4, 64 with "
              "RW+LR); its ablation (sec. 4.3) uses r = 32, k = 3 and recommends trying RW, then LR, then PA; no "
              "translation recipe. All variants are position-wise: decoding keeps nothing beyond fairseq's "
              "key/value cache.")
    fp16_advice = ("as Pre-LN, with learned stream weights (LR's and PA's B A) that can grow the stream further: "
                   "measure a checkpoint, and train in bf16 where the peak nears a tenth of 65,504")
    normalize_before = True
    OPTIONS = (
        Option("laurel_variant", str, "rw", "which LAuReL: rw (x = alpha F + beta x, (alpha, beta) a softmax), lr "
               "(x = F + x + B A x, rank --laurel-rank) or pa (x = F + x + B A sum_j gamma_j x_{i-j} over "
               "--laurel-activations earlier streams)", choices=VARIANTS, metavar="VARIANT"),
        Option("laurel_rank", int, 32, "the rank r of B A (A r x C, B C x r; at most the model width C) for "
               "--laurel-variant lr and pa", low=1, metavar="R"),
        Option("laurel_activations", int, 3, "k, the number of activations LAuReL-PA mixes, x_i and the k - 1 "
               "streams before it", low=1, high=64, metavar="K"),
    )

    def options(self, args):
        return LaurelOptions(variant=str(args.laurel_variant), rank=int(args.laurel_rank),
                             activations=int(args.laurel_activations))

    def check_args(self, args) -> None:
        super().check_args(args)
        if getattr(args, "laurel_variant", "rw") == "rw":
            return
        rank = getattr(args, "laurel_rank", None) or 32
        for stack in ("encoder", "decoder"):
            width = getattr(args, f"{stack}_embed_dim", None)
            if width is not None and rank > width:
                raise SettingError(
                    f"--laurel-rank (model.laurel_rank) must be at most the model width for --residual-scheme "
                    f"laurel, got {rank} > --{stack}-embed-dim {width}: B A would not be low rank; use a smaller "
                    f"--laurel-rank")

    def sublayer_residual(self, cfg, site):
        params = cfg.residual_options.params
        if params.variant == "lr":
            return LaurelLRResidual(site, params.rank)
        if params.variant == "pa":
            return LaurelPAResidual(site, params.rank, params.activations)
        return LaurelRWResidual(site)


SCHEME = Laurel()

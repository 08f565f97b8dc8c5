"""Manifold-constrained hyper-connections (mHC; DeepSeek-AI, arXiv 2512.24880, eq. 3 and 7-9): hyper-connections
whose stream-mixing matrix is kept doubly stochastic, so that the product of many layers' mixings stays
bounded (its spectral norm is at most 1), with coefficients computed from all streams at once:

    x'     = RMSNorm(vec(H))                                   H: the n streams of a position, n x C
    H_pre  = sigmoid(alpha_pre  * x' phi_pre  + b_pre)         n values >= 0
    H_post = 2 sigmoid(alpha_post * x' phi_post + b_post)      n values in (0, 2)
    H_res  = SinkhornKnopp(alpha_res * mat(x' phi_res) + b_res)   n x n, doubly stochastic
    h_in   = sum_i H_pre[i] h_i;  o = drop(F(LN(h_in)));  h'_j = sum_i H_res[j, i] h_i + H_post[j] o

SinkhornKnopp: ``exp``, then ``t_max = 20`` rounds of normalising the rows, then the columns (the paper's
t_max; the columns end exactly stochastic, the rows to within the iteration's tolerance). The RMSNorm has no
parameters (eps 1e-20 as the paper's, safe in fp32). The coefficients are computed in fp32 under fp16/bf16.

A scheme of its own rather than a ``--hc-manifold`` flag of ``hyper_connections``: its coefficients have
other parameters (three projections of the flattened streams, three biases, three gates) and another
computation, so a checkpoint of one cannot be the other; the streams' start, the stack output and the
analysis are shared (:class:`~fairseq_residual.schemes.hyper_connections.StreamsStack`).

Initialisation: the paper gives only the gates ``alpha = 0.01``; the public implementations start
elsewhere: huggingface/transformers' DeepSeek-V4 port (projections N(0, initializer_range), biases 0: the
mixing starts undamped and on average uniform, not the identity), lucidrains/hyper-connections (one-hot /
identity logits: H_pre 0.731 on one stream and 0.5 elsewhere, H_post 1.462, H_res = SK(exp(I)) = 0.475 on
the diagonal and 0.175 off it), tokenbender/mHC-lite (logits 0 on the identity, -8 elsewhere). Here:
``phi = 0``, ``b_pre`` one-hot on stream ``k mod n`` for the stack's k-th sub-layer (``H_pre`` = sigmoid(1) =
0.731 there and 1/2 elsewhere, lucidrains' pre logits), ``b_post = 0`` (``H_post = 1``), ``b_res = 0`` on the
diagonal and -8 off it (``H_res`` within 1.3e-3 of the identity), gates 0.01: at initialisation every stream
equals the Pre-LN residual stream and the branch reads ``LN(a * x) = LN(x)`` (a = 0.731 + (n - 1)/2), so the
model starts as Pre-LN, as hyper-connections do. The one-hot ``b_pre`` is what lets the streams part: with
every ``H_pre`` equal, the n streams, their gradients and every update are symmetric under permuting the
streams, so they stay copies of one another for good (trained in fp32 without it, ``alpha_res`` and
``phi_res`` take no update beyond rounding: the model stays Pre-LN with n-fold the cost); hyper-connections
break the same symmetry with their one-hot ``A_m``. Weight decay: the paper does not say which parameters it
exempts; all are decayed.

Per stack: every stream starts as a copy of the embedding output; the stack output is
``LN_final(sum_i h_i)`` (the paper gives no final merge; this is hyper-connections'). The project's reading
of the encoder-decoder case is hyper-connections' (a connection per sub-layer, cross-attention included).
Parameters per sub-layer: ``{kind}_residual.phi_pre`` (nC x n), ``phi_post`` (nC x n), ``phi_res``
(nC x n^2), ``b_pre``, ``b_post``, ``b_res`` (n x n), ``alpha_pre``, ``alpha_post``, ``alpha_res``.
"""
from dataclasses import dataclass
from typing import List, Tuple

import torch
from torch import Tensor, nn

from ..residual import NORM_INPUT, SublayerResidual
from .base import Option, ResidualScheme
from .hyper_connections import StreamsStack

#: Sinkhorn-Knopp rounds (the paper's t_max)
SINKHORN_ITERATIONS = 20
#: the RMSNorm's eps (the paper's)
RMS_EPS = 1e-20
#: b_res off the diagonal: exp(-8) = 3.4e-4 against 1 on it, H_res close to the identity at the start
OFF_DIAGONAL_LOGIT = -8.0


def sinkhorn_knopp(logits: Tensor, iterations: int) -> Tensor:
    """A doubly stochastic matrix from ``logits`` (... x n x n): ``exp``, then ``iterations`` rounds (the paper:
    :data:`SINKHORN_ITERATIONS`) of row then column normalisation (fp32 in, fp32 out)."""
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))  # shift-invariant; no overflow
    for _ in range(iterations):
        m = m / m.sum(dim=-1, keepdim=True)
        m = m / m.sum(dim=-2, keepdim=True)
    return m


@dataclass(frozen=True)
class MHCOptions:
    """Attributes: streams: n."""

    streams: int = 4


class ManifoldHyperConnection(SublayerResidual):
    """One sub-layer's mHC connection over the streams ``[H]`` (n x T x B x C).

    Args:
        site: the sub-layer. streams: n.
    """

    NORM = NORM_INPUT

    def __init__(self, site, streams: int):
        super().__init__(site)
        n, c = streams, site.embed_dim
        self.n_streams = n
        self.rms_eps = RMS_EPS
        self.sinkhorn_iterations = SINKHORN_ITERATIONS
        self.phi_pre = nn.Parameter(torch.zeros(n * c, n))
        self.phi_post = nn.Parameter(torch.zeros(n * c, n))
        self.phi_res = nn.Parameter(torch.zeros(n * c, n * n))
        self.b_pre = nn.Parameter(torch.zeros(n).index_fill_(0, torch.tensor(site.index % n), 1.0))  # symmetry
        self.b_post = nn.Parameter(torch.zeros(n))
        self.b_res = nn.Parameter(torch.full((n, n), OFF_DIAGONAL_LOGIT).fill_diagonal_(0.0))
        self.alpha_pre = nn.Parameter(torch.full((), 1e-2))
        self.alpha_post = nn.Parameter(torch.full((), 1e-2))
        self.alpha_res = nn.Parameter(torch.full((), 1e-2))

    def coefficients(self, streams: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """``(H_pre T x B x n, H_post T x B x n, H_res T x B x n x n)`` in fp32 for the streams n x T x B x C."""
        n, t, b, c = streams.shape
        x = streams.float().permute(1, 2, 0, 3).reshape(t, b, n * c)
        x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.rms_eps)
        pre = torch.sigmoid(self.alpha_pre.float() * (x @ self.phi_pre.float()) + self.b_pre.float())
        post = 2 * torch.sigmoid(self.alpha_post.float() * (x @ self.phi_post.float()) + self.b_post.float())
        res = self.alpha_res.float() * (x @ self.phi_res.float()).view(t, b, n, n) + self.b_res.float()
        return pre, post, sinkhorn_knopp(res, self.sinkhorn_iterations)

    def prepare(self, state: List[Tensor]) -> Tuple[Tensor, List[Tensor]]:
        streams = state[0]
        pre, post, res = self.coefficients(streams)
        h = streams.float()
        branch = torch.einsum("tbi,itbc->tbc", pre, h).to(streams.dtype)
        carried = torch.einsum("tbji,itbc->jtbc", res, h).to(streams.dtype)
        return branch, [carried, post.permute(2, 0, 1).to(streams.dtype)]

    def update(self, state: List[Tensor], out: Tensor) -> List[Tensor]:
        return [state[0] + state[1].unsqueeze(-1) * out.unsqueeze(0)]

    @torch.jit.unused
    def width_mixing(self, streams: Tensor, mask: Tensor) -> Tensor:
        """The mean ``H_res`` (n x n, as h' = H_res h) over the positions of ``mask`` (T x B), for analysis."""
        return self.coefficients(streams)[2][mask].mean(dim=0)

    def extra_repr(self):
        return f"streams={self.n_streams}"


class MHC(ResidualScheme):
    name = "mhc"
    label = "mHC"
    scheme_id = 14
    color = "slateblue"
    update = ("n streams; h_in = sum_i H_pre[i] h_i; o = drop(F(LN(h_in))); h'_j = sum_i H_res[j,i] h_i + H_post[j] o; "
              "H_pre = sigmoid(.), H_post = 2 sigmoid(.), H_res Sinkhorn-Knopp (20 rounds, doubly stochastic), all "
              "from RMSNorm(vec(H)), in fp32")
    output = "LN_final(sum_i h_i)"
    init = ("projections 0, `b_pre` one-hot on stream `k mod n` (breaks the streams' symmetry, as lucidrains'), "
            "`b_post = 0`, `b_res` 0 / -8 (`H_res` within 1.3e-3 of I), gates 0.01: it starts as Pre-LN")
    source = "DeepSeek-AI 2025, arXiv 2512.24880, eq. 3, 7-9"
    reference = ("the paper's equations; the public implementations start elsewhere (huggingface/transformers "
                 "`models/deepseek_v4/modeling_deepseek_v4.py`: undamped, uniform mixing on average; "
                 "lucidrains/hyper-connections: `H_res = SK(exp(I))`; tokenbender/mHC-lite: logits 0 / -8, followed here)")
    reading = ("as `hyper_connections`: one set of n streams per stack, a connection per sub-layer; the stack output, "
               "which the paper does not give, is hyper-connections' `LN_final(sum_i h_i)`")
    recipe = ("DeepSeek-V3-style MoE models (3B-27B): AdamW (0.9, 0.95), eps 1e-20, weight decay 0.1, warm-up 2000, "
              "step decay x0.316 at 80% and x0.1 at 90%, lr 8.6e-4 / 5.9e-4 / 4.0e-4, n = 4. A scheme of its own "
              "rather than a flag of `hyper_connections`: other parameters, another computation, so a checkpoint of "
              "one cannot be the other.")
    fp16_advice = ("as Pre-LN: its streams grow and have no scale (its coefficients and the stream sum are "
                   "computed in fp32)")
    OPTIONS = (Option("mhc_streams", int, 4, "number n of residual streams", low=1, high=16, metavar="N"),)

    def options(self, args):
        return MHCOptions(streams=int(args.mhc_streams))

    def sublayer_residual(self, cfg, site):
        return ManifoldHyperConnection(site, cfg.residual_options.params.streams)

    def stack_residual(self, cfg, stack, num_layers, embed_dim):
        return StreamsStack(stack, num_layers, embed_dim, cfg.residual_options.params.streams)


SCHEME = MHC()

"""mHC-lite (Yang and Gao, "mHC-lite: You Don't Need 20 Sinkhorn-Knopp Iterations", arXiv 2601.05732): mHC
(:mod:`~fairseq_residual.schemes.mhc`, arXiv 2512.24880 eq. 3, 7-8) whose stream-mixing matrix is a convex
combination of the n! permutation matrices (Birkhoff-von Neumann), doubly stochastic exactly, with no
Sinkhorn-Knopp iterations:

    x'     = RMSNorm(vec(H))                                   H: the n streams of a position, n x C
    H_pre  = sigmoid(alpha_pre  * x' phi_pre  + b_pre)         n values >= 0        (as mHC)
    H_post = 2 sigmoid(alpha_post * x' phi_post + b_post)      n values in (0, 2)   (as mHC)
    a      = softmax(alpha_res * x' phi_res + b_res)           n! weights, phi_res nC x n!, b_res n!
    H_res  = sum_k a_k P_k                                     n x n, doubly stochastic by construction
    h_in   = sum_i H_pre[i] h_i;  o = drop(F(LN(h_in)));  h'_j = sum_i H_res[j, i] h_i + H_post[j] o

``P_k`` is the k-th permutation of ``itertools.permutations(range(n))`` (k = 0 the identity), ``P_k[j, s(j)] = 1``:
``sum_i P_k[j, i] h_i = h_(s(j))``. The permutation weights ``a`` are dynamic (from the RMS-normalised flattened
streams, as mHC's coefficients) plus the static bias ``b_res``, the paper's reparameterisation of mHC's
``H_res``; ``H_pre`` and ``H_post`` are mHC's. What was checked against public text: the formula above (the AMD
ROCm/aiter mHC kernels' "lite" mode, whose header gives eq. 14-19 with eq. 19 the permutation-based ``H_res``,
and two independent descriptions of the paper giving ``a = softmax(alpha_res x' W_res + b_res)``,
``W_res`` nC x n!, ``b_res`` n!, ``H_res = sum_k a_k P_k``). The paper's own text and code were not available
here: its exact initialisation is taken from those descriptions (projections 0, gates 0.01, ``b_res`` 0 on the
identity and -8 on the others; ``b_pre`` and ``b_post`` +1 on one stream and -1 elsewhere, not used here, see
below).

Initialisation: as this plugin's mHC, so that a new model starts as mHC's does, as Pre-LN: ``phi = 0``, gates
0.01, ``b_pre`` one-hot on stream ``k mod n`` for the stack's k-th sub-layer (``H_pre`` 0.731 there, 1/2
elsewhere: breaks the streams' symmetry), ``b_post = 0`` (``H_post = 1``; the paper's +1 / -1 would write
1.46 o into one stream and 0.54 o into the others, which is not Pre-LN), ``b_res`` 0 for the identity and -8
for the other n! - 1 permutations (the paper's; ``H_res`` 0.994 on the diagonal and 2.0e-3 off it at n = 4,
against mHC's within 1.3e-3 of the identity; while the n streams are copies of one stream any doubly
stochastic ``H_res`` leaves them unchanged, so the start is Pre-LN whatever ``b_res``).

Cost: ``phi_res`` has nC x n! weights per sub-layer (mHC's nC x n^2) and every position computes n! logits
and an n^2 x n! product: n = 4: 24 (mHC: 16), n = 5: 120 (mHC: 25). n >= 6 (720 permutations, phi_res 720 nC)
is refused: ``--mhc-lite-streams`` is at most :data:`MAX_STREAMS`. Decoding keeps nothing per token beyond
fairseq's key/value cache (every coefficient depends on its own position).

Computation: mHC's code (:class:`~fairseq_residual.schemes.mhc.ManifoldHyperConnection`: one projection of the
flattened streams with the RMSNorm applied after it, the stack's start projected once, positions-first
streams, the closed-form backward of the update) with its ``H_res`` step replaced: a softmax over the n!
logits (positions last, n! x P) and one product with the constant n^2 x n! matrix of the vectorised
permutations (a buffer, not saved in checkpoints). The coefficients and mixing are computed in at least fp32
and never below the streams' precision. Per stack: mHC's (every stream starts as the embedding output; the
stack output ``LN_final(sum_i h_i)``); the encoder-decoder reading is hyper-connections'. Parameters per
sub-layer: mHC's names (``phi_pre``, ``phi_post``, ``phi_res`` nC x n!, ``b_pre``, ``b_post``, ``b_res`` n!,
``alpha_pre``, ``alpha_post``, ``alpha_res``). ``H_post`` goes from ``prepare`` to ``update`` in the state
between them, after the carried streams (mHC's goes in the context): the layers return no context.
"""
import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .base import MULTI_STREAM_GOAL, Option, ResidualScheme
from .hyper_connections import COMPILE_HELP, StreamsStack
from .mhc import OFF_DIAGONAL_LOGIT, ManifoldHyperConnection

#: the largest n: n! permutations (5! = 120 logits and nC x 120 weights per sub-layer; 6! = 720)
MAX_STREAMS = 5


def permutation_basis(n: int) -> Tensor:
    """The n^2 x n! matrix whose column k is ``vec(P_k)`` (row-major), ``P_k[j, s_k(j)] = 1`` for the k-th
    permutation ``s_k`` of ``itertools.permutations(range(n))`` (column 0 the identity)."""
    perms = list(itertools.permutations(range(n)))
    basis = torch.zeros(n * n, len(perms))
    for k, s in enumerate(perms):
        for j, i in enumerate(s):
            basis[j * n + i, k] = 1.0
    return basis


@dataclass(frozen=True)
class MHCLiteOptions:
    """Attributes: streams: n (at most :data:`MAX_STREAMS`); compile: ``torch.compile`` the connections'
    ``prepare`` / ``update`` in eager training (:data:`~fairseq_residual.schemes.hyper_connections.COMPILE_HELP`)."""

    streams: int = 4
    compile: bool = False


class LiteManifoldHyperConnection(ManifoldHyperConnection):
    """One sub-layer's mHC-lite connection over the streams ``[H]`` (n x T x B x C): mHC's, with ``H_res`` the
    softmax-weighted sum of the n! permutation matrices.

    Args:
        site: the sub-layer. streams: n (at most :data:`MAX_STREAMS`). compile: run ``prepare`` / ``update``
            through ``torch.compile`` in eager training.
    """

    compile_flag = "--mhc-lite-compile"

    def __init__(self, site, streams: int, compile: bool = False):
        super().__init__(site, streams, compile)
        n, c = streams, site.embed_dim
        perms = math.factorial(n)
        self.phi_res = nn.Parameter(torch.zeros(n * c, perms))
        # 0 for the identity (column 0), -8 for the other permutations
        self.b_res = nn.Parameter(torch.full((perms,), OFF_DIAGONAL_LOGIT).index_fill_(0, torch.tensor(0), 0.0))
        self.register_buffer("permutations", permutation_basis(n), persistent=False)
        self.coefficient_in_context = False  # H_post goes to update in the state: the layers return no context

    def _residual_mixing(self, res: Tensor, p: int) -> Tensor:
        """``H_res = sum_k a_k P_k`` (n x n x P) with ``a = softmax(alpha_res x' phi_res + b_res)`` over the n!
        permutations, from ``x' phi_res`` (n! x P, positions last)."""
        n = self.n_streams
        dtype = res.dtype
        weights = torch.softmax(self.alpha_res.to(dtype) * res + self.b_res.to(dtype).unsqueeze(-1), dim=0)
        return torch.mm(self.permutations.to(dtype), weights).view(n, n, p)

    @torch.jit.unused
    def _residual_mixing_inference(self, logits: Tensor, p: int) -> Tensor:
        """:meth:`_residual_mixing` from the logits with the gate and bias applied (n! x P)."""
        n = self.n_streams
        return torch.mm(self.permutations.to(logits.dtype), torch.softmax(logits, dim=0)).view(n, n, p)

    def extra_repr(self):
        return f"streams={self.n_streams}, permutations={self.phi_res.size(1)}"


class MHCLite(ResidualScheme):
    name = "mhc_lite"
    label = "mHC-lite"
    scheme_id = 20
    color = "darkviolet"
    speed_goal = MULTI_STREAM_GOAL
    update = ("n streams; h_in = sum_i H_pre[i] h_i; o = drop(F(LN(h_in))); h'_j = sum_i H_res[j,i] h_i + H_post[j] o; "
              "H_pre, H_post as mHC; H_res = sum_k softmax(alpha_res x' phi_res + b_res)_k P_k over the n! "
              "permutation matrices (exactly doubly stochastic), x' = RMSNorm(vec(H)), in fp32")
    output = "LN_final(sum_i h_i)"
    init = ("as `mhc`: projections 0, `b_pre` one-hot on stream `k mod n`, `b_post = 0`, gates 0.01; `b_res` 0 on the "
            "identity permutation, -8 on the others: it starts as Pre-LN")
    source = "Yang and Gao 2026, arXiv 2601.05732 (mHC: arXiv 2512.24880, eq. 3, 7-8)"
    reference = ("the paper's formula as ROCm/aiter's mHC kernels (`lite` mode) compute it; `H_pre`, `H_post` and the "
                 "initialisation as this plugin's `mhc` (the paper's `b_pre`/`b_post` +1/-1 are not Pre-LN)")
    reading = "as `mhc` (one set of n streams per stack, a connection per sub-layer, `LN_final(sum_i h_i)`)"
    recipe = ("not read here (descriptions of the paper: GPT-style language models of 45M-0.36B parameters against "
              "mHC, n = 4); n! grows fast: n <= 5 here.")
    fp16_advice = "as `mhc`"
    OPTIONS = (Option("mhc_lite_streams", int, 4, f"number n of residual streams, at most {MAX_STREAMS}: every "
                      "sub-layer computes n! permutation weights per position from a phi_res of nC x n! weights "
                      "(n = 5: 120, n = 6: 720 = 29 times mHC's n^2); for more streams use --residual-scheme mhc",
                      low=1, high=MAX_STREAMS, metavar="N"),
               Option("mhc_lite_compile", bool, False, COMPILE_HELP, negative="--mhc-lite-no-compile"))

    def options(self, args):
        return MHCLiteOptions(streams=int(args.mhc_lite_streams),
                              compile=bool(getattr(args, "mhc_lite_compile", False)))

    def sublayer_residual(self, cfg, site):
        opts = cfg.residual_options.params
        return LiteManifoldHyperConnection(site, opts.streams, opts.compile)

    def stack_residual(self, cfg, stack, num_layers, embed_dim):
        return StreamsStack(stack, num_layers, embed_dim, cfg.residual_options.params.streams)


SCHEME = MHCLite()

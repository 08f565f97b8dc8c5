"""Manifold-constrained hyper-connections (mHC; DeepSeek-AI, arXiv 2512.24880, eq. 3 and 7-9): hyper-connections
whose stream-mixing matrix is kept doubly stochastic, so that the product of many layers' mixings stays
bounded (its spectral norm is at most 1), with coefficients computed from all streams at once:

    x'     = RMSNorm(vec(H))                                   H: the n streams of a position, n x C
    H_pre  = sigmoid(alpha_pre  * x' phi_pre  + b_pre)         n values >= 0
    H_post = 2 sigmoid(alpha_post * x' phi_post + b_post)      n values in (0, 2)
    H_res  = SinkhornKnopp(alpha_res * mat(x' phi_res) + b_res)   n x n, doubly stochastic
    h_in   = sum_i H_pre[i] h_i;  o = drop(F(LN(h_in)));  h'_j = sum_i H_res[j, i] h_i + H_post[j] o

SinkhornKnopp is the paper's eq. 9, ``M(0) = exp(H~_res)``, ``M(t) = T_r(T_c(M(t-1)))``, ``H_res = M(t_max)``
with ``T_c`` / ``T_r`` the column / row normalisation and ``t_max = 20``: every round normalises the columns,
then the rows, so the rows of ``H_res`` sum to 1 exactly (up to rounding) and the columns to within the
iteration's tolerance. The rows are the ones that matter most: ``h'_j = sum_i H_res[j, i] h_i`` makes every new
stream a convex combination of the old ones. DeepSeek-V4's code (huggingface/transformers
``models/deepseek_v4/modeling_deepseek_v4.py``) ends each round on the columns of its ``comb`` but applies
``comb`` transposed (``h'_j = sum_i comb[i, j] h_i``): the same order. Versions of this plugin before this
order was fixed normalised rows first and columns last (the transpose of eq. 9); the two agree within 1e-6
when the rounds converge and differ when they do not, as for weakly coupled streams (log-probabilities of a
tiny 3+2-layer model with n = 3: 7e-3 apart with H_res near the identity, 4.5e-2 with off-diagonal logits
-2 to -8); checkpoints carry no marker of the order, so an mHC model trained before the fix computes slightly
different outputs when loaded now. The RMSNorm has no parameters (eps 1e-20
as the paper's, safe in fp32). The coefficients and the mixing are computed in at least fp32 and never below
the streams' precision (fp32 under fp16/bf16, float64 in float64).

Computation (the same function, restructured for speed; the reordering of the RMSNorm after the matmul is the one the paper describes for its fused kernels): one projection
of the flattened streams with ``[phi_pre | phi_post | phi_res]``, the RMSNorm's ``1/rms`` applied after it
(``RMSNorm(x) phi = (x phi) / rms(x)``, with a closed-form backward:
:func:`~fairseq_residual.stream_ops.rms_projection`); the coefficients positions-last (n x n x P), Sinkhorn-Knopp
with a backward that recomputes its rounds (:func:`sinkhorn_knopp_recomputed`); branch input and carried streams
from one product per position; the stack's start (n copies of one stream) projected once, with ``sum_i phi_i``,
and mixed by a broadcast product; the streams laid out positions-first (T x B x n x C in memory) between
sub-layers.

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
from typing import Dict, List, Tuple

import torch
from torch import Tensor, nn

from ..residual import NORM_INPUT
from ..stream_ops import compiled, rms_projection, stream_update
from .base import MULTI_STREAM_GOAL, Option, ResidualScheme
from .hyper_connections import COMPILE_HELP, StreamsConnection, StreamsStack

#: Sinkhorn-Knopp rounds (the paper's t_max)
SINKHORN_ITERATIONS = 20
#: the RMSNorm's eps (the paper's)
RMS_EPS = 1e-20
#: b_res off the diagonal: exp(-8) = 3.4e-4 against 1 on it, H_res close to the identity at the start
OFF_DIAGONAL_LOGIT = -8.0


def sinkhorn_knopp(logits: Tensor, iterations: int) -> Tensor:
    """A doubly stochastic matrix from ``logits`` (... x n x n), the paper's eq. 9: ``M(0) = exp(logits)``,
    then ``iterations`` rounds (the paper: :data:`SINKHORN_ITERATIONS`) of ``M(t) = T_r(T_c(M(t-1)))``, column
    normalisation then row normalisation, so that the rows end exactly stochastic (same dtype out as in)."""
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))  # shift-invariant; no overflow
    for _ in range(iterations):
        m = m / m.sum(dim=-2, keepdim=True)  # T_c: every column sums to 1
        m = m / m.sum(dim=-1, keepdim=True)  # T_r: every row sums to 1
    return m


def sinkhorn_knopp_positions_last(logits: Tensor, iterations: int) -> Tensor:
    """:func:`sinkhorn_knopp` (eq. 9) with the matrix first: ``logits`` n x n x P (``[j, i, p]`` is
    ``H_res[j, i]`` at position p), the P positions contiguous so that every normalisation is a vectorised pass
    over them. Returns n x n x P."""
    m = torch.exp(logits - logits.amax(dim=(0, 1), keepdim=True))
    for _ in range(iterations):
        m = m / m.sum(dim=0, keepdim=True)  # T_c
        m = m / m.sum(dim=1, keepdim=True)  # T_r
    return m


def sinkhorn_knopp_in_place(logits: Tensor, iterations: int) -> Tensor:
    """:func:`sinkhorn_knopp_positions_last` (``logits`` n x n x P, eq. 9) normalising one matrix in place: the same
    operations on the same values (bit-identical results), without a new tensor per normalisation. Run through
    TorchScript (:func:`sinkhorn_knopp_scripted`), it saves the interpreter's time per operation, which is what
    2 x t_max tiny normalisations cost at a decoding step's few positions."""
    m = torch.exp(logits - logits.amax(dim=(0, 1), keepdim=True))
    for _ in range(iterations):
        m.div_(m.sum(dim=0, keepdim=True))  # T_c
        m.div_(m.sum(dim=1, keepdim=True))  # T_r
    return m


def sinkhorn_knopp_backward(logits: Tensor, grad: Tensor, iterations: int) -> Tensor:
    """The gradient of :func:`sinkhorn_knopp_positions_last` with respect to ``logits`` (n x n x P), for the
    gradient ``grad`` of its result, recomputing the rounds: normalisation ``y = x / s``, ``s = sum_d x``, has the
    gradient ``dx = (dy - sum_d(dy y)) / s``; ``exp`` has ``dl = dm m``; the max shift has none (the result does
    not depend on it)."""
    m0 = torch.exp(logits - logits.amax(dim=(0, 1), keepdim=True))
    outputs: List[Tensor] = []
    sums: List[Tensor] = []
    m = m0
    for _ in range(iterations):
        for dim in (0, 1):
            s = m.sum(dim=dim, keepdim=True)
            m = m / s
            outputs.append(m)
            sums.append(s)
    for k in range(len(outputs) - 1, -1, -1):
        dim = k % 2
        grad = (grad - (grad * outputs[k]).sum(dim=dim, keepdim=True)) / sums[k]
    return grad * m0


_SCRIPTED: Dict[str, torch.jit.ScriptFunction] = {}


@torch.jit.unused
def _scripted(fn):
    """``fn`` compiled by TorchScript once (at its first call), called without the profiling executor's
    optimisations (no fusion, no shape specialisation: the same kernels as eager, for any number of positions)."""
    compiled = _SCRIPTED.get(fn.__name__)
    if compiled is None:
        compiled = _SCRIPTED[fn.__name__] = torch.jit.script(fn)
    return compiled


@torch.jit.unused
def sinkhorn_knopp_scripted(logits: Tensor, iterations: int) -> Tensor:
    """:func:`sinkhorn_knopp_in_place` through TorchScript (bit-identical values): the interpreter's time per
    operation is what 2 x t_max tiny normalisations cost (227 -> 90 us for 20 positions on one CPU thread)."""
    with torch.jit.optimized_execution(False):
        return _scripted(sinkhorn_knopp_in_place)(logits, iterations)


class _SinkhornKnopp(torch.autograd.Function):
    """:func:`sinkhorn_knopp_positions_last` whose backward recomputes the rounds from the logits
    (:func:`sinkhorn_knopp_backward`) instead of autograd keeping the 2 t_max intermediate matrices of every
    sub-layer until the backward pass; both run through TorchScript (forward values bit-identical to the loop:
    it is the loop, normalising in place)."""

    @staticmethod
    def forward(ctx, logits: Tensor, iterations: int) -> Tensor:
        ctx.iterations = iterations
        ctx.save_for_backward(logits)
        return sinkhorn_knopp_scripted(logits, iterations)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (logits,) = ctx.saved_tensors
        with torch.jit.optimized_execution(False):
            return _scripted(sinkhorn_knopp_backward)(logits, grad, ctx.iterations), None


@torch.jit.unused
def _sinkhorn_with_recomputing_backward(logits: Tensor, iterations: int) -> Tensor:
    return _SinkhornKnopp.apply(logits, iterations)


def sinkhorn_knopp_recomputed(logits: Tensor, iterations: int) -> Tensor:
    """:func:`sinkhorn_knopp_positions_last` (``logits`` n x n x P, eq. 9) with a backward that recomputes the
    rounds instead of keeping them; the eager loop under TorchScript, which has no custom autograd functions."""
    if torch.jit.is_scripting():
        return sinkhorn_knopp_positions_last(logits, iterations)
    return _sinkhorn_with_recomputing_backward(logits, iterations)


@dataclass(frozen=True)
class MHCOptions:
    """Attributes: streams: n; compile: ``torch.compile`` the connections' ``prepare`` / ``update`` in eager
    training (:data:`~fairseq_residual.schemes.hyper_connections.COMPILE_HELP`)."""

    streams: int = 4
    compile: bool = False


class ManifoldHyperConnection(StreamsConnection):
    """One sub-layer's mHC connection over the streams ``[H]`` (n x T x B x C).

    Args:
        site: the sub-layer. streams: n. compile: run ``prepare`` / ``update`` through ``torch.compile`` in eager
            training (:data:`~fairseq_residual.schemes.hyper_connections.COMPILE_HELP`).
    """

    compile_flag = "--mhc-compile"

    NORM = NORM_INPUT

    def __init__(self, site, streams: int, compile: bool = False):
        super().__init__(site)
        n, c = streams, site.embed_dim
        self.n_streams = n
        self.compile_training = compile
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

    def _positions_last(self, x: Tensor, copies: int) -> Tuple[Tensor, Tensor, Tensor]:
        """``(H_pre n x P, H_post n x P, H_res n x n x P)`` (eq. 7-9) in the dtype of ``x``, for ``x`` P x nC, the
        flattened streams vec(H) of every position (``copies`` = 1), or P x C, one stream of which the n streams
        are copies (``copies`` = n).

        One projection with ``[phi_pre | phi_post | phi_res]`` (nC x (2n + n^2)), the RMSNorm applied after it:
        ``RMSNorm(x) phi = (x phi) / rms(x)`` (the reordering the paper describes for its fused kernels;
        :func:`~fairseq_residual.stream_ops.rms_projection`), so the normalised nC-vector is never formed. For n
        copies of one stream x, ``vec(H) = [x, ..., x]`` has the rms of x and ``vec(H) phi = x sum_i phi_i`` (phi_i
        the C rows of stream i)."""
        n, p = self.n_streams, x.size(0)
        dtype = x.dtype
        phi = torch.cat([self.phi_pre, self.phi_post, self.phi_res], dim=1).to(dtype)
        if copies > 1:
            phi = phi.view(copies, -1, phi.size(1)).sum(dim=0)
        logits = rms_projection(x, phi, self.rms_eps)  # (2n + n^2) x P: positions last
        pre, post, res = logits.split([n, n, self.phi_res.size(1)], dim=0)
        pre = torch.sigmoid(self.alpha_pre.to(dtype) * pre + self.b_pre.to(dtype).unsqueeze(-1))
        post = 2 * torch.sigmoid(self.alpha_post.to(dtype) * post + self.b_post.to(dtype).unsqueeze(-1))
        return pre, post, self._residual_mixing(res, p)

    def _residual_mixing(self, res: Tensor, p: int) -> Tensor:
        """``H_res`` n x n x P from the normalised projection ``x' phi_res`` (n^2 x P, positions last): eq. 9,
        Sinkhorn-Knopp of ``alpha_res mat(x' phi_res) + b_res``, with a backward that recomputes its rounds."""
        n = self.n_streams
        dtype = res.dtype
        res = self.alpha_res.to(dtype) * res.view(n, n, p) + self.b_res.to(dtype).unsqueeze(-1)
        return sinkhorn_knopp_recomputed(res, self.sinkhorn_iterations)

    @torch.jit.unused
    def _residual_mixing_inference(self, logits: Tensor, p: int) -> Tensor:
        """:meth:`_residual_mixing` without gradients, from the logits with the gate and bias applied (n^2 x P):
        Sinkhorn-Knopp in place through TorchScript (:func:`sinkhorn_knopp_scripted`)."""
        n = self.n_streams
        return sinkhorn_knopp_scripted(logits.view(n, n, p), self.sinkhorn_iterations)

    def _build_parts(self, dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor]:
        """``(phi, phi_copies, bias)`` for :meth:`prepare_inference`: ``[a_pre phi_pre | a_post phi_post |
        a_res phi_res]`` (nC x (2n + n^2), the gates folded in), its sum over the n streams' rows (C x (2n + n^2),
        for n copies of one stream), and ``[b_pre | b_post | vec(b_res)]`` as a column ((2n + n^2) x 1), in
        ``dtype``."""
        n = self.n_streams
        gates = torch.cat([self.alpha_pre.expand(n), self.alpha_post.expand(n), self.alpha_res.expand(self.phi_res.size(1))])
        phi = (torch.cat([self.phi_pre, self.phi_post, self.phi_res], dim=1) * gates).to(dtype)
        bias = torch.cat([self.b_pre, self.b_post, self.b_res.reshape(-1)]).to(dtype).unsqueeze(-1)
        return phi, phi.view(n, -1, phi.size(1)).sum(dim=0), bias

    @torch.jit.unused
    def prepare_inference(self, state: List[Tensor]) -> Tuple[Tensor, List[Tensor]]:
        """:meth:`prepare_streams` without gradients, in fewer operators (what a decoding step costs): the
        projection, gates and biases combined once and cached (:meth:`_build_parts`), the logits as one
        ``addcmul`` of the biases and ``(x phi) / rms(x)``, Sinkhorn-Knopp in place through TorchScript
        (:func:`sinkhorn_knopp_scripted`), the branch input and carried streams left as views of the mixing
        product (nothing keeps them for a backward). The same function up to rounding (the gates multiply
        the projection's weights instead of its output)."""
        streams = state[0]
        n, t, b, c = streams.shape
        p = t * b
        dtype = torch.promote_types(streams.dtype, torch.float32)
        phi, phi_copies, bias = self._inference_parts(dtype)
        start = n > 1 and streams.stride(0) == 0  # n copies of one stream: the stack's start
        h = streams.permute(1, 2, 0, 3).reshape(p, n, c).to(dtype)  # a view, also of expanded streams
        x = h[:, 0] if start else h.reshape(p, n * c)
        inv_rms = torch.rsqrt(x.square().mean(dim=-1) + self.rms_eps)
        # x phi in this orientation: at a decoding step's few positions BLAS is faster so (16 vs 23 us, 20 x 1024
        # by 1024 x 24)
        logits = torch.addcmul(bias, torch.mm(x, phi_copies if start else phi).t(), inv_rms)
        pre = torch.sigmoid(logits[:n])
        post = 2 * torch.sigmoid(logits[n: 2 * n])
        res = self._residual_mixing_inference(logits[2 * n:], p)
        if start:
            branch = x * pre.sum(dim=0).unsqueeze(-1)
            carried = res.sum(dim=1).t().contiguous().unsqueeze(-1) * x.unsqueeze(1)  # P x n x C positions-first
        else:
            # the coefficients P x (n + 1) x n contiguous: with positions last in memory, bmm loops over positions
            mix = torch.cat([pre.unsqueeze(0), res], dim=0).permute(2, 0, 1).contiguous()
            mixed = torch.bmm(mix, h)  # P x (n + 1) x C
            branch, carried = mixed[:, 0], mixed[:, 1:]
        return (branch.to(streams.dtype).view(t, b, c),
                [carried.to(streams.dtype).reshape(t, b, n, c).permute(2, 0, 1, 3), post.view(n, t, b).to(streams.dtype)])

    def coefficients(self, streams: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """``(H_pre T x B x n, H_post T x B x n, H_res T x B x n x n)`` for the streams n x T x B x C (eq. 7-9), in
        at least fp32 and never below the streams' precision."""
        n, t, b, c = streams.shape
        dtype = torch.promote_types(streams.dtype, torch.float32)
        pre, post, res = self._positions_last(streams.permute(1, 2, 0, 3).reshape(t * b, n * c).to(dtype), 1)
        return (pre.t().reshape(t, b, n), post.t().reshape(t, b, n),
                res.permute(2, 0, 1).reshape(t, b, n, n))

    def prepare_streams(self, state: List[Tensor]) -> Tuple[Tensor, List[Tensor]]:
        """One mixing product per position, ``[H_pre; H_res] (n + 1 x n)`` times the streams (n x C): the branch
        input ``sum_i H_pre[i] h_i`` (T x B x C, its own storage, so that what the branch keeps for its backward
        does not hold the carried streams) and the carried streams ``sum_i H_res[j, i] h_i`` (n x T x B x C, laid
        out positions-first), with ``H_post`` (n x T x B) for :meth:`update`; coefficients and mixing in at least
        fp32, never below the streams' precision.

        The streams as :meth:`update` leaves them (positions-first, T x B x n x C in memory) are flattened without
        a copy. When the n streams are copies of one stream x (the stack's start, an expanded tensor), the mixing
        reduces to ``(sum_i H_pre[i]) x`` and ``(sum_i H_res[j, i]) x``: a projection of the one stream and a
        broadcast product (the same function, without the n-fold work)."""
        streams = state[0]
        n, t, b, c = streams.shape
        p = t * b
        dtype = torch.promote_types(streams.dtype, torch.float32)
        if n > 1 and streams.stride(0) == 0:  # n copies of one stream: h_i = x for every i
            x = streams[0].reshape(p, c).to(dtype)
            pre, post, res = self._positions_last(x, n)
            branch = x * pre.sum(dim=0).unsqueeze(-1)  # P x C
            # P x n x C positions-first: with the coefficients P x n contiguous (a transposed n x P would
            # lay the product out streams-first, and the next sub-layer would copy it)
            carried = res.sum(dim=1).t().contiguous().unsqueeze(-1) * x.unsqueeze(1)
        else:
            h = streams.permute(1, 2, 0, 3).reshape(p, n, c).to(dtype)  # a view of positions-first streams
            pre, post, res = self._positions_last(h.reshape(p, n * c), 1)  # vec(H) per position, a view
            mix = torch.cat([pre.unsqueeze(0), res], dim=0).permute(2, 0, 1).contiguous()  # P x (n + 1) x n
            branch, carried = (mix @ h).split([1, n], dim=1)  # P x 1 x C, P x n x C
            branch = branch.contiguous()
        return (branch.to(streams.dtype).view(t, b, c),
                [carried.to(streams.dtype).reshape(t, b, n, c).permute(2, 0, 1, 3), post.view(n, t, b).to(streams.dtype)])

    def update_streams(self, state: List[Tensor], out: Tensor) -> List[Tensor]:
        """``h'_j = carried_j + H_post[j] o`` (eq. 3), n x T x B x C laid out positions-first (T x B x n x C)."""
        return [stream_update(state[0], state[1], out)]

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
    speed_goal = MULTI_STREAM_GOAL
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
    formula_norms = "the parameter-free RMSNorm of the coefficients' input (eq. 7: part of the connection)"
    OPTIONS = (Option("mhc_streams", int, 4, "number n of residual streams", low=1, high=16, metavar="N"),
               Option("mhc_compile", bool, False, COMPILE_HELP, negative="--mhc-no-compile"))

    def options(self, args):
        return MHCOptions(streams=int(args.mhc_streams), compile=bool(getattr(args, "mhc_compile", False)))

    def sublayer_residual(self, cfg, site):
        opts = cfg.residual_options.params
        return ManifoldHyperConnection(site, opts.streams, opts.compile)

    def stack_residual(self, cfg, stack, num_layers, embed_dim):
        return StreamsStack(stack, num_layers, embed_dim, cfg.residual_options.params.streams)


SCHEME = MHC()

"""Hyper-connections (Zhu et al., "Hyper-Connections", arXiv 2409.19606, ICLR 2025; Algorithm 2 in App. J):
the residual is n streams ``h_1..h_n`` per position, mixed by a learned connection at every sub-layer.

Per sub-layer k with its connection ``A_m`` (n), ``A_r`` (n x n), ``B`` (n):

    h_in  = sum_i A_m[i] h_i                          the branch input
    o     = drop(F(LN(h_in)))                         the sub-layer keeps its own pre-LN
    h'_j  = sum_i A_r[i, j] h_i + B[j] o              the new streams

static (``--hc-static``: ``A_m``, ``A_r``, ``B`` are learned scalars) or dynamic (``--hc-dynamic``, default; paper
eq. 10-13): per position and stream i, with ``hbar_i = LN_hc(h_i)`` a LayerNorm without parameters,

    [A_m | A_r][i, :] = static + s_alpha * tanh(hbar_i W_alpha)     W_alpha: C x (n + 1)
    B[i]              = static + s_beta  * tanh(hbar_i . w_beta)    w_beta: C

Initialisation (paper section 2.3, eq. 14): ``A_m = e_(k mod n)`` (one-hot), ``A_r = I``, ``B = 1``,
``W_alpha = w_beta = 0``, ``s_alpha = s_beta = 0.01``. Parameters per sub-layer, the paper's names
(``{kind}_residual.static_alpha`` n x (n + 1) = ``[A_m | A_r]``, ``static_beta``, ``dynamic_alpha_fn``,
``dynamic_alpha_scale``, ``dynamic_beta_fn``, ``dynamic_beta_scale``). The static parts get no weight decay,
as the paper trains them (section 4): they carry fairseq's own per-parameter ``optim_overrides``, which the
plugin honours for every optimizer (:mod:`fairseq_residual.optim_groups`).

Per stack: every stream starts as a copy of the embedding output (after dropout); the stack output is
``LN_final(sum_i h_i)`` (Algorithm 1: sum, then the final norm); the view (``inner_states``) is
``sum_i h_i``, the extra streams ``h1..hn``. The coefficients, the mixing and the stream sum are computed
in at least fp32 and never below the streams' precision (fp32 under fp16/bf16, float64 in float64).

Computation (the same function as the textbook order above, restructured for speed): the dynamic part is one
projection of every stream with ``[W_alpha | w_beta]``, LN_hc applied after it as
``(h W - mean(h) 1^T W) / sqrt(var(h) + eps)`` (in fp32, with streams whose mean is many times their spread, this
loses a few more digits than normalising first: coefficients 1e-5 off at mean/std = 20, 2e-4 at 200), with
a closed-form backward (:func:`~fairseq_residual.stream_ops.layer_norm_projection`; ``torch.var_mean`` is a slow
reduction on the CPU); the static and dynamic parts join in one ``addcmul``; branch input and carried streams
come from one product per position; the stack's start (n copies of the embedding output, an expanded tensor)
is projected once and mixed by a broadcast product; the streams stay laid out positions-first (T x B x n x C in
memory) between sub-layers, and their update has a closed-form backward
(:func:`~fairseq_residual.stream_ops.stream_update`).

The project's reading of the encoder-decoder case (the paper is decoder-only): one set of n streams per
stack; every sub-layer, cross-attention included, has its own connection; k counts the sub-layers of a
stack in order (encoder SA, FFN, SA, FFN, ...; decoder SA, CA, FFN, ...), so the decoder's one-hot cycle does
not line up with its layers; cross-attention's keys and values are the encoder output. Not implemented:
the paper's "output projections' std scaled by sqrt(n)", whose direction the paper does not state (with
``B = 1`` and identical streams at initialisation the sum before the final norm is n times the baseline
whatever the weights' scale, and that norm removes the scale). At initialisation every stream equals the
Pre-LN residual stream, so the model is Pre-LN (the final norm sees n times its input).

The most used public implementation (lucidrains/hyper-connections) silently returned the unmixed residual,
skipping ``A_r``, from v0.1.7 to v0.3.10 (its issue 8), and picks a random stream for ``A_m`` when the
layer index is not passed; the exactness test here checks ``A_r`` and the one-hot cycle.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from ..residual import NORM_INPUT, StackResidual, SublayerResidual
from ..stream_ops import compiled, layer_norm_projection, stream_update
from .base import MULTI_STREAM_GOAL, Option, ResidualScheme

#: fairseq's per-parameter optimizer overrides (``optim_overrides``) of the static connection weights
NO_WEIGHT_DECAY = {"weight_decay": 0.0}
#: LN_hc's eps (a LayerNorm without parameters, torch's default)
LN_HC_EPS = 1e-5
#: the ``--hc-compile`` / ``--mhc-compile`` help. The compile cost was measured with torch 2.13 (CPU, inductor)
#: on a 2-core AMD EPYC shared with another job: ``scripts/block_benchmark.py --compile`` (one block, forward and
#: backward) 68 s for the first block with an empty inductor cache, 20-33 s for each further one; a 3 + 2-layer
#: model's first training step (both stacks, their two batch shapes) 147 s with an empty cache, 40-45 s with a
#: warm one (``tests/test_streams.py``); the full model's speed with it: docs/results/2026-12-04-later-schemes-speed.md
COMPILE_HELP = ("torch.compile the connections' prepare/update (coefficients, mixing, update) when training in eager "
                "mode; TorchScript, evaluation and incremental decoding run the plain code (the same function). "
                "The first training steps compile: about 1-2.5 minutes on a 2-core CPU with an empty inductor cache, "
                "less with a warm one; it needs a C++ compiler (refused at the first training step where torch.compile "
                "cannot run). On a CPU the whole model trained slower with it than without (0.76x against 0.82x stock "
                "Pre-LN for hyper-connections, 0.63x against 0.72x for mHC, 6+6 layers at width 256): it is meant for "
                "GPUs, where it was not measured")


@dataclass(frozen=True)
class HyperConnectionsOptions:
    """Attributes: streams: n; dynamic: the dynamic connection (paper eq. 10-13) on top of the static one;
    compile: ``torch.compile`` the connections' ``prepare`` / ``update`` in eager training (:data:`COMPILE_HELP`)."""

    streams: int = 4
    dynamic: bool = True
    compile: bool = False


class StreamsConnection(SublayerResidual):
    """What the multi-stream connections share (hyper-connections, mHC): :meth:`prepare` / :meth:`update` run the
    subclass's ``prepare_streams`` / ``update_streams`` through ``torch.compile`` when built with ``compile`` and
    training in eager mode (:func:`~fairseq_residual.stream_ops.compiled`, refused with :attr:`compile_flag` named
    where it cannot run), as they are otherwise (evaluation, incremental decoding, TorchScript).
    ``prepare_streams`` returns ``(branch input, [carried streams, update coefficients n x T x B])``; the state
    between sub-layers holds the streams only, the coefficients go to ``update`` in the context
    (``ctx["streams.coefficient"]``), or, where :attr:`coefficient_in_context` is False (the schemes added after
    the context's users were fixed, whose layers return no context), in the state ``prepare`` hands to
    ``update``, after the carried streams."""

    compile_flag = ""
    # the inference cache (:meth:`_inference_parts`): a plain attribute, not part of a TorchScript module
    __jit_ignored_attributes__ = ["_parts_cache"]

    def __init__(self, site):
        super().__init__(site)
        self.coefficient_in_context = True

    def prepare(self, state: List[Tensor], ctx: Dict[str, Tensor]) -> Tuple[Tensor, List[Tensor]]:
        """:meth:`prepare_streams`, through ``torch.compile`` when built with ``compile`` and training in eager
        mode; without gradients (evaluation, incremental decoding) in eager mode, :meth:`prepare_inference`."""
        if not torch.jit.is_scripting() and not torch.is_grad_enabled():
            branch, parts = self.prepare_inference(state)
        elif self.compile_training and self.training and not torch.jit.is_scripting():
            branch, parts = self._compiled_prepare(state)
        else:
            branch, parts = self.prepare_streams(state)
        if not self.coefficient_in_context:
            return branch, parts
        ctx["streams.coefficient"] = parts[1]
        return branch, parts[:1]

    @torch.jit.unused
    def prepare_inference(self, state: List[Tensor]) -> Tuple[Tensor, List[Tensor]]:
        """:meth:`prepare_streams` without gradients; subclasses give a leaner path (fewer operators, the
        parameters' static combinations cached: :meth:`_inference_parts`)."""
        return self.prepare_streams(state)

    def train(self, mode: bool = True):
        """``nn.Module.train``, dropping the inference cache (:meth:`_inference_parts`) at every switch of mode:
        fairseq's optimizers update the parameters in place through ``p.data`` (``fairseq/optim/adam.py``),
        which leaves the version counter the cache's key reads unchanged, and fairseq's trainer switches the
        model to ``train()`` before every update and to ``eval()`` before validating, so a validation never
        reads the combinations of an earlier one."""
        self.__dict__.pop("_parts_cache", None)
        return super().train(mode)

    @torch.jit.unused
    def _inference_parts(self, dtype: torch.dtype):
        """``self._build_parts(dtype)`` (tensors derived from the parameters alone, e.g. concatenations), built
        once and reused while no parameter of this connection changes: the key is every parameter's storage
        and version counter (bumped by an in-place update on the parameter itself: ``torch.optim``'s step,
        ``load_state_dict``), and the dtype; :meth:`train` drops it at every switch of mode, which covers an
        update through ``p.data`` (fairseq's optimizers), which the counter does not see. Only used without
        gradients."""
        # the module's own parameter dict: ``self.parameters()`` walks the module tree, which costs more than the
        # decoding step's arithmetic of the connection
        key = (dtype,) + tuple((p.data_ptr(), p._version) for p in self._parameters.values() if p is not None)
        cached = self.__dict__.get("_parts_cache")
        if cached is None or cached[0] != key:
            cached = self.__dict__["_parts_cache"] = (key, self._build_parts(dtype))
        return cached[1]

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        """:meth:`update_streams`, through ``torch.compile`` when built with ``compile`` and training in eager
        mode."""
        parts = [state[0], ctx["streams.coefficient"]] if self.coefficient_in_context else state
        if self.compile_training and self.training and not torch.jit.is_scripting():
            return self._compiled_update(parts, out)
        return self.update_streams(parts, out)

    @torch.jit.unused
    def _compiled_prepare(self, state: List[Tensor]) -> Tuple[Tensor, List[Tensor]]:
        return compiled(type(self).prepare_streams, self.compile_flag)(self, state)

    @torch.jit.unused
    def _compiled_update(self, state: List[Tensor], out: Tensor) -> List[Tensor]:
        return compiled(type(self).update_streams, self.compile_flag)(self, state, out)


class TanhConnection(StreamsConnection):
    """The coefficients hyper-connections and frac-connections share (arXiv 2409.19606 eq. 10-13; arXiv 2503.14125
    eq. 11-14): per row i of what is mixed (a stream, or a fraction of the hidden state), a static row plus
    ``s * tanh(LN(h_i) W)``, with LN a LayerNorm without parameters. The parameters, by the hyper-connections
    paper's names: ``static_alpha`` (rows x k, the mixing weights), ``static_beta`` (rows, the weights of the
    branch output), and, for the dynamic connection, ``dynamic_alpha_fn`` (width x k), ``dynamic_alpha_scale``,
    ``dynamic_beta_fn`` (width), ``dynamic_beta_scale`` (W = 0 and s = 0.01 at initialisation: the connection
    starts as its static part). The static parts get no weight decay (fairseq's ``optim_overrides``)."""

    def _connection_parameters(self, static_alpha: Tensor, static_beta: Tensor, width: int, dynamic: bool):
        """Registers the parameters with their initial values: the static ``static_alpha`` (rows x k) and
        ``static_beta`` (rows), the dynamic ones (zero projections of rows of ``width`` values, scales 0.01) when
        ``dynamic``, None otherwise."""
        self.ln_eps = LN_HC_EPS
        self.static_alpha = nn.Parameter(static_alpha)
        self.static_beta = nn.Parameter(static_beta)
        for p in (self.static_alpha, self.static_beta):
            p.optim_overrides = dict(NO_WEIGHT_DECAY)
        k = static_alpha.size(1)
        dynamic_parts = {"dynamic_alpha_fn": torch.zeros(width, k), "dynamic_alpha_scale": torch.full((), 1e-2),
                         "dynamic_beta_fn": torch.zeros(width), "dynamic_beta_scale": torch.full((), 1e-2)}
        for name, value in dynamic_parts.items():  # the static connection has no dynamic parameters
            self.register_parameter(name, nn.Parameter(value) if dynamic else None)

    def _connection(self, h: Tensor, rows: int) -> Tensor:
        """``[static_alpha | static_beta]`` plus the dynamic part, in the dtype of ``h``: per position P, row i's
        ``[alpha_i | beta_i]``, P x rows x (k + 1) (hyper-connections: stream i's ``[A_m[i] | A_r[i, :] | B[i]]``,
        eq. 10-13, the static part plus ``s * tanh(LN_hc(h_i) [W_alpha | w_beta])``), or the static
        n x (k + 1) alone for a static connection; ``h`` is (P rows) x width, the ``rows`` rows of every position
        (hyper-connections: its n streams, or one row per position, ``rows`` = 1, when the n streams are copies
        of it).

        The dynamic part is one projection of every row with ``[W_alpha | w_beta]`` (width x (k + 1)), LN_hc
        applied after it (:func:`~fairseq_residual.stream_ops.layer_norm_projection`), and one ``addcmul`` with
        the static part, so the normalised rows are never formed."""
        if torch.jit.is_scripting() or torch.is_grad_enabled():
            static, fn, scale = self._build_parts(h.dtype)
        else:
            static, fn, scale = self._cached_parts(h.dtype)
        if fn is not None and scale is not None:
            dynamic = torch.tanh(layer_norm_projection(h, fn, self.ln_eps))  # (P rows) x (k + 1)
            return torch.addcmul(static, dynamic.view(-1, rows, static.size(-1)), scale)
        return static

    def _build_parts(self, dtype: torch.dtype) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """``(static [alpha | beta] rows x (k + 1), [W_alpha | w_beta] width x (k + 1), [s_alpha x k | s_beta])``
        in ``dtype`` (hyper-connections: ``[A_m | A_r | B]``, k = n + 1), the last two None for a static
        connection."""
        k = self.static_alpha.size(1)
        static = torch.cat([self.static_alpha, self.static_beta.unsqueeze(-1)], dim=1).to(dtype)
        if self.dynamic_alpha_fn is not None and self.dynamic_beta_fn is not None \
                and self.dynamic_alpha_scale is not None and self.dynamic_beta_scale is not None:
            fn = torch.cat([self.dynamic_alpha_fn, self.dynamic_beta_fn.unsqueeze(-1)], dim=1).to(dtype)
            scale = torch.cat([self.dynamic_alpha_scale.expand(k), self.dynamic_beta_scale.unsqueeze(0)])
            return static, fn, scale.to(dtype)
        return static, None, None

    @torch.jit.unused
    def _cached_parts(self, dtype: torch.dtype) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """:meth:`_build_parts` through the inference cache (typed for TorchScript, which skips it)."""
        return self._inference_parts(dtype)


class HyperConnection(TanhConnection):
    """One sub-layer's hyper-connection: state ``[H]`` with H the n streams, n x T x B x C; ``prepare`` mixes
    them into the branch input and the carried streams, ``update`` adds ``B[j] o`` to stream j.

    Args:
        site: the sub-layer (its index k in the stack sets the one-hot ``A_m``).
        streams: n. dynamic: add the dynamic connection. compile: run ``prepare`` / ``update`` through
            ``torch.compile`` in eager training (:data:`COMPILE_HELP`).
    """

    compile_flag = "--hc-compile"

    NORM = NORM_INPUT

    def __init__(self, site, streams: int, dynamic: bool, compile: bool = False):
        super().__init__(site)
        n, c = streams, site.embed_dim
        self.n_streams = n
        self.compile_training = compile
        alpha0 = torch.zeros(n, 1)
        alpha0[site.index % n, 0] = 1.0
        # [A_m | A_r], n x (n + 1); B = 1
        self._connection_parameters(torch.cat([alpha0, torch.eye(n)], dim=1), torch.ones(n), c, dynamic)

    def coefficients(self, streams: Tensor) -> Tuple[Tensor, Tensor]:
        """``(alpha, beta)`` in at least fp32 and never below the streams' precision: alpha n x T x B x (n + 1)
        (row i: stream i's ``[A_m | A_r]`` entries, eq. 10-13), beta n x T x B, for the streams n x T x B x C."""
        n, t, b, c = streams.shape
        dtype = torch.promote_types(streams.dtype, torch.float32)
        h = streams.permute(1, 2, 0, 3).reshape(t * b * n, c).to(dtype)
        coef = self._connection(h, n).expand(t * b, n, n + 2).reshape(t, b, n, n + 2).permute(2, 0, 1, 3)
        return coef[..., : n + 1], coef[..., n + 1]

    def prepare_streams(self, state: List[Tensor]) -> Tuple[Tensor, List[Tensor]]:
        """One mixing product per position, ``[A_m | A_r]^T`` (n + 1 x n) times the streams (n x C): the branch
        input ``sum_i A_m[i] h_i`` (T x B x C, its own storage, so that what the branch keeps for its backward does
        not hold the carried streams) and the carried streams ``sum_i A_r[i, j] h_i`` (n x T x B x C, laid out
        positions-first), with ``B`` (n x T x B) for :meth:`update`; coefficients and mixing in at least fp32,
        never below the streams' precision.

        The streams as :meth:`update` leaves them (positions-first, T x B x n x C in memory) are read without a
        copy. When the n streams are copies of one stream (the stack's start, an expanded tensor), every stream's
        dynamic coefficients are the same, and the mixing reduces to ``(sum_i A[i, u]) x``: one projection of
        the one stream and a broadcast product (the same function, without the n-fold work)."""
        streams = state[0]
        n, t, b, c = streams.shape
        p = t * b
        dtype = torch.promote_types(streams.dtype, torch.float32)
        if n > 1 and streams.stride(0) == 0:  # n copies of one stream: h_i = x for every i
            x = streams[0].reshape(p, c).to(dtype)
            coef = self._connection(x, 1)  # P x n x (n + 2), or n x (n + 2) static
            mix = coef[..., : n + 1].sum(dim=-2)  # sum_i [A_m | A_r][i, :], P x (n + 1) (or n + 1)
            branch = x * mix[..., :1]
            carried = mix[..., 1:].unsqueeze(-1) * x.unsqueeze(-2)  # P x n x C
        else:
            h = streams.permute(1, 2, 0, 3).reshape(p, n, c).to(dtype)  # a view of positions-first streams
            coef = self._connection(h.reshape(p * n, c), n)
            mixed = coef[..., : n + 1].transpose(-1, -2) @ h  # P x (n + 1) x C
            branch, carried = mixed.split([1, n], dim=1)  # split, not slices: no zero-filled gradients
            branch = branch.contiguous()
        beta = coef[..., n + 1].expand(p, n)
        return (branch.to(streams.dtype).view(t, b, c),
                [carried.to(streams.dtype).reshape(t, b, n, c).permute(2, 0, 1, 3),
                 beta.reshape(t, b, n).permute(2, 0, 1).to(streams.dtype)])

    @torch.jit.unused
    def prepare_inference(self, state: List[Tensor]) -> Tuple[Tensor, List[Tensor]]:
        """:meth:`prepare_streams` without gradients, in fewer operators (what a decoding step costs): the
        parameters' static combinations cached, the projection's product in BLAS's fast orientation, one ``bmm``
        for the mixing, and the branch input and carried streams left as views of its result (nothing keeps them
        for a backward). The same function up to rounding."""
        streams = state[0]
        n, t, b, c = streams.shape
        if n > 1 and streams.stride(0) == 0:  # the stack's start: once per stack
            return self.prepare_streams(state)
        p = t * b
        dtype = torch.promote_types(streams.dtype, torch.float32)
        static, fn, scale = self._inference_parts(dtype)
        h = streams.permute(1, 2, 0, 3).reshape(p, n, c).to(dtype)  # a view of positions-first streams
        if fn is not None and scale is not None:
            # the product as (W^T LN(h)^T)^T: with n + 2 output columns BLAS is about 3x faster in that
            # orientation (one thread, 80 x 256 rows by 256 x 6: 26 -> 8 us)
            normed = torch.layer_norm(h.reshape(p * n, c), [c], None, None, self.ln_eps)
            z = torch.mm(fn.t(), normed.t()).t()
            coef = torch.addcmul(static, torch.tanh(z).view(p, n, n + 2), scale)  # P x n x (n + 2)
            mixed = torch.bmm(coef[:, :, : n + 1].transpose(1, 2), h)  # P x (n + 1) x C
            beta = coef[:, :, n + 1]
        else:
            mixed = torch.matmul(static[:, : n + 1].t(), h)
            beta = static[:, n + 1].expand(p, n)
        return (mixed[:, 0].to(streams.dtype).view(t, b, c),
                [mixed[:, 1:].to(streams.dtype).reshape(t, b, n, c).permute(2, 0, 1, 3),
                 beta.reshape(t, b, n).permute(2, 0, 1).to(streams.dtype)])

    def update_streams(self, state: List[Tensor], out: Tensor) -> List[Tensor]:
        """``h'_j = carried_j + B[j] o``, n x T x B x C laid out positions-first (T x B x n x C)."""
        return [stream_update(state[0], state[1], out)]

    @torch.jit.unused
    def width_mixing(self, streams: Tensor, mask: Tensor) -> Tensor:
        """The mean width mixing M (n x n, as h' = M h: ``M[j, i] = A_r[i, j]``) over the positions of ``mask``
        (T x B, True at real tokens), for analysis."""
        alpha, _ = self.coefficients(streams)
        return alpha[:, mask][..., 1:].mean(dim=1).t()

    def extra_repr(self):
        return f"streams={self.n_streams}, {'dynamic' if self.dynamic_alpha_fn is not None else 'static'}"


class StreamsStack(StackResidual):
    """n residual streams in one stack: every stream starts as the embedding output, the stack output is
    ``LN_final(sum_i h_i)``, the view ``sum_i h_i``, the extra streams ``h1..hn``.

    Args:
        stack, num_layers, embed_dim: as :class:`~fairseq_residual.residual.StackResidual`. streams: n.
    """

    def __init__(self, stack: str, num_layers: int, embed_dim: int, streams: int):
        super().__init__(stack, num_layers, embed_dim)
        self.n_streams = streams

    def start(self, x: Tensor) -> List[Tensor]:
        return [x.unsqueeze(0).expand([self.n_streams] + list(x.shape))]

    def final_input(self, state: List[Tensor]) -> Tensor:
        """``sum_i h_i`` (T x B x C), accumulated in fp32 under fp16/bf16 (trained streams may cancel), in the
        streams' own precision when that is higher (float64)."""
        streams = state[0]
        return streams.to(torch.promote_types(streams.dtype, torch.float32)).sum(dim=0).to(streams.dtype)

    def view(self, state: List[Tensor]) -> Tensor:
        return self.final_input(state)

    @torch.jit.unused
    def streams(self, state: List[Tensor]) -> Dict[str, Tensor]:
        return {f"h{i + 1}": state[0][i] for i in range(self.n_streams)}

    def extra_repr(self):
        return f"streams={self.n_streams}"


class HyperConnections(ResidualScheme):
    name = "hyper_connections"
    label = "Hyper-connections"
    scheme_id = 13
    color = "navy"
    speed_goal = MULTI_STREAM_GOAL
    update = ("n streams; h_in = sum_i A_m[i] h_i; o = drop(F(LN(h_in))); h'_j = sum_i A_r[i,j] h_i + B[j] o; "
              "A_m, A_r, B static + dynamic")
    output = "LN_final(sum_i h_i)"
    init = ("`A_m = e_(k mod n)`, `A_r = I`, `B = 1`; dynamic `W = 0`, `s = 0.01`; static parts without weight decay "
            "(fairseq's `optim_overrides`, honoured for every optimizer by `fairseq_residual/optim_groups.py`)")
    source = "Zhu et al. 2025, arXiv 2409.19606, eq. 10-14, Alg. 2"
    reference = ("lucidrains/hyper-connections `hyper_connections/hyper_connections.py` (it skipped `A_r` from "
                 "v0.1.7 to v0.3.10, its issue 8)")
    reading = ("one set of n streams per stack, each started as a copy of the embedding output; every sub-layer, "
               "cross-attention included, has its own connection; the sub-layer index k of the one-hot `A_m` counts "
               "per stack over SA, (CA,) FFN in order, so in the decoder the cycle does not line up with the layers")
    recipe = ("the baseline's recipe unchanged (OLMo / OLMoE; n = 4 with tanh; n = 8 gives no further gain); ViT: "
              "n = 2, AdamW (0.9, 0.999), lr 3e-3, cosine with 10k warm-up, weight decay 0.3, none on the static "
              "connection weights. The paper's \"output projections' std scaled by sqrt(n)\" is not offered: its "
              "direction is not stated, and at initialisation the final LayerNorm removes any common scale. At "
              "initialisation the model is Pre-LN (`tests/test_streams.py`).")
    optim_overrides = "its static connection weights without weight decay"
    optim_overrides_keys = frozenset(NO_WEIGHT_DECAY)
    fp16_advice = ("`--fp16` with weight decay needs `--fp16-no-flatten-grads` (fairseq's flat fp32 copy has no room "
                   "for the static weights' own parameter group); as Pre-LN: its streams grow and have no scale "
                   "(coefficients and the stream sum are computed in fp32)")
    formula_norms = ("the parameter-free `LN_hc` of the dynamic coefficients (eq. 10-11: part of the connection, "
                     "not a LayerNorm module)")
    OPTIONS = (
        Option("hc_streams", int, 4, "number n of residual streams", low=1, high=16, metavar="N"),
        Option("hc_dynamic", bool, True, "dynamic connections (paper eq. 10-13) on top of the static ones "
               "(--hc-dynamic, the default) or static hyper-connections only (--hc-static)", negative="--hc-static"),
        Option("hc_compile", bool, False, COMPILE_HELP, negative="--hc-no-compile"),
    )

    def options(self, args):
        return HyperConnectionsOptions(streams=int(args.hc_streams), dynamic=bool(args.hc_dynamic),
                                       compile=bool(getattr(args, "hc_compile", False)))

    def sublayer_residual(self, cfg, site):
        opts = cfg.residual_options.params
        return HyperConnection(site, opts.streams, opts.dynamic, opts.compile)

    def stack_residual(self, cfg, stack, num_layers, embed_dim):
        return StreamsStack(stack, num_layers, embed_dim, cfg.residual_options.params.streams)


SCHEME = HyperConnections()

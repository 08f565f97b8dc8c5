"""Frac-connections (Zhu et al., ByteDance Seed, "Frac-Connections: Fractional Extension of Hyper-Connections",
arXiv 2503.14125, section 4, eq. 6-15, Algorithms 1-2): hyper-connections whose "streams" are the m fractions of
the hidden state instead of n copies of it, so the residual is not widened.

Per sub-layer, with ``H = (h_1 .. h_m)`` the hidden state x (T x B x C) split into m consecutive fractions of
C/m (eq. 6, ``Reshape(h, (m, d/m))``):

    hbar_i = LN(h_i)                                        a LayerNorm without parameters, over C/m
    Y[i, :] = Y0[i, :] + s_alpha tanh(hbar_i W_gamma)      m x m, the branch input's mixing   (eq. 13)
    A[i, :] = A0[i, :] + s_alpha tanh(hbar_i W_alpha)      m x m, the carried fractions' mixing (eq. 14)
    B[i]    = B0[i]    + s_beta  tanh(hbar_i . w_beta)     m, the branch output's weights      (eq. 12)
    x_in    = Cat_j(sum_i Y[i, j] h_i)                      the branch input, T x B x C
    o       = drop(F(LN(x_in)))                             split into m fractions o_1 .. o_m
    h'_j    = B[j] o_j + sum_i A[i, j] h_i                  then concatenated: x' = Cat_j(h'_j)  (eq. 8)

static (``--frac-connections-static``: Y, A, B learned scalars only) or dynamic (default, eq. 11-14). This is the
authors' PyTorch pseudocode (Algorithm 2, ``FracConnection``: ``static_alpha = [I | I]`` m x 2m, ``static_beta =
1``, ``dynamic_alpha_fn`` (C/m) x 2m, ``dynamic_beta_fn`` (C/m), scales 0.01, ``mix_h = alpha^T h``; its first m
rows the branch input, the last m the carried fractions; ``h = beta o + mix_h[m:]``).

Initialisation (eq. 15): ``Y = A = I``, ``B = 1``, ``W = 0``, ``s = 0.01``: the model starts as Pre-LN exactly
(branch input x, update x + o). The static parts get no weight decay (section 4.3), as hyper-connections' here
(fairseq's ``optim_overrides``). The norm: the paper's pseudocode uses a ``LayerNorm(d/m)`` (its parameter count
assumes a norm with d/m weights); here a LayerNorm without parameters, hyper-connections' ``LN_hc`` in this plugin
(OLMo's LayerNorm has none).

lucidrains/hyper-connections (``hyper_connections/hyper_connections.py``, ``HyperConnections(num_residual_streams=1,
num_fracs=m)``, ``split_fracs`` / ``merge_fracs``; read at its commit 4775103) computes a generalisation that is
not this: its ``B`` is a full m x m matrix (every fraction of the branch output goes to every fraction, weight 1
at initialisation: ``h'_j = ... + sum_i o_i``), and its static mixing is laid out so that at initialisation the
branch input is not x (m = 2: ``[h_1, h_1]``; m = 4: ``[h_1, h_1, h_1, h_3]``) nor, for m >= 3, the carried
fractions (m = 4: ``[h_1, h_1, h_2, h_4]``): its model does not start as Pre-LN. This module follows the paper.

Computation (the same function, in hyper-connections' machinery: :class:`~fairseq_residual.schemes.
hyper_connections.TanhConnection`): the m fractions of every position are rows of one projection with
``[W_gamma | W_alpha | w_beta]`` ((C/m) x (2m + 1)), LN applied after it (:func:`~fairseq_residual.stream_ops.
layer_norm_projection`); branch input and carried fractions from one (2m x m) by (m x C/m) product per position;
coefficients and mixing in at least fp32 and never below the hidden state's precision. The state is one stream
(T x B x C), as Pre-LN's; the stack output is ``LN_final(x)`` (Algorithm 1: the concatenation, then the final
norm). The update's weights ``B`` go from ``prepare`` to ``update`` in the state between them, after the carried
fractions: the layers return no context. Incremental decoding needs no cache: every coefficient depends on its own
position.

The project's reading of the encoder-decoder case (the paper is decoder-only): every sub-layer, cross-attention
included, has its own frac-connection; cross-attention's keys and values are the encoder output. Parameters per
sub-layer (Algorithm 2's names): ``{kind}_residual.static_alpha`` (m x 2m = ``[Y | A]``), ``static_beta`` (m),
``dynamic_alpha_fn`` ((C/m) x 2m = ``[W_gamma | W_alpha]``), ``dynamic_alpha_scale``, ``dynamic_beta_fn`` (C/m),
``dynamic_beta_scale``.
"""
from dataclasses import dataclass
from typing import List, Tuple

import torch
from torch import Tensor

from ..residual import NORM_INPUT
from .base import STACKS, Option, OptionError, ResidualScheme
from .hyper_connections import NO_WEIGHT_DECAY, TanhConnection
from ..user_errors import SettingError


@dataclass(frozen=True)
class FracConnectionsOptions:
    """Attributes: fracs: m, the number of fractions of the hidden state; dynamic: the dynamic connection
    (eq. 11-14) on top of the static one."""

    fracs: int = 4
    dynamic: bool = True


class FracConnection(TanhConnection):
    """One sub-layer's frac-connection over the state ``[x]`` (T x B x C, split into m fractions of C/m).

    Args:
        site: the sub-layer. fracs: m (a divisor of the width). dynamic: add the dynamic connection.
    """

    NORM = NORM_INPUT

    def __init__(self, site, fracs: int, dynamic: bool):
        super().__init__(site)
        m, c = fracs, site.embed_dim
        if c % m:
            raise SettingError(f"--frac-connections-fracs {m} does not divide the width {c} of the {site.stack}")
        self.n_fracs = m
        self.compile_training = False
        self.coefficient_in_context = False  # B goes to update in the state: the layers return no context
        # [Y | A] = [I | I], m x 2m; B = 1 (eq. 15)
        self._connection_parameters(torch.cat([torch.eye(m), torch.eye(m)], dim=1), torch.ones(m), c // m, dynamic)

    def coefficients(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """``(Y, A, B)``: Y and A T x B x m x m (row i: fraction i's weights, ``x_in_j = sum_i Y[i, j] h_i``,
        ``h'_j = sum_i A[i, j] h_i + B[j] o_j``), B T x B x m, for the hidden state x (T x B x C), in at least fp32
        and never below its precision."""
        t, b, c = x.shape
        m = self.n_fracs
        dtype = torch.promote_types(x.dtype, torch.float32)
        h = x.reshape(t * b * m, c // m).to(dtype)
        coef = self._connection(h, m).expand(t * b, m, 2 * m + 1).reshape(t, b, m, 2 * m + 1)
        return coef[..., :m], coef[..., m: 2 * m], coef[..., 2 * m]

    def prepare_streams(self, state: List[Tensor]) -> Tuple[Tensor, List[Tensor]]:
        """One mixing product per position, ``[Y | A]^T`` (2m x m) times the fractions (m x C/m): the branch input
        ``Cat_j(sum_i Y[i, j] h_i)`` (T x B x C, its own storage, so that what the branch keeps for its backward does
        not hold the carried fractions) and the carried ``Cat_j(sum_i A[i, j] h_i)`` (T x B x C), with ``B``
        (T x B x m) for :meth:`update`."""
        x = state[0]
        t, b, c = x.shape
        m = self.n_fracs
        p = t * b
        dtype = torch.promote_types(x.dtype, torch.float32)
        h = x.reshape(p, m, c // m).to(dtype)
        coef = self._connection(h.reshape(p * m, c // m), m)  # P x m x (2m + 1), or m x (2m + 1) static
        mixed = coef[..., : 2 * m].transpose(-1, -2) @ h  # P x 2m x C/m
        branch, carried = mixed.split([m, m], dim=1)  # split, not slices: no zero-filled gradients
        beta = coef[..., 2 * m].expand(p, m)
        return (branch.contiguous().to(x.dtype).view(t, b, c),
                [carried.to(x.dtype).reshape(t, b, c), beta.reshape(t, b, m).to(x.dtype)])

    def update_streams(self, state: List[Tensor], out: Tensor) -> List[Tensor]:
        """``h'_j = carried_j + B[j] o_j`` for every fraction j, T x B x C."""
        carried, beta = state[0], state[1]
        t, b, c = carried.shape
        m = self.n_fracs
        new = torch.addcmul(carried.reshape(t, b, m, c // m), beta.unsqueeze(-1), out.reshape(t, b, m, c // m))
        return [new.view(t, b, c)]

    @torch.jit.unused
    def width_mixing(self, x: Tensor, mask: Tensor) -> Tensor:
        """The mean mixing M of the carried fractions (m x m, as h' = M h: ``M[j, i] = A[i, j]``) over the
        positions of ``mask`` (T x B, True at real tokens), for analysis."""
        return self.coefficients(x)[1][mask].mean(dim=0).t()

    def extra_repr(self):
        return f"fracs={self.n_fracs}, {'dynamic' if self.dynamic_alpha_fn is not None else 'static'}"


class FracConnections(ResidualScheme):
    name = "frac_connections"
    label = "Frac-connections"
    scheme_id = 23
    color = "limegreen"
    update = ("x split into m fractions h_i; x_in = Cat_j(sum_i Y[i,j] h_i); o = drop(F(LN(x_in))); "
              "h'_j = sum_i A[i,j] h_i + B[j] o_j; Y, A, B static + s tanh(LN(h_i) W); no widening")
    output = "LN_final(x)"
    init = ("`Y = A = I`, `B = 1`, dynamic `W = 0`, `s = 0.01` (eq. 15): it starts as Pre-LN; static parts without "
            "weight decay (fairseq's `optim_overrides`)")
    source = "Zhu et al. 2025, arXiv 2503.14125, eq. 6-15, Alg. 1-2"
    reference = ("the paper's Algorithm 2 (`FracConnection`); lucidrains/hyper-connections `num_fracs` computes a "
                 "generalisation (full m x m `B`) that does not start as Pre-LN")
    reading = ("every sub-layer, cross-attention included, has its own frac-connection; the state is one stream, as "
               "Pre-LN's")
    recipe = ("the baseline's recipe unchanged (OLMo2-1B2, OLMoE-1.3B / 7B; m = 4, dynamic; m = 2 gives most of the "
              "gain); no weight decay on the static parts.")
    optim_overrides = "its static connection weights without weight decay"
    optim_overrides_keys = frozenset(NO_WEIGHT_DECAY)
    fp16_advice = ("`--fp16` with weight decay needs `--fp16-no-flatten-grads` (as `hyper_connections`); as Pre-LN "
                   "otherwise (coefficients computed in fp32)")
    OPTIONS = (
        Option("frac_connections_fracs", int, 4, "number m of fractions the hidden state is split into (a divisor of "
               "the model width)", low=1, high=64, metavar="M"),
        Option("frac_connections_dynamic", bool, True, "dynamic frac-connections (paper eq. 11-14) on top of the "
               "static ones (--frac-connections-dynamic, the default) or static ones only (--frac-connections-static)",
               negative="--frac-connections-static"),
    )

    def options(self, args):
        return FracConnectionsOptions(fracs=int(args.frac_connections_fracs),
                                      dynamic=bool(args.frac_connections_dynamic))

    def check_args(self, args):
        """The base refusals, flat ``--fp16`` with weight decay (as hyper-connections), and a number of fractions
        that does not divide a stack's width.

        Raises:
            ValueError: naming the flag, the width and the fix.
        """
        super().check_args(args)
        m = getattr(args, "frac_connections_fracs", None)
        for stack in STACKS:
            c = getattr(args, f"{stack}_embed_dim", None)
            if m is not None and c is not None and int(c) % int(m):
                divisors = [d for d in range(1, min(int(c), 64) + 1) if int(c) % d == 0]
                raise OptionError(
                    f"--frac-connections-fracs {m} does not divide --{stack}-embed-dim {c}: the hidden state is split "
                    f"into m fractions of equal width; use a divisor of {c} ({', '.join(map(str, divisors))})")

    def sublayer_residual(self, cfg, site):
        opts = cfg.residual_options.params
        return FracConnection(site, opts.fracs, opts.dynamic)


SCHEME = FracConnections()

"""ResiDual (Pre-Post-LN; Xie et al. 2023, arXiv 2304.14802, section 3.2, eq. 4-6).

Each stack carries two streams, updated once per **sub-layer** (twice per encoder layer, three times per
decoder layer) with the *same* dropped-out branch output ``h = drop(F(x_a))``:

* ``x_a``, the Post-LN stream: ``x_a = LN(x_a + h)``, and
* ``x_d``, the dual stream: ``x_d = x_d + c * h``, never normalised inside the stack.

Both start from the embedding output (``x_a = emb``, ``x_d = c * emb``), and the stack output is
``alpha * x_a + LN_final(x_d)``, with ``LN_final`` eps 1e-7, for the encoder (its output feeds
cross-attention) and the decoder (its output goes to the output projection); this is what the authors'
code (github.com/microsoft/ResiDual, ``resi_dual/``) computes. ``c`` (``--resi-dual-scale``, per stack)
keeps the running sum inside the fp16 range: ``LN(c*x) = LN(x)``, exactly here, as LN_final's eps scales
with c^2 (the authors' code keeps it at 1e-7). ``alpha`` is the weight of the
Post-LN stream in the output (1 in the paper).

Ablation, off by default: ``--resi-dual-start-from zeros`` starts the dual stream from zeros instead of the
embedding output (the authors' code has that line commented out). With ``x_d = c * emb`` and shared
embeddings, ``LN_final(x_d)`` of a shallow or young model is dominated by the input token's embedding, so
the decoder output carries a copy of the previous token into the logits; starting from zeros removes that
term: ``x_d = c * sum(h)``.

``x_d`` at position t depends only on position t's own sub-layer outputs, so incremental decoding needs
no cached state for it: the attention key/value caches (reordered by fairseq's
``reorder_incremental_state``) are all that carries across time steps.

Over the residual protocol: the state is ``[x_a, x_d]`` (:class:`ResiDualResidual` per sub-layer,
:class:`ResiDualStack` per stack); the stack's ``layer_norm`` is ``LN_final`` (same parameter name as
fairseq's Pre-LN final norm), applied to ``x_d``.
"""
from dataclasses import dataclass
from typing import Dict, List

import torch
from torch import Tensor

from ..residual import NORM_OUTPUT, StackResidual, StreamRange, SublayerResidual
from .base import Option, ResidualScheme

#: eps of ResiDual's final LayerNorm over the dual stream at c = 1 (the authors' value; fairseq's default is
#: 1e-5). The stack's LN_final uses ``FINAL_LN_EPS * c**2``, so that ``LN_final(c * x_d) = LN_final(x_d)``
#: exactly, whatever c: with the authors' fixed 1e-7 a c below about 0.02 changes the model (log-probs of a
#: tiny model move by 2e-4 at c = 0.02, 8e-4 at 0.01, 0.08 at 0.001; tests/test_resi_dual_scale.py).
FINAL_LN_EPS = 1e-7
#: What the dual stream can start from: the embedding output (the authors' code) or zeros (ablation).
START_FROM = ("embedding", "zeros")
#: the smallest dual-stream scale c: smaller values would push c*h (h ~ 1e-2) towards fp16's subnormals,
#: where it loses precision; 0.01 leaves 5x more fp16 headroom than the authors' 0.05
MIN_SCALE = 0.01


@dataclass(frozen=True)
class ResiDualOptions:
    """ResiDual's constants of one model (validated by the scheme's :attr:`~ResiDual.OPTIONS`).

    Attributes:
        encoder_scale, decoder_scale: dual-stream scale c per stack.
        encoder_alpha, decoder_alpha: weight alpha of ``x_a`` in the stack output.
        start_from: what the dual stream starts from, ``embedding`` (the authors' code) or ``zeros``.
    """

    encoder_scale: float = 1.0
    decoder_scale: float = 1.0
    encoder_alpha: float = 1.0
    decoder_alpha: float = 1.0
    start_from: str = "embedding"

    def scale(self, stack):
        """Dual-stream scale c of ``stack`` ('encoder' or 'decoder')."""
        return self.encoder_scale if stack == "encoder" else self.decoder_scale

    def alpha(self, stack):
        """Output weight alpha of ``stack`` ('encoder' or 'decoder')."""
        return self.encoder_alpha if stack == "encoder" else self.decoder_alpha


def add_to_dual_stream(x_d: Tensor, h: Tensor, scale: float) -> Tensor:
    """Dual-stream update ``x_d + c * h`` (one fused op; paper eq. 5).

    Args:
        x_d: dual stream, T x B x C.
        h: dropped-out sub-layer output, T x B x C.
        scale: the stack's dual-stream scale c.
    """
    if scale != 1.0:
        return torch.add(x_d, h, alpha=scale)
    return x_d + h


class ResiDualResidual(SublayerResidual):
    """One sub-layer of ResiDual: state ``[x_a, x_d]``; ``x_a = LN(x_a + h)``, ``x_d = x_d + c*h``, with the
    same ``h = drop(F(x_a))``.

    Args:
        site: the sub-layer.
        scale: the stack's dual-stream scale c.
    """

    NORM = NORM_OUTPUT

    def __init__(self, site, scale: float):
        super().__init__(site)
        self.dual_scale = float(scale)

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        return [state[0] + out, add_to_dual_stream(state[1], out, self.dual_scale)]

    def extra_repr(self):
        return f"c={self.dual_scale:g}"


class ResiDualStack(StackResidual):
    """ResiDual's two streams in one stack: start ``[emb, c*emb]`` (or ``[emb, 0]``), output
    ``alpha * x_a + LN_final(x_d)`` (paper eq. 6); the view is ``x_a``, the extra stream ``x_d``.

    Args:
        stack, num_layers, embed_dim: as :class:`~fairseq_residual.residual.StackResidual`.
        scale: c; alpha: the weight of ``x_a``; start_zeros: start ``x_d`` from zeros.
    """

    def __init__(self, stack: str, num_layers: int, embed_dim: int, scale: float, alpha: float, start_zeros: bool):
        super().__init__(stack, num_layers, embed_dim)
        self.dual_scale = float(scale)
        self.resi_dual_alpha = float(alpha)
        self.dual_start_zeros = bool(start_zeros)

    def start(self, x: Tensor) -> List[Tensor]:
        """``x_d = c * x``; x itself when c == 1 (no copy: the dual stream is only ever updated out of
        place); zeros with ``--resi-dual-start-from zeros``."""
        if self.dual_start_zeros:
            return [x, torch.zeros_like(x)]
        if self.dual_scale == 1.0:
            return [x, x]
        return [x, x * self.dual_scale]

    def final_input(self, state: List[Tensor]) -> Tensor:
        return state[1]

    def finish(self, state: List[Tensor], normed: Tensor) -> Tensor:
        """``alpha * x_a + LN_final(x_d)``, T x B x C."""
        return torch.add(normed, state[0], alpha=self.resi_dual_alpha)

    @torch.jit.unused
    def streams(self, state: List[Tensor]) -> Dict[str, Tensor]:
        return {"x_d": state[1]}

    @torch.jit.unused
    def ranged_stream(self):
        """``x_d``, scaled by c, read by ``LN_final`` (eps :data:`FINAL_LN_EPS` at c = 1): the analysis tool's
        ``dual_stream`` report and its ``--resi-dual-scale`` rule."""
        return StreamRange("x_d", scale=self.dual_scale, norm_eps=FINAL_LN_EPS)

    def extra_repr(self):
        return f"c={self.dual_scale:g}, alpha={self.resi_dual_alpha:g}, start={'zeros' if self.dual_start_zeros else 'embedding'}"


def _scale_option(dest, help):
    shared = dest == "resi_dual_scale"
    return Option(dest, float, 1.0 if shared else None, help, low=MIN_SCALE, high=1.0, metavar="C",
                  default_text=None if shared else "--resi-dual-scale")


class ResiDual(ResidualScheme):
    name = "resi_dual"
    label = "ResiDual"
    scheme_id = 2
    builds_on = "post_ln"
    color = "tab:green"
    update = "h = drop(F(x_a)); x_a = LN(x_a + h); x_d = x_d + c*h"
    output = "alpha * x_a + LN_final(x_d)"
    init = ("streams start at `x_a = emb`, `x_d = c*emb`; `LN_final` eps `1e-7 c^2`, so that "
            "`LN_final(c x) = LN_final(x)` exactly")
    source = "Xie et al. 2023, arXiv 2304.14802, sec. 3.2, eq. 4-6"
    reference = "microsoft/ResiDual `resi_dual/`"
    recipe = ("the authors' configs (github.com/microsoft/ResiDual, reproduced in `configs/`): Adam (0.9, 0.98), "
              "inverse_sqrt warm-up 4000 from 1e-7; IWSLT14 lr 5e-4, dropout 0.3; WMT14 lr 1e-3; OPUS-100 lr 4e-3, "
              "warm-up 8000, dropout 0.1, fp16 with `c = 0.05`.")
    fp16_advice = ("its dual stream `x_d` grows with depth and training: `--resi-dual-scale` from "
                   "`fairseq-residual-analyze`'s `safe_scale` on your checkpoint (the authors use 0.05)")
    final_norm_eps = FINAL_LN_EPS
    final_norm_needed = ("the output is x_a + LN_final(x_d) (paper eq. 6): the dual stream x_d is the unnormalised sum "
                         "of every sub-layer's output, scaled by c, and LN_final is what brings it to x_a's scale")
    OPTIONS = (
        _scale_option("resi_dual_scale", "scale c of the dual stream, x_d = c*emb + c*sum(h), for both stacks; "
                      "a small c (e.g. 0.05) keeps x_d inside the fp16 range without changing the output: "
                      "LN_final(c*x) = LN_final(x), its eps scaled by c^2"),
        _scale_option("encoder_resi_dual_scale", "dual-stream scale c of the encoder"),
        _scale_option("decoder_resi_dual_scale", "dual-stream scale c of the decoder"),
        Option("encoder_resi_dual_alpha", float, 1.0, "weight alpha of the Post-LN stream in the encoder output "
               "alpha*x_a + LN(x_d)", low=0.0, high=10.0, metavar="A"),
        Option("decoder_resi_dual_alpha", float, 1.0, "weight alpha of the Post-LN stream in the decoder output "
               "alpha*x_a + LN(x_d)", low=0.0, high=10.0, metavar="A"),
        Option("resi_dual_start_from", str, "embedding", "start the dual stream from the embedding output, "
               "x_d = c*emb (the authors' code), or from zeros, x_d = c*sum(h) (ablation)", choices=START_FROM),
    )

    norm_refusals = dict.fromkeys(("dyt", "derf"), (
        "with a dual-stream scale c below 1 (--resi-dual-scale; the opus100 preset's 0.05): c is a pure fp16 range "
        "device because LN_final(c x) = LN_final(x) (eps scaled by c^2), which holds for LayerNorm and RMSNorm, "
        "not for DyT's tanh(a c x) or Derf's erf(a c x + s): c would change the model; use --resi-dual-scale 1"))

    def norm_refusal(self, norm, args):
        """DyT and Derf only where both stacks' c is 1 (:attr:`norm_refusals`)."""
        scales = [getattr(args, f"{s}_resi_dual_scale", None) or getattr(args, "resi_dual_scale", 1.0) or 1.0
                  for s in ("encoder", "decoder")]
        if norm in self.norm_refusals and all(float(c) == 1.0 for c in scales):
            return None
        return super().norm_refusal(norm, args)

    def fill_defaults(self, args):
        super().fill_defaults(args)
        for stack in ("encoder", "decoder"):
            if getattr(args, f"{stack}_resi_dual_scale", None) is None:
                setattr(args, f"{stack}_resi_dual_scale", args.resi_dual_scale)

    def given_options(self, args, typed=frozenset()):
        per_stack = [f"--{s}-resi-dual-scale" for s in ("encoder", "decoder") if f"{s}_resi_dual_scale" in typed
                     or getattr(args, f"{s}_resi_dual_scale", None) not in (None, getattr(args, "resi_dual_scale", 1.0))]
        return super().given_options(args, typed) + per_stack

    def options(self, args):
        return ResiDualOptions(
            encoder_scale=float(args.encoder_resi_dual_scale),
            decoder_scale=float(args.decoder_resi_dual_scale),
            encoder_alpha=float(args.encoder_resi_dual_alpha),
            decoder_alpha=float(args.decoder_resi_dual_alpha),
            start_from=args.resi_dual_start_from,
        )

    def final_norm(self, cfg, stack):
        """LN_final's eps, ``FINAL_LN_EPS * c**2``: LN_final(c * x_d) is LN_final(x_d) for every c."""
        return FINAL_LN_EPS * cfg.residual_options.params.scale(stack) ** 2

    def sublayer_residual(self, cfg, site):
        return ResiDualResidual(site, cfg.residual_options.params.scale(site.stack))

    def stack_residual(self, cfg, stack, num_layers, embed_dim):
        opts: ResiDualOptions = cfg.residual_options.params
        return ResiDualStack(stack, num_layers, embed_dim, opts.scale(stack), opts.alpha(stack),
                             opts.start_from == "zeros")


SCHEME = ResiDual()

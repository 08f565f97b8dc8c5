"""Depth-µP and CompleteP: Pre-LN with every residual branch scaled down by a power of the depth,

    x = x + (L_base / L)^alpha * drop(F(LN(x)))        per sub-layer F (self-attention, cross-attention, FFN)

x: T x B x C, with a final LayerNorm at the end of each stack, ``LN_final(x)``, as Pre-LN. ``alpha``
(``--depth-alpha``) is 1/2 for Depth-µP (Yang, Yu, Zhu, Hayou 2023, "Tensor Programs VI: Feature Learning in
Infinite-Depth Neural Networks", arXiv 2310.02244; Bordelon et al. 2023, arXiv 2309.16620: branches scaled by
``1/sqrt(L)``) and 1 for CompleteP (Dey et al. 2025, "Don't be lazy: CompleteP enables compute-efficient deep
transformers", arXiv 2505.01618, which parameterises ``alpha`` in [1/2, 1]); L_base (``--depth-base``) is the
depth of the base model whose hyper-parameters are transferred: at ``L = L_base`` the model is Pre-LN itself.
The multiplier commutes with the residual dropout. No parameters, no change of fairseq's initialisation.

Optimizer side, as the CompleteP reference code computes it (Cerebras' llm-foundry fork,
``llmfoundry/models/mpt/modeling_mpt_completep.py``, ``get_optimizer_param_groups``, with
``depth_multiplier = L / L_base``): every parameter of the layers (the "hidden" weights, biases and
LayerNorms; not the embeddings, the output projection or the final LayerNorms) trains with

    Adam learning rate  x (L / L_base)^(alpha - 1)         (1 at alpha = 1: no depth learning-rate change)
    Adam eps            x (L / L_base)^(-alpha)

The learning-rate factor is a multiplier on whatever the scheduler sets (``lr_scale`` of the parameters'
``optim_overrides``, which :mod:`fairseq_residual.optim_groups` keeps in the parameter group and re-applies after
every ``set_lr``; saved and resumed with the optimizer's groups); the eps factor multiplies ``--adam-eps`` (any
optimizer whose group has a numeric ``eps``). Where this differs from the reference: the reference multiplies
the one optimizer-wide eps, here only the layers' (the two stacks of an encoder-decoder have their own L, and
embeddings may be shared between them); its weight decay of 0 for LayerNorms and biases and every width rule of
µP (initialisation variance, learning rate and eps x d_base/d, output multiplier) are out of scope: the width is
the base model's.

Encoder-decoder (the project's reading; the papers are decoder-only): L counts per stack, as DeepNorm's separate
encoder and decoder constants: N for every sub-layer of the encoder, M for the decoder's (cross-attention
included), each stack being its own residual stream whose branches sum. L counts layers, not sub-layers: the
factor depends only on L / L_base, which is the same for both counts within a stack (2 sub-layers per encoder
layer, 3 per decoder layer, 2 without cross-attention), so ``--depth-base`` is a number of layers of the same
stack. The trained depth is used (``--*-layers-to-keep`` keeps a pruned model's constants).
"""
from dataclasses import dataclass
from typing import Dict, List

from torch import Tensor

from ..optim_groups import EPS_SCALE, LR_SCALE
from ..residual import SublayerResidual, with_main
from .base import STACKS, Option, ResidualScheme


@dataclass(frozen=True)
class DepthMuPOptions:
    """Attributes: alpha: the depth exponent; base: L_base, the base model's layers per stack."""

    alpha: float = 0.5
    base: int = 6


def depth_factors(layers: int, base: int, alpha: float) -> Dict[str, float]:
    """The depth constants of a stack of ``layers`` layers (L) with base depth ``base`` (L_base).

    Returns:
        dict with ``branch`` = (L_base/L)^alpha, ``lr_scale`` = (L/L_base)^(alpha-1), ``eps_scale`` =
        (L/L_base)^(-alpha) (floats).
    """
    ratio = float(layers) / float(base)
    return dict(branch=ratio ** -alpha, lr_scale=ratio ** (alpha - 1.0), eps_scale=ratio ** -alpha)


class DepthMuPResidual(SublayerResidual):
    """``x = x + branch * h``, ``h = drop(F(LN(x)))``, ``branch = (L_base/L)^alpha`` of the sub-layer's stack.

    Args:
        site: the sub-layer (its stack gives L). options: the scheme's :class:`DepthMuPOptions`.
    """

    def __init__(self, site, options: DepthMuPOptions):
        super().__init__(site)
        layers = site.encoder_layers if site.stack == "encoder" else site.decoder_layers
        self.branch_scale = depth_factors(layers, options.base, options.alpha)["branch"]

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        return with_main(state, state[0] + out * self.branch_scale)

    def extra_repr(self):
        return f"{super().extra_repr()}, branch_scale={self.branch_scale:.4g}"


class DepthMuP(ResidualScheme):
    name = "depth_mup"
    label = "Depth-µP"
    scheme_id = 25
    color = "deeppink"
    update = "x = x + (L_base/L)^alpha * drop(F(LN(x))), L = layers of the stack (N or M), alpha 1/2 or 1 (CompleteP)"
    output = "LN_final(x)"
    init = ("no change; the layers' parameters train with Adam lr x `(L/L_base)^(alpha-1)` and eps x "
            "`(L/L_base)^(-alpha)`")
    source = ("Depth-µP: Yang et al. 2023, arXiv 2310.02244, and Bordelon et al. 2023, arXiv 2309.16620 (alpha 1/2); "
              "CompleteP: Dey et al. 2025, arXiv 2505.01618 (alpha 1)")
    reference = ("Cerebras' llm-foundry fork, `llmfoundry/models/mpt/modeling_mpt_completep.py` (the optimizer's "
                 "groups; eps scaled for the layers only here, µP's width rules left out)")
    reading = ("L counts the layers of each stack (N for the encoder, M for the decoder, cross-attention "
               "included), as DeepNorm's separate constants; L_base is in layers")
    recipe = ("decoder-only LMs transferring hyper-parameters from a base depth (CompleteP: AdamW, µP width rules, "
              "L_base of a few layers); no translation recipe.")
    optim_overrides = "the layers' parameters with their own learning rate and eps"
    optim_overrides_keys = frozenset({LR_SCALE, EPS_SCALE})
    fp16_advice = ("`--fp16` needs `--fp16-no-flatten-grads` (fairseq's flat fp32 copy has no room for the layers' "
                   "own learning rate and eps); as Pre-LN: its stream grows with depth and training and has no scale: "
                   "measure a checkpoint, and train in bf16 where the peak nears a tenth of 65,504")
    OPTIONS = (
        Option("depth_alpha", float, 0.5, "depth exponent alpha of the branch multiplier (L_base/L)^alpha: 0.5 "
               "Depth-µP, 1 CompleteP", low=0.5, high=1.0, metavar="ALPHA"),
        Option("depth_base", int, 6, "L_base, the layers per stack of the base model whose hyper-parameters are "
               "transferred (the model is Pre-LN at L = L_base)", low=1, metavar="L"),
    )

    def options(self, args):
        return DepthMuPOptions(alpha=float(args.depth_alpha), base=int(args.depth_base))

    def sublayer_residual(self, cfg, site):
        return DepthMuPResidual(site, cfg.residual_options.params)

    def initialize(self, model, options):
        """Give every parameter of each stack's layers the optimizer overrides of its stack
        (``lr_scale``, ``eps_scale``: :func:`depth_factors` of the trained depth)."""
        opts = options.params
        for stack in STACKS:
            factors = depth_factors(options.depth(stack), opts.base, opts.alpha)
            overrides = {"lr_scale": factors["lr_scale"], "eps_scale": factors["eps_scale"]}
            for param in getattr(model, stack).layers.parameters():
                param.optim_overrides = dict(overrides)


SCHEME = DepthMuP()

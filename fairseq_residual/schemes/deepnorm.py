"""DeepNorm (DeepNet; Wang et al. 2022, arXiv 2203.00555, section 3 and figure 2):
``x = LN(alpha * x + drop(F(x)))`` after every sub-layer, with a depth-scaled initialisation.

For an encoder-decoder with N encoder and M decoder layers, as microsoft/torchscale computes it
(``torchscale/architecture/encoder.py`` and ``decoder.py``):

* encoder: ``alpha = 0.81 * (N^4 M)^(1/16)``, ``beta = 1.15 * (N^4 M)^(-1/16)``,
* decoder: ``alpha = (3M)^(1/4)``, ``beta = (12M)^(-1/4)``,

the same alpha for every sub-layer of a stack (self-attention, cross-attention, FFN). After fairseq's
default initialisation every parameter of a stack whose name contains ``fc1``, ``fc2``, ``v_proj`` or
``out_proj`` (weights and biases; self- and cross-attention) is multiplied by that stack's beta;
``q_proj`` and ``k_proj`` keep theirs. No stack LayerNorm, no embedding LayerNorm.

Where the references differ (documented, not selectable): the paper's pseudo-code and
LiyuanLucasLiu/Transformer-Clinic use ``beta_enc = 0.87 * (N^4 M)^(-1/16)`` and re-draw the scaled
matrices with ``xavier_normal_(gain=beta)`` (biases 0, q/k gain 1) instead of scaling the default
initialisation (see github.com/microsoft/torchscale/issues/16). Decoder beta and both alphas agree.

The sub-layers are fairseq's; the residual is :class:`DeepNormResidual` over the residual protocol.
"""
from typing import Dict, List

from torch import Tensor

from ..residual import NORM_OUTPUT, SublayerResidual, with_main
from .base import ResidualScheme

#: Parameters whose initialisation DeepNorm scales by beta (torchscale's ``deepnorm`` init).
BETA_SCALED = ("fc1", "fc2", "v_proj", "out_proj")


def deepnorm_constants(encoder_layers: int, decoder_layers: int):
    """DeepNorm's constants of an encoder-decoder with N encoder and M decoder layers.

    Returns:
        dict with ``encoder_alpha``, ``encoder_beta``, ``decoder_alpha``, ``decoder_beta`` (floats).

    Source: Wang et al. 2022, table 1 (encoder-decoder column), with torchscale's encoder beta
    (``1.15 * (N^4 M)^(-1/16)``, torchscale/architecture/encoder.py).
    """
    n, m = float(encoder_layers), float(decoder_layers)
    return dict(
        encoder_alpha=0.81 * (n ** 4 * m) ** (1 / 16),
        encoder_beta=1.15 * (n ** 4 * m) ** (-1 / 16),
        decoder_alpha=(3 * m) ** (1 / 4),
        decoder_beta=(12 * m) ** (-1 / 4),
    )


class DeepNormResidual(SublayerResidual):
    """``x = LN(alpha * x + h)``, ``h = drop(F(x))``, alpha the stack's constant.

    Args:
        site: the sub-layer (its stack and N, M give alpha).
    """

    NORM = NORM_OUTPUT

    def __init__(self, site):
        super().__init__(site)
        self.alpha = deepnorm_constants(site.encoder_layers, site.decoder_layers)[f"{site.stack}_alpha"]

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        return with_main(state, state[0] * self.alpha + out)

    def extra_repr(self):
        return f"alpha={self.alpha:.4f}"


class DeepNorm(ResidualScheme):
    name = "deepnorm"
    label = "DeepNorm"
    scheme_id = 3
    builds_on = "post_ln"
    color = "tab:purple"
    update = "x = LN(alpha*x + drop(F(x))), alpha: encoder 0.81(N^4 M)^(1/16), decoder (3M)^(1/4)"
    output = "x"
    init = ("fc1, fc2, v_proj, out_proj (weights and biases) x beta: encoder `1.15(N^4 M)^(-1/16)`, decoder "
            "`(12M)^(-1/4)`")
    source = "Wang et al. 2022, arXiv 2203.00555, sec. 3, table 1"
    reference = ("microsoft/torchscale `torchscale/architecture/encoder.py`, `decoder.py` (the paper's pseudo-code and "
                 "Transformer-Clinic: encoder beta 0.87 and a xavier re-draw; microsoft/torchscale issue 16)")
    recipe = ("neither torchscale nor Transformer-Clinic ships a DeepNorm translation recipe; torchscale's MT "
              "example (`examples/fairseq/README.md`) trains with Adam (0.9, 0.98), lr 5e-4, inverse_sqrt warm-up "
              "4000, dropout 0.3, weight decay 1e-4: the Post-LN recipe of `configs/`.")
    fp16_advice = "fp16 as is: renormalised after every sub-layer"
    final_norm_eps = None
    norm_refusals = dict.fromkeys(("dyt", "derf"), (
        "alpha and beta come from bounding the model update of a Post-LN whose LN(alpha x + F(x)) brings every "
        "sub-layer's sum back to unit scale (arXiv 2203.00555 sec. 4); DyT's tanh(a x) and Derf's erf(a x + s) do "
        "not normalise, so alpha x would compound through the stack and the derivation no longer holds"))

    def sublayer_residual(self, cfg, site):
        return DeepNormResidual(site)

    def initialize(self, model, options):
        """Multiply fc1, fc2, v_proj and out_proj (weights and biases) of each stack by its beta, from the trained
        N and M (``options``), the depth the sub-layers' alpha is computed from
        (:class:`~fairseq_residual.residual.Site`)."""
        const = deepnorm_constants(options.depth("encoder"), options.depth("decoder"))
        for stack in ("encoder", "decoder"):
            beta = const[f"{stack}_beta"]
            for name, param in getattr(model, stack).layers.named_parameters():
                if any(f".{key}." in f".{name}" for key in BETA_SCALED):
                    param.data.mul_(beta)


SCHEME = DeepNorm()

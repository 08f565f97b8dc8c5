"""Mix-LN (Li, Yin, Liu 2025, "Mix-LN: Unleashing the Power of Deeper Layers by Combining Pre-LN and
Post-LN", arXiv 2412.13795, ICLR 2025): the first ``floor(a * L)`` layers of a stack are Post-LN, the others
Pre-LN, and the stack ends with a final LayerNorm:

    layer l < floor(a L):   x = LN(x + drop(F(x)))       per sub-layer
    layer l >= floor(a L):  x = x + drop(F(LN(x)))
    output:                 LN_final(x)

with l the 0-based layer index, L the stack's number of layers and ``a = --mix-ln-fraction`` (default
0.25, the paper's and pixeli99/MixLN's ``POST_NUM / L``), as pixeli99/MixLN computes it
(``peft_pretraining/modeling_llama.py``, ``LlamaDecoderLayer`` with ``NORM_TYPE=post_pre``; the final
RMSNorm is always applied). Nothing happens at the transition: the first Pre-LN layer receives the
LayerNorm-ed output of the last Post-LN layer.

Encoder-decoder (the project's reading): the fraction applies per stack (``floor(a N)`` encoder and
``floor(a M)`` decoder layers are Post-LN; at 6+6 and a = 0.25 one layer per stack); a decoder's
Post-LN layers are Post-LN in all three sub-layers. ``a = 0`` is Pre-LN (with the protocol's layers),
``a = 1`` Post-LN with a final LayerNorm.

No parameters beyond fairseq's; fairseq's initialisation (the reference draws embeddings with std
sqrt(2/5), an LLaMA detail not part of the scheme).
"""
import logging
import math
from dataclasses import dataclass

from ..residual import PostLNResidual, SublayerResidual
from .base import Option, ResidualScheme

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MixLNOptions:
    """Attributes: fraction: the share a of each stack's layers that are Post-LN (the lowest ones)."""

    fraction: float = 0.25

    def post_ln_layers(self, layers: int) -> int:
        """``floor(a * L)``: how many of a stack's ``layers`` layers are Post-LN (rounding guarded)."""
        return int(math.floor(self.fraction * layers + 1e-9))


class MixLN(ResidualScheme):
    name = "mix_ln"
    label = "Mix-LN"
    scheme_id = 9
    color = "tab:gray"
    update = "layers l < floor(a L): x = LN(x + drop(F(x))); the others: x = x + drop(F(LN(x)))"
    output = "LN_final(x)"
    source = "Li, Yin, Liu 2025, arXiv 2412.13795"
    reference = "pixeli99/MixLN `peft_pretraining/modeling_llama.py` (`NORM_TYPE` `post_pre`)"
    reading = ("the fraction a applies per stack (floor(a N) encoder and floor(a M) decoder layers are Post-LN: one "
               "layer per stack at 6+6)")
    recipe = ("LLaMA on C4: Adam, no weight decay, bf16, about 10% warm-up, lr 1e-3 (71M) to 5e-4 (1B, 7B); "
              "`a = 0.25`, though the authors' own 7B run used 2 Post-LN layers of 32 (pixeli99/MixLN issue 1).")
    fp16_advice = "its stream grows with depth and training and has no scale: measure a checkpoint, and train in bf16 where the peak nears a tenth of 65,504"
    OPTIONS = (
        Option("mix_ln_fraction", float, 0.25, "share a of each stack's layers that are Post-LN (the lowest "
               "floor(a L)); the others are Pre-LN", low=0.0, high=1.0, metavar="A"),
    )

    def options(self, args):
        return MixLNOptions(fraction=float(args.mix_ln_fraction))

    def check_args(self, args) -> None:
        """fairseq's checks, and a warning where ``floor(a L)`` leaves a stack without a Post-LN layer (a = 0.25 at 2
        or 3 layers): that stack is Pre-LN's."""
        super().check_args(args)
        options = self.options(args)
        for stack in ("encoder", "decoder"):
            layers = getattr(args, f"{stack}_layers", None)
            if options.fraction > 0 and layers and options.post_ln_layers(int(layers)) == 0:
                logger.warning(
                    f"Mix-LN: --mix-ln-fraction {options.fraction:g} of {layers} {stack} layers is floor("
                    f"{options.fraction:g} x {layers}) = 0 Post-LN layers: the {stack} is Pre-LN's; a fraction of at "
                    f"least {1 / int(layers):.3g} (or more layers) gives it one")

    def sublayer_residual(self, cfg, site):
        if site.layer < cfg.residual_options.params.post_ln_layers(site.layers):
            return PostLNResidual(site)
        return SublayerResidual(site)


SCHEME = MixLN()

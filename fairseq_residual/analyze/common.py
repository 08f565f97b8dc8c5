"""What the parts of ``fairseq-residual-analyze`` share: names, sub-layer tables, the error."""
import logging
import os

from ..schemes import colors, labels

POST_LN, PRE_LN, RESI_DUAL = "post_ln", "pre_ln", "resi_dual"

PROG = "fairseq-residual-analyze"
#: the plugin folder (this package's parent), what --user-dir names
PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL = "all"
DEFAULT_ARCH = "residual_transformer_iwslt_de_en"

#: Sub-layers per stack, and the fairseq sub-module whose output is the sub-layer's branch ``h``.
SUBLAYERS = {"encoder": ("self_attn", "ffn"), "decoder": ("self_attn", "cross_attn", "ffn")}
HOOKED_MODULE = {"self_attn": "self_attn", "cross_attn": "encoder_attn", "ffn": "fc2"}
STACKS = ("encoder", "decoder")
SCHEME_NAMES = labels()
SUBLAYER_NAMES = {"self_attn": "self-attention", "cross_attn": "cross-attention", "ffn": "FFN"}
SCHEME_COLORS = colors()

logger = logging.getLogger("fairseq_residual.analyze")


class AnalyzeError(Exception):
    """Bad input; the message names the problem and the fix (printed without traceback, exit 2)."""

"""Pre-LN (Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture", arXiv 2002.04745):
``x = x + drop(F(LN(x)))`` and a final LayerNorm at the end of each stack.

fairseq's own layers and forward passes with ``normalize_before=True``: nothing is re-implemented, so
the scheme is fairseq's ``transformer --encoder-normalize-before --decoder-normalize-before`` bit for bit.
The protocol's default residual (:class:`~fairseq_residual.residual.SublayerResidual`) is the same
computation; schemes that build on Pre-LN (DLCL, Peri-LN, LayerNorm Scaling, ...) use it.
"""
from .base import ResidualScheme, SpeedGoal


class PreLN(ResidualScheme):
    name = "pre_ln"
    label = "Pre-LN"
    scheme_id = 1
    color = "tab:blue"
    update = "x = x + drop(F(LN(x)))"
    output = "LN_final(x)"
    source = "Xiong et al. 2020, arXiv 2002.04745, sec. 3"
    reference = "fairseq `fairseq/modules/transformer_layer.py` (`normalize_before=True`)"
    fp16_advice = ("its stream grows with depth and training and has no scale: measure a checkpoint, and train in bf16 where the peak nears a tenth of 65,504")
    fairseq_path = True
    normalize_before = True
    speed_goal = SpeedGoal(train=0.99)  # fairseq's own layers: within the noise of stock (1%)


SCHEME = PreLN()

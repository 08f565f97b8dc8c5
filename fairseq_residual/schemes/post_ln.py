"""Post-LN (Vaswani et al. 2017, "Attention Is All You Need", section 3.1): ``x = LN(x + drop(F(x)))``.

fairseq's own layers and forward passes with ``normalize_before=False``: nothing is re-implemented, so
the scheme is fairseq's ``transformer`` bit for bit, and the stack has no final LayerNorm.
"""
from .base import ResidualScheme, SpeedGoal


class PostLN(ResidualScheme):
    name = "post_ln"
    label = "Post-LN"
    scheme_id = 0
    builds_on = "post_ln"
    color = "tab:red"
    update = "x = LN(x + drop(F(x)))"
    output = "x"
    source = "Vaswani et al. 2017, arXiv 1706.03762, sec. 3.1"
    reference = "fairseq `fairseq/modules/transformer_layer.py` (`normalize_before=False`)"
    fp16_advice = "fp16 as is: renormalised after every sub-layer"
    fairseq_path = True
    final_norm_eps = None
    speed_goal = SpeedGoal(train=0.99)  # fairseq's own layers: within the noise of stock (1%)


SCHEME = PostLN()

"""DLCL, pre-norm (Wang et al. 2019, "Learning Deep Transformer Models for Machine Translation", ACL,
section 3, dynamic linear combination of layers):
``x_{l+1} = sum_{k=0..l} W[l,k] * LN_k(y_k)`` and stack output ``LN_final(sum_{k=0..L} W[L,k] * LN_k(y_k))``.

Per stack of L layers: y_0 is the embedding output (after dropout), y_k the output of layer k, a fairseq
Pre-LN layer (``x + drop(F(LN(x)))`` per sub-layer); LN_0 is the identity and LN_1..LN_L are L extra
LayerNorms; ``LN_final`` is fairseq's stack LayerNorm (``{encoder,decoder}.layer_norm``). W is a learnable
(L+1) x (L+1) matrix (the reference's ``--weight-type scalar``), initialised as the lower-triangular average
W[l,k] = 1/(l+1) for k <= l, 0 above; only row l's first l+1 entries are read, so at initialisation every
layer reads the mean of the normalised history. The combination is per layer, not per sub-layer.

As wangqiangneu/dlcl computes it (``fairseq/modules/dlcl.py``, ``DynamicLinearCombination`` with
``normalize_before=True``; ``fairseq/models/dlcl_transformer.py``), with its defaults: no softmax on W, no
history dropout, full window, y_0 not normalised (its ``--normalize-embedding`` flag has no effect).
Over the residual protocol, the combination is the stack's residual (:class:`DLCLStack`), the layers are
Pre-LN (the protocol's default residual). Parameters: ``{encoder,decoder}.residual.weight`` (the
reference's ``history.weight``, here 2-D as in its ``modules/layer_history.py``; ``dlcl.py`` stores an
(L+1) x (L+1) x 1 tensor) and ``{encoder,decoder}.residual.layer_norms.1..L`` (index 0 is the identity and
has no parameters); checkpoints of earlier versions of this plugin (``history.*``) are renamed on load.
The reference's post-norm variant is not implemented.

Incremental decoding needs no state beyond fairseq's attention caches: the combination mixes the outputs
of different layers at one position, never different positions, so at a decoding step the history of
the current position is rebuilt from that step's layer outputs (as the reference re-runs
clean/push/pop every step), and beam reordering only has to reorder the attention caches, which fairseq
does.

fairseq's layer-drop is refused: it would skip a layer and shift the history's indices.
"""
import re
from typing import List

import torch
from torch import Tensor, nn

from fairseq.modules import LayerNorm

from ..residual import StackResidual
from .base import ResidualScheme


def average_weight(num_layers: int) -> Tensor:
    """The reference's "avg" initialisation: (L+1) x (L+1), W[l,k] = 1/(l+1) for k <= l, 0 above."""
    n = num_layers + 1
    mask = torch.ones(n, n).tril()
    return mask / mask.sum(dim=1, keepdim=True)


class DLCLStack(StackResidual):
    """The learnable combination of one stack: ``weight`` (L+1) x (L+1) and ``layer_norms`` LN_0..LN_L.

    State: ``[x, LN_0(y_0), ..., LN_l(y_l)]``, the next layer's input and the normalised history; after
    a layer, element 0 is that layer's output y (the view).

    Args:
        stack, num_layers, embed_dim: as :class:`~fairseq_residual.residual.StackResidual`.
        export: build LayerNorms that TorchScript can export (fairseq's ``--export``).
    """

    def __init__(self, stack: str, num_layers: int, embed_dim: int, export: bool = False):
        super().__init__(stack, num_layers, embed_dim)
        self.weight = nn.Parameter(average_weight(num_layers))
        self.layer_norms = nn.ModuleList(
            [nn.Identity()] + [LayerNorm(embed_dim, export=export) for _ in range(num_layers)]
        )

    def combine(self, row: int, history: List[Tensor]) -> Tensor:
        """``sum_{k=0..row} W[row, k] * history[k]``, T x B x C (history: the normalised LN_k(y_k))."""
        w = self.weight[row]
        out = history[0] * w[0]
        for k in range(1, row + 1):
            out = torch.addcmul(out, history[k], w[k])
        return out

    def start(self, x: Tensor) -> List[Tensor]:
        return [self.combine(0, [x]), x]  # LN_0 = identity

    def between(self, index: int, state: List[Tensor]) -> List[Tensor]:
        y = state[0]
        normed = y
        for k, norm in enumerate(self.layer_norms):  # LN_{index+1}; TorchScript indexes modules in a loop
            if k == index + 1:
                normed = norm(y)
        history = state[1:] + [normed]
        return [self.combine(index + 1, history)] + history


class DLCL(ResidualScheme):
    name = "dlcl"
    label = "DLCL"
    scheme_id = 6
    color = "tab:cyan"
    update = ("Pre-LN layers; layer l+1 reads sum_(k<=l) W[l,k] LN_k(y_k) of all earlier outputs "
              "(y_0 = embedding)")
    output = "LN_final(sum_k W[L,k] LN_k(y_k))"
    init = "`W` lower-triangular average, `W[l,k] = 1/(l+1)`, learned"
    source = "Wang et al. 2019, ACL, sec. 3"
    reference = ("wangqiangneu/dlcl `fairseq/modules/dlcl.py`, `fairseq/models/dlcl_transformer.py` (pre-norm; its "
                 "post-norm variant is not offered)")
    recipe = ("the pre-norm variant of the paper's tables. WMT: Adam (0.9, 0.997), lr 2e-3, warm-up 16000. Its "
              "combination costs O(L^2) small operations per stack.")
    fp16_advice = "fp16 as is at the measured depths (normalised history)"
    normalize_before = True
    layerdrop = False
    no_layerdrop_reason = "a dropped layer would shift the layer history W[l,k]"

    def stack_residual(self, cfg, stack, num_layers, embed_dim):
        return DLCLStack(stack, num_layers, embed_dim, export=cfg.export)

    def upgrade_state_dict(self, state_dict, prefix, stack, options):
        """``{stack}.history.*`` of earlier versions of this plugin is ``{stack}.residual.*``."""
        pattern = re.compile(rf"^{re.escape(prefix)}history\.")
        for key in list(state_dict):
            if pattern.match(key):
                state_dict[prefix + "residual." + key[len(prefix) + len("history."):]] = state_dict.pop(key)


SCHEME = DLCL()

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
Parameter names are the reference's: ``{encoder,decoder}.history.weight`` (here 2-D, as in its
``modules/layer_history.py``; ``dlcl.py`` stores an (L+1) x (L+1) x 1 tensor) and
``{encoder,decoder}.history.layer_norms.1..L`` (index 0 is the identity and has no parameters).
The reference's post-norm variant is not implemented.

Incremental decoding needs no state beyond fairseq's attention caches: the combination mixes the outputs
of different layers at one position, never different positions, so at a decoding step the history of
the current position is rebuilt from that step's layer outputs (as the reference re-runs
clean/push/pop every step), and beam reordering only has to reorder the attention caches, which fairseq
does.

fairseq's layer-drop is refused: it would skip a layer and shift the history's indices.
"""
from typing import List, Optional

import torch
from torch import Tensor, nn

from fairseq.modules import LayerNorm

from .base import ResidualScheme


def average_weight(num_layers: int) -> Tensor:
    """The reference's "avg" initialisation: (L+1) x (L+1), W[l,k] = 1/(l+1) for k <= l, 0 above."""
    n = num_layers + 1
    mask = torch.ones(n, n).tril()
    return mask / mask.sum(dim=1, keepdim=True)


class LayerHistory(nn.Module):
    """The learnable combination of one stack: ``weight`` (L+1) x (L+1) and ``layer_norms`` LN_0..LN_L.

    Args:
        num_layers: L, the stack's number of layers.
        embed_dim: width of the stack's layers.
        export: build LayerNorms that TorchScript can export (fairseq's ``--export``).
    """

    def __init__(self, num_layers: int, embed_dim: int, export: bool = False):
        super().__init__()
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


class DLCL(ResidualScheme):
    name = "dlcl"
    label = "DLCL"
    scheme_id = 6
    color = "tab:cyan"
    update = "x_{l+1} = sum_{k<=l} W[l,k]*LN_k(y_k), y_k = PreLNLayer_k(x_k) (x + drop(F(LN(x))) per sub-layer)"
    output = "LN_final(sum_{k<=L} W[L,k]*LN_k(y_k))"
    source = "Wang et al. 2019, ACL, 'Learning Deep Transformer Models for Machine Translation', section 3"
    reference = "wangqiangneu/dlcl, fairseq/modules/dlcl.py, fairseq/models/dlcl_transformer.py (pre-norm)"
    normalize_before = True

    def check_args(self, args):
        super().check_args(args)
        for stack in ("encoder", "decoder"):
            if (getattr(args, f"{stack}_layerdrop", 0) or 0) > 0:
                raise ValueError(
                    f"--{stack}-layerdrop is not supported with --residual-scheme dlcl: a dropped layer "
                    f"would shift the layer history W[l,k]; drop --{stack}-layerdrop"
                )

    def init_stack(self, stack, cfg):
        embed_dim = stack.embed_dim if stack.stack == "decoder" else stack.embed_tokens.embedding_dim
        stack.history = LayerHistory(len(stack.layers), embed_dim, export=cfg.export)

    own_loop = True

    @staticmethod
    def _final(stack, x: Tensor) -> Tensor:
        return stack.layer_norm(x) if stack.layer_norm is not None else x

    def encoder_loop(self, encoder, x, padding_mask, return_all_hiddens):
        """DLCL loop; ``encoder_states`` holds y_0 .. y_L (embedding and layer outputs)."""
        history = encoder.history
        normed: List[Tensor] = [x]  # LN_0 = identity
        encoder_states: List[Tensor] = [x] if return_all_hiddens else []
        for idx, layer in enumerate(encoder.layers):
            y = layer(history.combine(idx, normed), encoder_padding_mask=padding_mask)
            normed.append(history.layer_norms[idx + 1](y))
            if return_all_hiddens:
                encoder_states.append(y)
        return self._final(encoder, history.combine(len(encoder.layers), normed)), encoder_states

    def decoder_loop(self, decoder, x, inputs, alignment_layer):
        """DLCL loop; ``inner_states`` holds y_0 .. y_L (embedding and layer outputs)."""
        history = decoder.history
        normed: List[Tensor] = [x]
        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        for idx, layer in enumerate(decoder.layers):
            y, layer_attn, _ = layer(
                history.combine(idx, normed),
                inputs.encoder_out,
                inputs.encoder_padding_mask,
                inputs.incremental_state,
                self_attn_mask=inputs.self_attn_mask,
                self_attn_padding_mask=inputs.self_attn_padding_mask,
                need_attn=bool(idx == alignment_layer),
                need_head_weights=bool(idx == alignment_layer),
            )
            normed.append(history.layer_norms[idx + 1](y))
            inner_states.append(y)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn
        return self._final(decoder, history.combine(len(decoder.layers), normed)), attn, inner_states


SCHEME = DLCL()

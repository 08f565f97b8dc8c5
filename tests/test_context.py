"""The context of the residual protocol (``ctx``, fairseq_residual/residual.py): what a sub-layer's ``prepare``
adds reaches the branch's attention, what the attention adds reaches ``update`` and the later layers, a layer
adds to a copy of the context it receives, and schemes that use none pay nothing.

The demonstration is a scheme written here, not a registered one: a self-attention whose keys and values come
from a second stream of the state (a per-branch input that ``prepare`` puts in the context) and whose values are
mixed half and half with the first layer's (value residual learning, ResFormer's fixed 0.5 / 0.5: the first
layer's values are an extra input every later layer's attention takes from the context), and an ``update`` that
reads the attention's values from the context. Its layers run as the stack loop runs them, and are compared with
the same computation written out here in plain PyTorch.
"""
import math
from typing import Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from conftest import build_model, make_dictionary, random_batch
from fairseq_residual.layers import ResidualEncoderLayer
from fairseq_residual.residual import NORM_INPUT, Site, SublayerResidual
from fairseq_residual.schemes import SCHEMES

KEY_VALUE = "test.key_value"  # the key/value input of the branch (prepare -> attention)
FIRST_VALUES = "test.first_values"  # the first layer's values (attention -> later layers' attention)
VALUES = "test.values"  # this layer's values after mixing (attention -> update)
LAYERS, WIDTH, HEADS = 3, 16, 2
# (TorchScript reads no module-level strings: the methods below spell the keys out)


class KeyValueStreamResidual(SublayerResidual):
    """Self-attention over ``[x, y]``: queries from x, keys and values from y (put in the context);
    ``x = x + h + 0.5 * mean_heads(values)``, y unchanged."""

    NORM = NORM_INPUT

    def prepare(self, state: List[Tensor], ctx: Dict[str, Tensor]) -> Tuple[Tensor, List[Tensor]]:
        ctx["test.key_value"] = state[1]
        return state[0], state

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        return [state[0] + out + 0.5 * ctx["test.values"], state[1]]


class ValueResidualLayer(ResidualEncoderLayer):
    """An encoder layer whose self-attention takes its keys and values from the context's per-branch input,
    mixes its values with the first layer's (from the context; the first layer puts its own there) and hands
    its values back in the context."""

    def attend_self(
        self,
        x: Tensor,
        ctx: Dict[str, Tensor],
        key_padding_mask: Optional[Tensor],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
        attn_mask: Optional[Tensor],
    ) -> Tensor:
        a = self.self_attn
        kv = self.branch_input(0, ctx["test.key_value"])
        t, b, c = x.shape
        h = a.num_heads
        q = a.q_proj(x) * a.scaling
        k = a.k_proj(kv)
        v = a.v_proj(kv)
        if "test.first_values" in ctx:
            v = 0.5 * v + 0.5 * ctx["test.first_values"]
        else:
            ctx["test.first_values"] = v
        ctx["test.values"] = v
        q = q.reshape(t, b * h, c // h).transpose(0, 1)
        k = k.reshape(t, b * h, c // h).transpose(0, 1)
        scores = torch.bmm(q, k.transpose(1, 2))  # (B H) x T x T
        if key_padding_mask is not None:
            scores = scores.view(b, h, t, t).masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
            scores = scores.view(b * h, t, t)
        weights = torch.softmax(scores, dim=-1)
        out = torch.bmm(weights, v.reshape(t, b * h, c // h).transpose(0, 1))
        return a.out_proj(out.transpose(0, 1).reshape(t, b, c))


def build_layers(checkpoint=False):
    from fairseq_residual.model import _transformer_config

    _, args, _ = build_model("residual_transformer_tiny", "--residual-scheme", "pre_ln", "--encoder-embed-dim",
                             WIDTH, "--encoder-attention-heads", HEADS, "--dropout", 0)
    cfg = _transformer_config(args)
    cfg.checkpoint_activations = checkpoint
    torch.manual_seed(0)
    layers = []
    for i in range(LAYERS):
        site = lambda kind, j: Site("encoder", kind, i, LAYERS, 2 * i + j, 2, WIDTH, LAYERS, LAYERS)  # noqa: E731
        layers.append(ValueResidualLayer(cfg, {"self_attn": KeyValueStreamResidual(site("self_attn", 0)),
                                               "ffn": SublayerResidual(site("ffn", 1))}))
    with torch.no_grad():  # LayerNorms that are not the identity
        for layer in layers:
            for p in (layer.self_attn_layer_norm.weight, layer.self_attn_layer_norm.bias):
                p.add_(0.3 * torch.randn_like(p))
    return layers


def run(layers, x, y, mask):
    """The stack loop: ``state, ctx = layer(state, mask, ctx=ctx)`` from an empty context."""
    state, ctx, seen = [x, y], {}, []
    for layer in layers:
        given = dict(ctx)
        state, ctx = layer(state, mask, ctx=ctx)
        seen.append((given, dict(ctx)))
    return state, seen


def written_out(layers, x, y, mask):
    """The same computation in plain PyTorch, with an explicit first-layer value."""
    first = None
    for layer in layers:
        a = layer.self_attn
        ln = layer.self_attn_layer_norm
        q_in = F.layer_norm(x, (WIDTH,), ln.weight, ln.bias, 1e-5)
        kv_in = F.layer_norm(y, (WIDTH,), ln.weight, ln.bias, 1e-5)
        d = WIDTH // HEADS
        q = F.linear(q_in, a.q_proj.weight, a.q_proj.bias) / math.sqrt(d)
        k = F.linear(kv_in, a.k_proj.weight, a.k_proj.bias)
        v = F.linear(kv_in, a.v_proj.weight, a.v_proj.bias)
        v = v if first is None else (v + first) / 2
        first = v if first is None else first
        heads = lambda t: t.view(t.shape[0], t.shape[1], HEADS, d).permute(1, 2, 0, 3)  # noqa: E731
        scores = torch.einsum("bhtd,bhsd->bhts", heads(q), heads(k)).masked_fill(mask[:, None, None, :], -math.inf)
        o = torch.einsum("bhts,bhsd->bhtd", scores.softmax(-1), heads(v)).permute(2, 0, 1, 3).reshape(x.shape)
        x = x + F.linear(o, a.out_proj.weight, a.out_proj.bias) + 0.5 * v
        fln = layer.final_layer_norm
        hidden = F.relu(F.linear(F.layer_norm(x, (WIDTH,), fln.weight, fln.bias, 1e-5), layer.fc1.weight,
                                 layer.fc1.bias))
        x = x + F.linear(hidden, layer.fc2.weight, layer.fc2.bias)
    return x


def inputs():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, 3, WIDTH, generator=g), torch.randn(5, 3, WIDTH, generator=g)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[1, :2] = True  # left padding in one sentence
    return x, y, mask


def test_prepare_the_attention_and_update_exchange_tensors_through_the_context():
    layers = [layer.eval() for layer in build_layers()]
    x, y, mask = inputs()
    with torch.no_grad():
        (out, y_out), seen = run(layers, x, y, mask)
        want = written_out(layers, x, y, mask)
    assert torch.equal(y_out, y)
    keep = ~mask.t()
    assert (out - want)[keep].abs().max().item() < 1e-5
    # the first layer's values went to every later layer; each layer left its caller's context as it was
    assert seen[0][0] == {} and set(seen[0][1]) == {KEY_VALUE, FIRST_VALUES, VALUES}
    for given, returned in seen[1:]:
        assert returned[FIRST_VALUES] is seen[0][1][FIRST_VALUES] and set(given) == set(returned)
    assert not torch.equal(seen[1][0][VALUES], seen[1][1][VALUES])
    # negative control: each layer on an empty context (no first-layer values) computes something else
    with torch.no_grad():
        state = [x, y]
        for layer in layers:
            state, _ = layer(state, mask)
    assert (state[0] - want)[keep].abs().max().item() > 1e-3


def test_a_checkpointed_layer_recomputes_from_the_context_it_first_saw():
    """Activation checkpointing recomputes each layer in the backward pass: the layer works on a copy of the
    context, so that the recomputation sees the first layer's values as absent in layer 0 again."""
    grads = []
    for checkpoint in (False, True):
        layers = [layer.train() for layer in build_layers(checkpoint)]
        x, y, mask = inputs()
        x.requires_grad_()
        (out, _), _ = run(layers, x, y, mask)
        out[~mask.t()].square().sum().backward()
        grads.append([x.grad] + [p.grad for layer in layers for p in layer.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


def test_the_layer_with_its_own_attention_compiles_with_torchscript():
    layers = [layer.eval() for layer in build_layers()]
    x, y, mask = inputs()
    with torch.no_grad():
        eager, _ = run(layers, x, y, mask)
        scripted, _ = run([torch.jit.script(layer) for layer in layers], x, y, mask)
    assert torch.allclose(eager[0], scripted[0], atol=1e-6)


#: the registered schemes that keep values in the context (ReZero's alpha; the streams' update coefficients),
#: and their keys
USES_CONTEXT = {"rezero": {"rezero.alpha"}, "hyper_connections": {"streams.coefficient"},
                "mhc": {"streams.coefficient"}}
USES_CONTEXT["value_residual"] = {"value_residual.first"}  # the first layer's values V_1


@pytest.mark.parametrize("scheme", [s.name for s in SCHEMES if not s.fairseq_path])
def test_schemes_that_use_no_context_leave_it_empty(scheme):
    """Every layer of a registered scheme returns an empty context, apart from what the schemes that use it
    put there (their own keys)."""
    d = make_dictionary()
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", scheme, dictionary=d)
    returned = context_keys_per_layer(model, d)
    assert len(returned) == 4 and all(keys == USES_CONTEXT.get(scheme, set()) for keys in returned)


def context_keys_per_layer(model, d):
    """The keys of the context each layer of ``model`` returns on a random batch, encoder layers first."""
    returned = []
    hooks = [layer.register_forward_hook(lambda m, i, out: returned.append(set(out[-1])))
             for stack in (model.encoder, model.decoder) for layer in stack.layers]
    src, lengths, prev, _ = random_batch(d)
    with torch.no_grad():
        model(src, lengths, prev)
    for h in hooks:
        h.remove()
    return returned

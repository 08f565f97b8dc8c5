"""DLCL (pre-norm): the layer history's initialisation, names and gradients, as wangqiangneu/dlcl builds
it (its forward against a transcription: tests/test_conformance.py; training and generation: the CLI
matrix of tests/test_cli.py)."""

import pytest
import torch

from conftest import build_model, make_dictionary, random_batch

FLAGS = ["--residual-scheme", "dlcl", "--encoder-layers", 3, "--decoder-layers", 2]


def test_history_initialisation_and_names():
    d = make_dictionary()
    model, _, _ = build_model("residual_transformer_tiny", *FLAGS, dictionary=d)
    for stack, L in (("encoder", 3), ("decoder", 2)):
        W = getattr(model, stack).residual.weight
        assert W.shape == (L + 1, L + 1) and W.requires_grad
        expected = torch.tensor([[1.0 / (l + 1) if k <= l else 0.0 for k in range(L + 1)] for l in range(L + 1)])
        assert torch.equal(W.detach(), expected)
    names = {n for n, _ in model.named_parameters() if ".residual." in n}
    assert "encoder.residual.weight" in names and "decoder.residual.weight" in names
    assert {n for n in names if n.startswith("encoder.residual.layer_norms.")} == {
        f"encoder.residual.layer_norms.{k}.{p}" for k in (1, 2, 3) for p in ("weight", "bias")
    }
    assert not any(".layer_norms.0." in n for n in names)  # LN_0 is the identity
    # Pre-LN layers (the protocol's default residual) and the stack's final LayerNorm
    from fairseq_residual.residual import NORM_INPUT, NORM_NONE

    assert model.encoder.layers[0].norm_at == [NORM_INPUT, NORM_NONE, NORM_INPUT]  # no cross-attention slot
    assert model.decoder.layers[0].norm_at == [NORM_INPUT] * 3
    assert model.encoder.layer_norm is not None and model.decoder.layer_norm is not None
    # the learnable W receives a gradient
    src, lengths, prev, tgt = random_batch(d, bsz=3)
    model.train()
    lp = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    lp.gather(-1, tgt.unsqueeze(-1)).sum().backward()
    for stack in (model.encoder, model.decoder):
        g = stack.residual.weight.grad
        assert g is not None and g.tril().abs().sum() > 0
        assert torch.all(g.triu(1) == 0)  # entries above the diagonal are never read

"""DLCL (pre-norm): exactness against a plain-PyTorch transcription of wangqiangneu/dlcl's computation,
its initialisation and refused options (training and generation: the CLI matrix of tests/test_cli.py)."""

import pytest
import torch
import torch.nn.functional as F

from conftest import build_model, make_dictionary, random_batch
from test_exactness import ref_attention, ref_ffn, ref_ln

TOL = 1e-5
EPS = 1e-5
FLAGS = ["--residual-scheme", "dlcl", "--encoder-layers", 3, "--decoder-layers", 2]


def ref_dlcl(model, src, prev, drop_term=None, weights=None):
    """The reference's pre-norm DLCL with fairseq Pre-LN layers.

    x_{l+1} = sum_{k<=l} W[l,k] LN_k(y_k) (LN_0 = identity), output LN_final(sum_{k<=L} W[L,k] LN_k(y_k)).
    ``drop_term=(stack, l, k)`` leaves out one history term (negative control); ``weights`` replaces W
    ({'encoder': ..., 'decoder': ...}). Returns log-probs B x T x V and the encoder output S x B x C.
    """
    enc, dec = model.encoder, model.decoder
    pad = enc.padding_idx
    src_pad = src.eq(pad)
    tgt_pad = prev.eq(pad)

    def combine(stack, name, l, ys):
        W = (weights or {}).get(name, stack.residual.weight)
        terms = [W[l, k] * ys[k] for k in range(l + 1) if drop_term != (name, l, k)]
        return sum(terms)

    def norm(stack, k, y):
        ln = stack.residual.layer_norms[k]
        return y if k == 0 else ref_ln(ln, y, EPS)

    x = enc.embed_scale * enc.embed_tokens(src) + enc.embed_positions(src)
    x = (x * (1 - src_pad.unsqueeze(-1).float())).transpose(0, 1)
    ys = [x]
    for l, layer in enumerate(enc.layers):
        h = combine(enc, "encoder", l, ys)
        h = h + ref_attention(layer.self_attn, ref_ln(layer.self_attn_layer_norm, h, EPS),
                              ref_ln(layer.self_attn_layer_norm, h, EPS), key_padding_mask=src_pad)
        h = h + ref_ffn(layer, ref_ln(layer.final_layer_norm, h, EPS))
        ys.append(norm(enc, l + 1, h))
    enc_out = ref_ln(enc.layer_norm, combine(enc, "encoder", len(enc.layers), ys), EPS)

    y = (dec.embed_scale * dec.embed_tokens(prev) + dec.embed_positions(prev)).transpose(0, 1)
    ys = [y]
    for l, layer in enumerate(dec.layers):
        h = combine(dec, "decoder", l, ys)
        a = ref_ln(layer.self_attn_layer_norm, h, EPS)
        h = h + ref_attention(layer.self_attn, a, a, key_padding_mask=tgt_pad, causal=True)
        h = h + ref_attention(layer.encoder_attn, ref_ln(layer.encoder_attn_layer_norm, h, EPS), enc_out,
                              key_padding_mask=src_pad)
        h = h + ref_ffn(layer, ref_ln(layer.final_layer_norm, h, EPS))
        ys.append(norm(dec, l + 1, h))
    out = ref_ln(dec.layer_norm, combine(dec, "decoder", len(dec.layers), ys), EPS)
    logits = F.linear(out.transpose(0, 1), dec.output_projection.weight)
    return torch.log_softmax(logits, dim=-1), enc_out


def perturbed_model(d):
    model, _, _ = build_model("residual_transformer_tiny", *FLAGS, dictionary=d)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:  # fairseq's and the history's LayerNorms
                p.add_(0.3 * torch.randn_like(p))
        for stack in (model.encoder, model.decoder):  # a random lower-triangular W, not the average
            W = stack.residual.weight
            W.copy_((0.2 + torch.rand_like(W)).tril())
    return model


@pytest.mark.model
def test_dlcl_matches_reference():
    d = make_dictionary()
    model = perturbed_model(d)
    assert len(model.encoder.layers) == 3 and len(model.decoder.layers) == 2
    src, lengths, prev, _ = random_batch(d, bsz=5)
    assert src.eq(d.pad()).any() and prev.eq(d.pad()).any(), "the batch must contain padding"
    with torch.no_grad():
        lp_ref, enc_ref = ref_dlcl(model, src, prev)
        enc = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
        lp = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    keep = src.ne(d.pad()).t()
    tgt_keep = prev.ne(d.pad())
    assert (enc - enc_ref)[keep].abs().max().item() <= TOL
    assert (lp - lp_ref)[tgt_keep].abs().max().item() <= TOL

    # negative controls: the reference is sensitive to each history term and to W
    with torch.no_grad():
        for term in (("encoder", 2, 0), ("decoder", 1, 1), ("decoder", 2, 1)):
            lp_wrong, _ = ref_dlcl(model, src, prev, drop_term=term)
            assert (lp_wrong - lp)[tgt_keep].abs().max().item() > 1e-3, term
        # identity-shift W (x_{l+1} = LN_l(y_l)): a plain Pre-LN-like chain, not DLCL
        shift = {s: torch.eye(len(getattr(model, s).layers) + 1) for s in ("encoder", "decoder")}
        lp_shift, _ = ref_dlcl(model, src, prev, weights=shift)
        assert (lp_shift - lp)[tgt_keep].abs().max().item() > 1e-3


@pytest.mark.model
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
    # Pre-LN layers and the stack's final LayerNorm
    assert model.encoder.layers[0].normalize_before and model.decoder.layers[0].normalize_before
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


@pytest.mark.model
def test_layerdrop_is_refused():
    with pytest.raises(ValueError, match="--encoder-layerdrop is not supported with --residual-scheme dlcl"):
        build_model("residual_transformer_tiny", *FLAGS, "--encoder-layerdrop", 0.1)

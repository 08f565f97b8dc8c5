"""Each scheme computes exactly what it claims.

* Post-LN and Pre-LN equal fairseq's stock ``transformer`` (normalize_before False / True) given the
  same weights, encoder output and decoder log-probabilities, with padding in the batch.
* ResiDual equals an independent plain-PyTorch transcription of the authors' computation
  (Xie et al. 2023, arXiv 2304.14802; github.com/microsoft/ResiDual, resi_dual/resi_dual_layers.py),
  with non-default ``c`` and ``alpha`` per stack so that a swapped or missing constant shows.
"""
import pytest
import torch
import torch.nn.functional as F

from conftest import build_model, make_dictionary, random_batch

pytestmark = pytest.mark.model

TOL = 1e-5


def log_probs(model, src, lengths, prev):
    net_output = model(src, lengths, prev)
    return model.get_normalized_probs(net_output, log_probs=True)


@pytest.mark.parametrize(
    "scheme,stock_flags",
    [
        ("post_ln", []),
        ("pre_ln", ["--encoder-normalize-before", "--decoder-normalize-before"]),
    ],
)
@pytest.mark.parametrize("shared_embeddings", [False, True])
def test_post_and_pre_ln_equal_fairseq_transformer(scheme, stock_flags, shared_embeddings):
    extra = ["--share-all-embeddings"] if shared_embeddings else []
    d = make_dictionary()
    stock, _, _ = build_model("transformer_tiny", *stock_flags, *extra, dictionary=d)
    ours, _, _ = build_model(
        "residual_transformer_tiny", "--residual-scheme", scheme, *extra, dictionary=d
    )
    # A stock fairseq state dict loads into the matching scheme (scheme inferred from its keys).
    ours.load_state_dict(stock.state_dict())
    assert ours.residual_scheme == scheme
    if scheme == "pre_ln":
        assert ours.encoder.layer_norm is not None and ours.decoder.layer_norm is not None
    else:
        assert ours.encoder.layer_norm is None and ours.decoder.layer_norm is None

    src, lengths, prev, tgt = random_batch(d, bsz=5)
    assert src.eq(d.pad()).any() and prev.eq(d.pad()).any(), "the batch must contain padding"
    with torch.no_grad():
        enc_ref = stock.encoder(src, src_lengths=lengths)["encoder_out"][0]
        enc = ours.encoder(src, src_lengths=lengths)["encoder_out"][0]
        lp_ref = log_probs(stock, src, lengths, prev)
        lp = log_probs(ours, src, lengths, prev)
    assert enc.shape == enc_ref.shape == (src.size(1), src.size(0), 64)
    assert (enc - enc_ref).abs().max().item() <= TOL
    assert lp.shape == lp_ref.shape == (prev.size(0), prev.size(1), len(d))
    assert (lp - lp_ref).abs().max().item() <= TOL


# ---------------------------------------------------------------------------------------------
# ResiDual against a plain-PyTorch reference of the authors' computation
# ---------------------------------------------------------------------------------------------


def ref_attention(mha, query, key_value, key_padding_mask=None, causal=False):
    """Multi-head attention from the raw projection weights. query T x B x C, key_value S x B x C."""
    T, B, C = query.shape
    S = key_value.shape[0]
    H = mha.num_heads
    d = C // H
    q = F.linear(query, mha.q_proj.weight, mha.q_proj.bias) * d**-0.5
    k = F.linear(key_value, mha.k_proj.weight, mha.k_proj.bias)
    v = F.linear(key_value, mha.v_proj.weight, mha.v_proj.bias)
    q = q.view(T, B, H, d).permute(1, 2, 0, 3)  # B x H x T x d
    k = k.view(S, B, H, d).permute(1, 2, 0, 3)
    v = v.view(S, B, H, d).permute(1, 2, 0, 3)
    scores = q @ k.transpose(-1, -2)  # B x H x T x S
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    if causal:
        scores = scores.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # B x H x T x d
    out = out.permute(2, 0, 1, 3).reshape(T, B, C)
    return F.linear(out, mha.out_proj.weight, mha.out_proj.bias)


def ref_ln(ln, x, eps):
    return F.layer_norm(x, (x.shape[-1],), ln.weight, ln.bias, eps)


def ref_ffn(layer, x):
    return F.linear(F.relu(F.linear(x, layer.fc1.weight, layer.fc1.bias)), layer.fc2.weight, layer.fc2.bias)


def ref_resi_dual(model, src, prev, c_enc, a_enc, c_dec, a_dec, cross_attn_feeds_dual=True, start=1.0):
    """The authors' ResiDual: x_a = LN(x_a + h), x_d = x_d + c*h per sub-layer; out = a*x_a + LN(x_d).

    Embeddings (scaled token embedding + sinusoidal positions) come from the model's own modules:
    they are fairseq's input pipeline, identical across schemes. ``start`` multiplies the embedding
    the dual streams start from (0: ``--resi-dual-start-from zeros``). Returns log-probs B x T x V and
    the encoder output S x B x C.
    """
    enc, dec = model.encoder, model.decoder
    pad = enc.padding_idx
    eps = 1e-5  # fairseq's LayerNorm eps inside the layers

    # encoder
    x = enc.embed_scale * enc.embed_tokens(src) + enc.embed_positions(src)
    src_pad = src.eq(pad)
    x = x * (1 - src_pad.unsqueeze(-1).float())
    x_a = x.transpose(0, 1)
    x_d = start * c_enc * x_a
    for layer in enc.layers:
        h = ref_attention(layer.self_attn, x_a, x_a, key_padding_mask=src_pad)
        x_a = ref_ln(layer.self_attn_layer_norm, x_a + h, eps)
        x_d = x_d + c_enc * h
        h = ref_ffn(layer, x_a)
        x_a = ref_ln(layer.final_layer_norm, x_a + h, eps)
        x_d = x_d + c_enc * h
    enc_out = a_enc * x_a + ref_ln(enc.layer_norm, x_d, 1e-7)

    # decoder (with cross-attention: three dual-stream updates per layer)
    y = dec.embed_scale * dec.embed_tokens(prev) + dec.embed_positions(prev)
    y_a = y.transpose(0, 1)
    y_d = start * c_dec * y_a
    tgt_pad = prev.eq(pad)
    for layer in dec.layers:
        h = ref_attention(layer.self_attn, y_a, y_a, key_padding_mask=tgt_pad, causal=True)
        y_a = ref_ln(layer.self_attn_layer_norm, y_a + h, eps)
        y_d = y_d + c_dec * h
        h = ref_attention(layer.encoder_attn, y_a, enc_out, key_padding_mask=src_pad)
        y_a = ref_ln(layer.encoder_attn_layer_norm, y_a + h, eps)
        if cross_attn_feeds_dual:
            y_d = y_d + c_dec * h
        h = ref_ffn(layer, y_a)
        y_a = ref_ln(layer.final_layer_norm, y_a + h, eps)
        y_d = y_d + c_dec * h
    out = a_dec * y_a + ref_ln(dec.layer_norm, y_d, 1e-7)
    logits = F.linear(out.transpose(0, 1), dec.output_projection.weight)
    return torch.log_softmax(logits, dim=-1), enc_out


@pytest.mark.parametrize(
    "c_enc,a_enc,c_dec,a_dec",
    [(1.0, 1.0, 1.0, 1.0), (0.5, 0.7, 0.25, 1.3)],
    ids=["defaults", "per-stack-constants"],
)
def test_resi_dual_matches_reference(c_enc, a_enc, c_dec, a_dec):
    d = make_dictionary()
    model, _, _ = build_model(
        "residual_transformer_tiny",
        "--residual-scheme", "resi_dual",
        "--encoder-resi-dual-scale", c_enc, "--decoder-resi-dual-scale", c_dec,
        "--encoder-resi-dual-alpha", a_enc, "--decoder-resi-dual-alpha", a_dec,
        "--encoder-layers", 3, "--decoder-layers", 3,
        dictionary=d,
    )
    # non-trivial LayerNorm affine parameters, so that a wrong LN shows
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    # LN_final's eps is the authors' 1e-7 scaled by c^2, so that LN_final(c x_d) = LN_final(x_d) exactly
    assert model.encoder.layer_norm.eps == pytest.approx(1e-7 * c_enc ** 2)
    assert model.decoder.layer_norm.eps == pytest.approx(1e-7 * c_dec ** 2)
    src, lengths, prev, tgt = random_batch(d, bsz=5)
    with torch.no_grad():
        lp_ref, enc_ref = ref_resi_dual(model, src, prev, c_enc, a_enc, c_dec, a_dec)
        enc = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
        lp = log_probs(model, src, lengths, prev)
    keep = src.ne(d.pad()).t()  # S x B, compare the real source positions
    assert (enc - enc_ref)[keep].abs().max().item() <= TOL
    tgt_keep = prev.ne(d.pad())
    assert (lp - lp_ref)[tgt_keep].abs().max().item() <= TOL
    # The reference is sensitive: a decoder without the cross-attention update of x_d differs.
    with torch.no_grad():
        lp_wrong, _ = ref_resi_dual(
            model, src, prev, c_enc, a_enc, c_dec, a_dec, cross_attn_feeds_dual=False
        )
    assert (lp_wrong - lp)[tgt_keep].abs().max().item() > 1e-3


def test_resi_dual_start_from_zeros_matches_reference():
    """The ablation ``--resi-dual-start-from zeros``: x_d = c*sum(h), the embedding not in x_d."""
    d = make_dictionary()
    flags = ["--residual-scheme", "resi_dual", "--resi-dual-scale", 0.5, "--encoder-layers", 3,
             "--decoder-layers", 2]
    model, _, _ = build_model("residual_transformer_tiny", *flags, "--resi-dual-start-from", "zeros",
                              dictionary=d)
    src, lengths, prev, tgt = random_batch(d, bsz=5)
    tgt_keep = prev.ne(d.pad())
    with torch.no_grad():
        lp_ref, _ = ref_resi_dual(model, src, prev, 0.5, 1.0, 0.5, 1.0, start=0.0)
        lp = log_probs(model, src, lengths, prev)
        lp_emb, _ = ref_resi_dual(model, src, prev, 0.5, 1.0, 0.5, 1.0, start=1.0)
    assert (lp - lp_ref)[tgt_keep].abs().max().item() <= TOL
    assert (lp - lp_emb)[tgt_keep].abs().max().item() > 1e-3  # the default start differs
    with pytest.raises(SystemExit):  # argparse refuses an unknown choice
        build_model("residual_transformer_tiny", *flags, "--resi-dual-start-from", "noise", dictionary=d)

"""What the conformance suite's exactness check cannot see of the placement schemes published after the
ResiDual paper (Peri-LN, Mix-LN, LayerNorm Scaling, ReZero, HybridNorm): where dropout sits relative to
Peri-LN's output LayerNorm, which layers Mix-LN makes Post-LN, LayerNorm Scaling's factors, ReZero's
start at the identity, HybridNorm's per-head norms and their parameter names."""
import math

import pytest
import torch

from conftest import build_model, make_dictionary, random_batch
from fairseq_residual.residual import NORM_INPUT, NORM_NONE, NORM_OUTPUT, NORM_STREAM



def tiny(scheme, *flags, d=None):
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", scheme, *flags,
                              dictionary=d or make_dictionary())
    return model


def test_peri_ln_output_layer_norm_sees_the_dropped_out_branch():
    """CogView's Sandwich-LN: the dropout is inside the sub-layer, the output LayerNorm after it. With
    dropout 0.5 in training, the FFN's output LayerNorm receives fc2's output with half of it zeroed and
    the rest scaled by 2."""
    d = make_dictionary()
    model = tiny("peri_ln", "--dropout", 0.5, "--activation-dropout", 0, "--attention-dropout", 0, d=d)
    layer = model.encoder.layers[0]
    seen = {}
    layer.fc2.register_forward_hook(lambda m, i, o: seen.__setitem__("fc2", o.detach()))
    layer.ffn_residual.out_layer_norm.register_forward_hook(lambda m, i, o: seen.__setitem__("ln_in", i[0].detach()))
    model.train()
    src, lengths, prev, _ = random_batch(d)
    model(src, lengths, prev)
    fc2, ln_in = seen["fc2"], seen["ln_in"]
    dropped = ln_in == 0
    assert 0.3 < dropped.float().mean().item() < 0.7
    torch.testing.assert_close(ln_in[~dropped], 2 * fc2[~dropped])
    names = {n for n, _ in model.named_parameters() if "out_layer_norm" in n}
    assert "encoder.layers.0.self_attn_residual.out_layer_norm.weight" in names
    assert "decoder.layers.1.encoder_attn_residual.out_layer_norm.bias" in names
    assert len(names) == 2 * (2 * 2 + 2 * 3)  # weight and bias, every sub-layer of both stacks


@pytest.mark.parametrize("fraction, post_enc, post_dec", [(0.25, 1, 1), (0.4, 2, 1), (0.5, 3, 2), (0.0, 0, 0), (1.0, 6, 4)])
def test_mix_ln_makes_the_lowest_floor_a_l_layers_post_ln(fraction, post_enc, post_dec):
    model = tiny("mix_ln", "--mix-ln-fraction", fraction, "--encoder-layers", 6, "--decoder-layers", 4)
    for stack, post in ((model.encoder, post_enc), (model.decoder, post_dec)):
        kinds = [layer.norm_at[2] for layer in stack.layers]  # the FFN's LayerNorm position, per layer
        assert kinds == [NORM_OUTPUT] * post + [NORM_INPUT] * (len(stack.layers) - post)
        assert stack.layer_norm is not None  # the final LayerNorm is always there


def test_mix_ln_warns_where_a_stack_gets_no_post_ln_layer(caplog):
    """floor(0.25 x 3) = 0: a 3-layer stack of Mix-LN at its default fraction is Pre-LN's, which the user is told;
    4 layers get one Post-LN layer and no warning."""
    import logging

    with caplog.at_level(logging.WARNING):
        tiny("mix_ln", "--encoder-layers", 4, "--decoder-layers", 3)
    warned = [r.getMessage() for r in caplog.records if "Mix-LN" in r.getMessage()]
    assert warned == ["Mix-LN: --mix-ln-fraction 0.25 of 3 decoder layers is floor(0.25 x 3) = 0 Post-LN layers: "
                      "the decoder is Pre-LN's; a fraction of at least 0.333 (or more layers) gives it one"]


def test_lns_scales_every_sub_layer_input_by_one_over_sqrt_of_its_layer():
    model = tiny("lns", "--encoder-layers", 4, "--decoder-layers", 3)
    for stack in (model.encoder, model.decoder):
        for l, layer in enumerate(stack.layers):
            slots = [0, 2] if stack is model.encoder else [0, 1, 2]
            for slot in slots:
                assert layer.input_scale[slot] == pytest.approx(1 / math.sqrt(l + 1))
    assert [round(1 / math.sqrt(l), 3) for l in range(1, 7)] == [1.0, 0.707, 0.577, 0.5, 0.447, 0.408]


def test_rezero_starts_as_the_identity_and_first_trains_only_the_decoders_alphas():
    """alpha = 0: every layer is the identity, so the first gradient reaches only the decoder's alphas (the
    encoder's output enters the decoder through its cross-attention, scaled by a zero alpha)."""
    d = make_dictionary()
    model = tiny("rezero", "--dropout", 0, d=d)
    alphas = {n: p for n, p in model.named_parameters() if n.endswith("resweight")}
    assert set(alphas) == {f"{s}.layers.{i}.self_attn_residual.resweight" for s in ("encoder", "decoder")
                           for i in range(2)}  # one per layer, shared by its sub-layers
    assert all(float(p) == 0.0 for p in alphas.values())
    assert not any("norm" in n for n, _ in model.named_parameters())  # no LayerNorm anywhere
    src, lengths, prev, _ = random_batch(d)
    model.train()
    enc = model.encoder(src, src_lengths=lengths)
    emb = enc["encoder_embedding"][0].transpose(0, 1) * (1 - src.eq(d.pad()).t().unsqueeze(-1).float())
    torch.testing.assert_close(enc["encoder_out"][0], emb + model.encoder.embed_positions(src).transpose(0, 1)
                               * (1 - src.eq(d.pad()).t().unsqueeze(-1).float()))  # every layer is the identity
    model(src, lengths, prev)[0].sum().backward()
    for n, p in model.named_parameters():
        if ".layers." in n:
            moved = p.grad is not None and p.grad.abs().sum() > 0
            assert moved == (n.startswith("decoder.") and n.endswith("resweight")), n


def test_hybrid_norm_normalises_q_k_v_per_head_and_keeps_fairseqs_names():
    d = make_dictionary()
    model = tiny("hybrid_norm", "--encoder-attention-heads", 4, "--decoder-attention-heads", 4, d=d)
    names = {n for n, _ in model.named_parameters()}
    for stack, attns in (("encoder", ("self_attn",)), ("decoder", ("self_attn", "encoder_attn"))):
        for attn in attns:
            for proj in ("q_proj", "k_proj", "v_proj"):
                assert f"{stack}.layers.0.{attn}.{proj}.weight" in names  # fairseq's projection names
                assert f"{stack}.layers.0.{attn}.{proj}.norm.weight" in names
                norm = getattr(getattr(model, stack).layers[0], attn)
                assert getattr(norm, proj).norm.weight.shape == (64 // 4,)  # head_dim
    layer = model.decoder.layers[0]
    assert layer.self_attn_layer_norm is None and layer.encoder_attn_layer_norm is None  # no input LN
    assert layer.norm_at == [NORM_NONE, NORM_NONE, NORM_STREAM]
    # the projections are really called (fairseq's fast path would read their weights and skip the norms)
    seen = []
    layer.self_attn.q_proj.norm.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    model.train()
    src, lengths, prev, _ = random_batch(d)
    model(src, lengths, prev)
    assert seen and seen[0][-1] == 64 // 4


def test_hybrid_norm_keeps_fairseqs_quant_noise_on_q_k_v():
    """--quant-noise-pq drops blocks of the q, k, v weights in training as on fairseq's own projections (the
    hook moves to the per-head-normed projection); in evaluation the weights are left alone."""
    d = make_dictionary()
    torch.manual_seed(0)
    model = tiny("hybrid_norm", "--quant-noise-pq", 0.5, "--quant-noise-pq-block-size", 8, d=d)
    attn = model.encoder.layers[0].self_attn
    before = {p: getattr(attn, p).weight.detach().clone() for p in ("q_proj", "k_proj", "v_proj")}
    src, lengths, prev, _ = random_batch(d)
    model.eval()
    model(src, lengths, prev)
    assert all(torch.equal(getattr(attn, p).weight, w) for p, w in before.items())
    model.train()
    model(src, lengths, prev)
    for p, w in before.items():  # fairseq's hook: blocks of 8 input features zeroed, the rest scaled 1/(1-p)
        blocks = getattr(attn, p).weight.detach().view(w.shape[0], -1, 8)
        dropped = (blocks == 0).all(-1)
        assert 0 < dropped.float().mean() < 1, p
        torch.testing.assert_close(blocks[~dropped], (w.view(w.shape[0], -1, 8) * 2)[~dropped])

"""MUDDFormer: the hidden-size rule and the identity initialisation (a new model is the Pre-LN model with the same
weights), the unit-scale storage (--muddformer-unit-weights; tests/test_conformance.py runs the default, the reference's)
against the transcription of Caiyun-AI/MUDDFormer (tests/references.py) with negative controls, and incremental
decoding, which keeps nothing beyond fairseq's key/value cache."""
import pytest
import torch

from conftest import build_model, make_dictionary, random_batch
from references import MuddFormer as Reference
from references import assert_matches_transcription

DEPTH = ["--encoder-layers", 3, "--decoder-layers", 2]
SMALL = ["--encoder-embed-dim", 16, "--decoder-embed-dim", 16, "--encoder-ffn-embed-dim", 32,
         "--decoder-ffn-embed-dim", 32]


def build(*flags, seed=None, d=None, scheme="muddformer"):
    if seed is not None:
        torch.manual_seed(seed)
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", scheme, *flags,
                              dictionary=d or make_dictionary())
    return model


def test_hidden_sizes_and_identity_initialisation():
    from fairseq_residual.schemes.muddformer import hidden_size

    # the reference's (lidx + 2) C, x 4 after the last layer, rounded up past a multiple of 64
    assert [hidden_size(i, 4, False) for i in (1, 14, 15, 16)] == [64, 64, 128, 128]
    assert hidden_size(6, 1, True) == 64 and hidden_size(16, 1, True) == 128
    assert hidden_size(2, 5, False, round64=False) == 15 and hidden_size(6, 1, True, round64=False) == 28
    model = build(*SMALL, *DEPTH)
    enc, dec = model.encoder.residual, model.decoder.residual
    assert (enc.num_streams, dec.num_streams) == (4, 5)
    assert [tuple(c.bias.shape) for c in dec.connections] == [(5, 2), (1, 3)]
    assert [tuple(c.w2.shape) for c in enc.connections] == [(8, 64), (12, 64), (4, 64)]
    for c in list(enc.connections) + list(dec.connections):
        assert torch.equal(c.w2, torch.zeros_like(c.w2))
        expected = torch.zeros_like(c.bias)
        expected[:, -1] = 1.0
        assert torch.equal(c.bias, expected)
        assert 0.5 < c.w1.std().item() * 16 ** 0.5 < 1.5 and c.w1_scale == 1.0  # the reference's N(0, 1/C)
    unit = build(*SMALL, *DEPTH, "--muddformer-unit-weights").encoder.residual.connections[0]
    assert 0.5 < unit.w1.std().item() < 1.5  # unit weights: N(0, 1), W1 = w1 / sqrt(C) ~ N(0, 1/C)
    ref = build(*SMALL, *DEPTH).encoder.residual.connections[0]
    assert 0.5 < ref.w1.std().item() * 16 ** 0.5 < 1.5 and ref.w1_scale == 1.0  # the reference's N(0, 1/C)
    assert model.encoder.layers[0].k_layer_norm is None and model.encoder.layers[1].k_layer_norm is not None
    no_ca = build(*SMALL, *DEPTH, "--no-cross-attention")
    assert no_ca.decoder.residual.num_streams == 4


@pytest.mark.parametrize("unit", [False, True])
def test_a_new_model_is_the_pre_ln_model_with_the_same_weights(unit):
    """Any Pre-LN weights (LayerNorms randomised too) copied into a new MUDDFormer, whose LN_k, LN_v are set to the
    layer's LN_q: the same log-probabilities and encoder output (the mixes start as the identity)."""
    d = make_dictionary()
    flags = [*SMALL, *DEPTH] + (["--muddformer-unit-weights"] if unit else [])
    ours = build(*flags, seed=3, d=d)
    pre_ln = build(*SMALL, *DEPTH, seed=3, d=d, scheme="pre_ln")
    torch.manual_seed(5)
    with torch.no_grad():
        for p in pre_ln.parameters():
            p.add_(0.3 * torch.randn_like(p))
        shared = {n: v for n, v in pre_ln.state_dict().items() if not n.endswith("residual_scheme_id")}
        target = ours.state_dict()
        for n, v in shared.items():
            target[n].copy_(v)
        missing = set(target) - set(shared)
        assert all("residual" in n or "k_layer_norm" in n or "v_layer_norm" in n for n in missing)
        for stack in (ours.encoder, ours.decoder):
            for layer in stack.layers[1:]:
                for norm in (layer.k_layer_norm, layer.v_layer_norm):
                    norm.load_state_dict(layer.self_attn_layer_norm.state_dict())
    src, lengths, prev, _ = random_batch(d, bsz=4)
    ours.eval(), pre_ln.eval()
    with torch.no_grad():
        a = ours.get_normalized_probs(ours(src, lengths, prev), log_probs=True)
        b = pre_ln.get_normalized_probs(pre_ln(src, lengths, prev), log_probs=True)
        ea = ours.encoder(src, src_lengths=lengths)["encoder_out"][0]
        eb = pre_ln.encoder(src, src_lengths=lengths)["encoder_out"][0]
    keep = prev.ne(d.pad())
    assert (a - b)[keep].abs().max().item() <= 1e-5
    assert (ea - eb)[src.ne(d.pad()).t()].abs().max().item() <= 1e-5


def randomise(model, scale, seed=1):
    """LayerNorms by 0.3, the connections' b, W1, W2 by ``scale`` (the reference's parametrisation keeps its
    coefficients moderate: the conformance suite's 0.3 on W2 would make them about +-15, where fp32 itself
    cannot resolve the mixes' cancellations to 1e-5)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "residual.connections" in name:
                p.add_(scale * torch.randn_like(p))
            elif "norm" in name:
                p.add_(0.3 * torch.randn_like(p))


class SwappedQueryKey(Reference):
    """Negative control: the queries read X^k and the keys X^q (streams 0 and 1 exchanged)."""

    def between(self, stack, l, state):
        out = super().between(stack, l, state)
        s = out["streams"]
        if len(s) > 1:
            out["streams"] = [s[1], s[0]] + list(s[2:])
        return out


class CrossQueryFromResidual(Reference):
    """Negative control: cross-attention's query is the residual h (no fifth stream)."""

    def sublayer(self, stack, layer, l, kind, state, branch):
        if kind == "encoder_attn":
            state = dict(state, cq=state["x"])
        return super().sublayer(stack, layer, l, kind, state, branch)


@pytest.mark.parametrize("flags", [["--muddformer-unit-weights"], ["--muddformer-no-round64"]])
def test_both_storages_match_the_transcription(flags):
    unit = "--muddformer-unit-weights" in flags
    d = make_dictionary()
    model = build(*SMALL, *DEPTH, *flags, d=d, seed=2)
    randomise(model, 0.05)
    model.eval()
    controls = [Reference(layout_lc=True, unit_weights=unit), SwappedQueryKey(unit_weights=unit),
                CrossQueryFromResidual(unit_weights=unit)]
    assert_matches_transcription(model, d, Reference(unit_weights=unit), controls)


def test_incremental_decoding_equals_the_full_forward_and_caches_nothing_more():
    """Each decoding step equals the full forward (beam reorders: tests/test_conformance.py), and the incremental
    state holds
    exactly the keys a Pre-LN decoder's holds (fairseq's attention caches): no per-token cache of layer outputs."""
    d = make_dictionary()
    model = build(*SMALL, "--encoder-layers", 2, "--decoder-layers", 3, d=d, seed=4)
    randomise(model, 0.05)
    model.eval()
    pre_ln = build(*SMALL, "--encoder-layers", 2, "--decoder-layers", 3, d=d, seed=4, scheme="pre_ln").eval()
    src, lengths, prev, _ = random_batch(d, bsz=2, src_len=6, pad_rows=False)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        full, _ = model.decoder(prev, encoder_out=enc)
        state, steps = {}, []
        for t in range(prev.shape[1]):
            out, _ = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
            steps.append(out)
        inc = torch.cat(steps, dim=1)
        assert (inc - full).abs().max().item() <= 1e-5
        pre_state = {}
        pre_enc = pre_ln.encoder(src, src_lengths=lengths)
        pre_ln.decoder(prev[:, :1], encoder_out=pre_enc, incremental_state=pre_state)
        ours_state = {}
        model.decoder(prev[:, :1], encoder_out=enc, incremental_state=ours_state)
    contents = lambda s: sorted((k.split(".", 1)[1], sorted((n, tuple(v.shape)) for n, v in c.items()  # noqa: E731
                                                               if v is not None)) for k, c in s.items())
    assert contents(ours_state) == contents(pre_state)  # keys start with the module's unique id


def test_layer_drop_is_refused():
    with pytest.raises(ValueError, match="--decoder-layerdrop is not supported with --residual-scheme muddformer: "
                                         "a dropped layer would shift"):
        build(*SMALL, "--decoder-layerdrop", 0.2)

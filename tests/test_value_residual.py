"""Value residual learning (``--residual-scheme value_residual``): the fixed mix against the transcription of the
official code, the learned mix starting as the fixed one, what the decoder caches, the first layer that runs
giving V_1, and the option's refusal. The learned mix is checked against its transcription, with random gates,
by the registry-wide suite (tests/test_conformance.py)."""
import argparse

import pytest
import torch

from conftest import build_model, make_dictionary, random_batch
from references import Transcription, ValueResidual, reference_forward
from test_conformance import randomise_scheme_parameters

DEPTH = ["--encoder-layers", 3, "--decoder-layers", 2]


def _model(*flags, d, seed=0):
    torch.manual_seed(seed)
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "value_residual", *DEPTH, *flags,
                              dictionary=d)
    return model.eval()


def test_the_fixed_mix_matches_the_official_codes_transcription():
    d = make_dictionary()
    model = _model(d=d)
    randomise_scheme_parameters(model)
    src, lengths, prev, _ = random_batch(d, bsz=5)
    with torch.no_grad():
        enc_ref, lp_ref = reference_forward(model, src, prev, ValueResidual())
        _, lp_pre_ln = reference_forward(model, src, prev, Transcription())  # negative control: no value mix
        enc = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
        lp = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    keep_src, keep_tgt = src.ne(d.pad()).t(), prev.ne(d.pad())
    assert (enc - enc_ref)[keep_src].abs().max().item() <= 1e-5
    assert (lp - lp_ref)[keep_tgt].abs().max().item() <= 1e-5
    assert (lp - lp_pre_ln)[keep_tgt].abs().max().item() > 1e-3


def test_the_learned_mix_starts_as_the_fixed_one_from_pre_lns_draws():
    d = make_dictionary()
    fixed, learned = _model(d=d), _model("--value-residual-mix", "learned", d=d)
    torch.manual_seed(0)
    pre_ln, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "pre_ln", *DEPTH, dictionary=d)
    gates = {k for k in learned.state_dict() if "residual_mix" in k}
    # one gate (weight, bias) per self-attention after each stack's first
    assert len(gates) == 2 * (2 + 1) and not any(".layers.0." in k for k in gates)
    for name, p in fixed.state_dict().items():
        assert torch.equal(p, learned.state_dict()[name]), name
        if name in pre_ln.state_dict() and not name.endswith("residual_scheme_id"):
            assert torch.equal(p, pre_ln.state_dict()[name]), name
    src, lengths, prev, _ = random_batch(d)
    with torch.no_grad():
        # V_1 + 0.5 (V_n - V_1) and 0.5 V_1 + 0.5 V_n: equal up to rounding
        torch.testing.assert_close(learned(src, lengths, prev)[0], fixed(src, lengths, prev)[0], rtol=0, atol=1e-6)


def test_decoding_caches_nothing_beyond_fairseqs_keys_and_values():
    """Each later layer caches its mixed values: a step needs V_1 of its own position only (per token, no memory
    beyond fairseq's 2 C per layer)."""
    d = make_dictionary()
    model = _model("--value-residual-mix", "learned", d=d)
    src, lengths, prev, _ = random_batch(d, bsz=2, pad_rows=False)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        state = {}
        for t in range(3):
            model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
    C = model.decoder.embed_dim
    self_attn = {k: v for k, v in state.items() if "prev_key" in v and v["prev_key"].size(2) == 3}
    assert len(self_attn) == 2  # one per decoder layer
    for buffer in self_attn.values():
        assert set(buffer) == {"prev_key", "prev_value", "prev_key_padding_mask"}
        assert buffer["prev_value"].shape == (2, model.decoder.layers[0].self_attn.num_heads, 3,
                                              C // model.decoder.layers[0].self_attn.num_heads)


class _Encoder:
    name = "encoder"


def _ffn(layer):
    F = torch.nn.functional
    return lambda u: F.linear(torch.relu(F.linear(u, layer.fc1.weight, layer.fc1.bias)), layer.fc2.weight,
                              layer.fc2.bias)


def test_the_first_layer_that_runs_gives_v1():
    """Under LayerDrop the first layer that runs takes its own values as V_1: with layer 0 left out, layer 1 runs
    as a first layer (plain attention) and layer 2 mixes layer 1's values."""
    d = make_dictionary()
    model = _model(d=d)
    randomise_scheme_parameters(model)
    src, lengths, _, _ = random_batch(d)
    pad = src.eq(d.pad())
    with torch.no_grad():
        x, _ = model.encoder.forward_embedding(src)
        x = (x * (1 - pad.unsqueeze(-1).type_as(x))).transpose(0, 1)
        state, ctx = [x], {}
        for layer in model.encoder.layers[1:]:
            state, ctx = layer(state, pad, ctx=ctx)
        ref, h = ValueResidual(), x
        ref.pad, ref.first = pad, None
        for l, layer in enumerate(model.encoder.layers[1:]):
            h = ref.sublayer(_Encoder, layer, l, "self_attn", h, None)
            h = Transcription.sublayer(ref, _Encoder, layer, l, "ffn", h, _ffn(layer))
    keep = ~pad.t()
    assert (state[0] - h)[keep].abs().max().item() <= 1e-5
    with torch.no_grad():  # negative control: all three layers
        for layer in model.encoder.layers:
            x_all, _ = layer([x], pad)
    assert (state[0] - x_all[0])[keep].abs().max().item() > 1e-3


def test_an_unknown_mix_is_refused_naming_the_flag_and_the_choices():
    """argparse refuses it on the command line; a Hydra config reaches the scheme's own check."""
    from fairseq_residual.schemes import get_scheme
    from fairseq_residual.schemes.base import OptionError

    with pytest.raises(OptionError, match=r"--value-residual-mix \(model.value_residual_mix\) must be one of fixed, "
                                          r"learned .*got 'half'"):
        get_scheme("value_residual").validate(argparse.Namespace(value_residual_mix="half"))

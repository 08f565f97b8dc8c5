"""Frac-connections beyond the conformance suite: the static variant and m = 2 against the transcription, the
start as Pre-LN exactly (eq. 15), m = 1 equal to hyper-connections with one stream (the paper's n = 1 case), the
eval path equal to the training path, no widening of the state, and a number of fractions that does not
divide the width refused."""
import pytest
import torch

from conftest import build_model, load_shared_weights, make_dictionary, max_log_prob_difference, random_batch
from references import FracConnections, reference_forward
from test_conformance import randomise_scheme_parameters

DEPTH = ["--encoder-layers", 2, "--decoder-layers", 2]


def tiny(*flags, d=None, seed=1, scheme="frac_connections"):
    torch.manual_seed(seed)
    model, args, task = build_model("residual_transformer_tiny", "--residual-scheme", scheme, *flags,
                                    dictionary=d or make_dictionary())
    return model


def _no_dropout(model):
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout) or hasattr(m, "apply_during_inference"):
            m.p = 0.0


@pytest.mark.parametrize("fracs, static", [(2, False), (4, True)])
def test_matches_the_transcription_in_eval_and_training(fracs, static):
    d = make_dictionary()
    model = tiny("--frac-connections-fracs", fracs, *(["--frac-connections-static"] if static else []), *DEPTH, d=d)
    assert (model.encoder.layers[0].ffn_residual.dynamic_alpha_fn is None) == static
    randomise_scheme_parameters(model)
    src, lengths, prev, _ = random_batch(d, bsz=4)
    keep = prev.ne(d.pad())
    with torch.no_grad():
        _, lp_ref = reference_forward(model, src, prev, FracConnections(fracs, static=static))
        model.eval()
        lp_eval = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    model.train()
    _no_dropout(model)
    lp_train = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    lp_train.sum().backward()
    assert (lp_eval - lp_ref)[keep].abs().max().item() <= 1e-5
    assert (lp_train.detach() - lp_ref)[keep].abs().max().item() <= 1e-5
    res = model.decoder.layers[1].encoder_attn_residual
    assert res.static_alpha.grad.abs().max() > 0 and res.static_beta.grad.abs().max() > 0


def test_starts_as_pre_ln_exactly_and_keeps_one_stream():
    d = make_dictionary()
    ours = tiny(*DEPTH, d=d)
    res = ours.encoder.layers[0].self_attn_residual
    assert torch.equal(res.static_alpha, torch.cat([torch.eye(4), torch.eye(4)], dim=1))
    assert torch.equal(res.static_beta, torch.ones(4)) and not res.dynamic_alpha_fn.any()
    assert getattr(res.static_alpha, "optim_overrides", None) == {"weight_decay": 0.0}
    torch.manual_seed(1)
    pre, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "pre_ln", *DEPTH, dictionary=d)
    load_shared_weights(ours, pre)
    assert max_log_prob_difference(ours, pre, d) <= 1e-5
    src, lengths, _, _ = random_batch(d, bsz=4)
    with torch.no_grad():
        states = ours.encoder(src, src_lengths=lengths, return_all_hiddens=True)["encoder_states"]
    assert all(s.shape == (src.size(1), src.size(0), ours.encoder.embed_tokens.embedding_dim) for s in states)


def test_one_fraction_is_hyper_connections_with_one_stream():
    d = make_dictionary()
    frac = tiny("--frac-connections-fracs", 1, *DEPTH, d=d)
    randomise_scheme_parameters(frac)
    hc = tiny("--hc-streams", 1, *DEPTH, d=d, scheme="hyper_connections")
    own = hc.state_dict()
    hc.load_state_dict({k: own[k] if "residual_scheme_id" in k else v for k, v in frac.state_dict().items()})
    assert max_log_prob_difference(frac, hc, d) <= 1e-5


def test_a_number_of_fractions_that_does_not_divide_the_width_is_refused():
    with pytest.raises(ValueError, match=r"--frac-connections-fracs 3 does not divide --encoder-embed-dim 64.*divisor"):
        tiny("--frac-connections-fracs", 3)

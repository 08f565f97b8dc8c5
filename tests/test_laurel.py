"""LAuReL (``--residual-scheme laurel``): RW and LR against their transcriptions (PA is checked by the
registry-wide suite, tests/test_conformance.py), their incremental decoding, the starting points (RW's
alpha = beta = 1/2; LR and PA as Pre-LN, from Pre-LN's draws), PA's activations in the context, and the
refusal of a rank above the width."""
import pytest
import torch

from conftest import build_model, log_probs, make_dictionary, random_batch
from references import Laurel, Transcription, assert_matches_transcription
from test_conformance import randomise_scheme_parameters

DEPTH = ["--encoder-layers", 3, "--decoder-layers", 2]


def _model(*flags, d, seed=0, scheme="laurel"):
    torch.manual_seed(seed)
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", scheme, *DEPTH, *flags, dictionary=d)
    return model.eval()


CONTROLS = {"rw": Transcription(), "lr": Laurel("lr", low_rank_on_branch_input=True)}


@pytest.mark.parametrize("variant", ["rw", "lr"])
def test_matches_its_transcription(variant):
    d = make_dictionary()
    model = _model("--laurel-variant", variant, "--laurel-rank", 3, d=d)
    randomise_scheme_parameters(model)
    assert_matches_transcription(model, d, Laurel(variant), [CONTROLS[variant]])  # controls: Pre-LN; B A on LN(x)


@pytest.mark.parametrize("variant", ["rw", "lr"])
def test_incremental_decoding_equals_the_full_forward(variant):
    d = make_dictionary()
    model = _model("--laurel-variant", variant, "--laurel-rank", 3, d=d)
    randomise_scheme_parameters(model)
    src, lengths, prev, _ = random_batch(d, bsz=3, pad_rows=False)
    with torch.no_grad():
        full = log_probs(model, src, lengths, prev)
        enc_out, state = model.encoder(src, src_lengths=lengths), {}
        for t in range(prev.size(1)):
            out = model.decoder(prev[:, : t + 1], encoder_out=enc_out, incremental_state=state)
            lp = model.get_normalized_probs(out, log_probs=True)[:, -1, :]
            assert (lp - full[:, t]).abs().max().item() <= 1e-5, f"step {t}"


def test_rw_starts_with_alpha_and_beta_one_half():
    d = make_dictionary()
    model = _model("--laurel-variant", "rw", d=d)
    weights = [m.w for m in model.modules() if hasattr(m, "w") and isinstance(m.w, torch.nn.Parameter)]
    assert len(weights) == 3 * 2 + 2 * 3 and all(torch.equal(w, torch.zeros(2)) for w in weights)


@pytest.mark.parametrize("variant", ["lr", "pa"])
def test_lr_and_pa_start_as_pre_ln_from_pre_lns_draws(variant):
    """B = 0 and A the paper's deterministic pattern: the model is Pre-LN's with the same seed."""
    d = make_dictionary()
    model = _model("--laurel-variant", variant, "--laurel-rank", 4, d=d)
    pre_ln = _model(d=d, scheme="pre_ln")
    for name, p in pre_ln.state_dict().items():
        if not name.endswith("residual_scheme_id"):
            assert torch.equal(p, model.state_dict()[name]), name
    extra = {k for k in model.state_dict() if k not in pre_ln.state_dict() and not k.endswith("residual_scheme_id")}
    per_sublayer = {"lr": {"A", "B"}, "pa": {"A", "B", "gamma"}}[variant]
    assert len(extra) == len(per_sublayer) * (3 * 2 + 2 * 3) and {k.rsplit(".", 1)[1] for k in extra} == per_sublayer
    A = model.encoder.layers[1].ffn_residual.A  # 4 x 64: A[j, i] = 1/sqrt(4 * 64) where i mod 4 = j
    assert torch.equal(A @ A.t(), torch.eye(4) * 16 / (4 * 64))
    assert A[1, 5].item() == 1 / 16 and A[1, 6].item() == 0
    src, lengths, prev, _ = random_batch(d)
    with torch.no_grad():
        torch.testing.assert_close(log_probs(model, src, lengths, prev), log_probs(pre_ln, src, lengths, prev),
                                   rtol=0, atol=1e-5)


def test_pa_keeps_the_k_minus_1_earlier_streams_in_the_context():
    d = make_dictionary()
    model = _model("--laurel-variant", "pa", "--laurel-activations", 3, d=d)
    from test_context import context_keys_per_layer

    returned = context_keys_per_layer(model, d)
    assert len(returned) == 3 + 2 and all(keys == {"laurel.x1", "laurel.x2"} for keys in returned)


def test_a_rank_above_the_width_is_refused():
    with pytest.raises(ValueError, match=r"--laurel-rank \(model.laurel_rank\) must be at most the model width.*"
                                         r"got 1000 > --encoder-embed-dim"):
        _model("--laurel-variant", "lr", "--laurel-rank", 1000, d=make_dictionary())

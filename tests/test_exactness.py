"""Post-LN and Pre-LN equal fairseq's stock ``transformer`` (normalize_before False / True) given the
same weights, encoder output and decoder log-probabilities, with padding in the batch; ResiDual's
``--resi-dual-start-from zeros`` ablation equals its transcription. Every scheme's computation against a
transcription of its reference: tests/test_conformance.py.
"""
import pytest
import torch

from conftest import build_model, log_probs, make_dictionary, random_batch
from references import ResiDual, reference_forward


TOL = 1e-5


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
# ResiDual's ablation (its default computation: tests/test_conformance.py)


def test_resi_dual_start_from_zeros_matches_reference():
    """The ablation ``--resi-dual-start-from zeros``: x_d = c*sum(h), the embedding not in x_d."""
    d = make_dictionary()
    flags = ["--residual-scheme", "resi_dual", "--resi-dual-scale", 0.5, "--encoder-layers", 3,
             "--decoder-layers", 2]
    model, _, _ = build_model("residual_transformer_tiny", *flags, "--resi-dual-start-from", "zeros",
                              dictionary=d)
    src, lengths, prev, tgt = random_batch(d, bsz=5)
    tgt_keep = prev.ne(d.pad())
    c, alpha = {"encoder": 0.5, "decoder": 0.5}, {"encoder": 1.0, "decoder": 1.0}
    with torch.no_grad():
        _, lp_ref = reference_forward(model, src, prev, ResiDual(c, alpha, start=0.0))
        lp = log_probs(model, src, lengths, prev)
        _, lp_emb = reference_forward(model, src, prev, ResiDual(c, alpha))
    assert (lp - lp_ref)[tgt_keep].abs().max().item() <= TOL
    assert (lp - lp_emb)[tgt_keep].abs().max().item() > 1e-3  # the default start differs
    with pytest.raises(SystemExit):  # argparse refuses an unknown choice
        build_model("residual_transformer_tiny", *flags, "--resi-dual-start-from", "noise", dictionary=d)

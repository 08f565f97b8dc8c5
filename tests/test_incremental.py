"""Incremental decoding equals the full forward pass, also after beam search reorders the batch."""
import pytest
import torch

from conftest import build_model, make_dictionary, random_batch
from fairseq_residual.schemes import SCHEME_NAMES

pytestmark = pytest.mark.model

SCHEMES = list(SCHEME_NAMES)  # every registered scheme
TOL = 1e-5


#: non-default options, so that a constant lost between steps shows
SCHEME_FLAGS = {"resi_dual": ["--resi-dual-scale", 0.5, "--decoder-resi-dual-alpha", 0.8]}


def tiny(scheme, d, *flags):
    model, args, task = build_model(
        "residual_transformer_tiny", "--residual-scheme", scheme, *SCHEME_FLAGS.get(scheme, []), *flags,
        dictionary=d,
    )
    return model, args, task


def full_log_probs(model, src, lengths, prev):
    out = model(src, lengths, prev)
    return model.get_normalized_probs(out, log_probs=True)


def step(model, prefix, enc_out, state):
    """One incremental step: log-probs B x V of the token after ``prefix`` (B x t)."""
    out = model.decoder(prefix, encoder_out=enc_out, incremental_state=state)
    return model.get_normalized_probs(out, log_probs=True)[:, -1, :]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_incremental_equals_full_and_survives_reorder(scheme):
    d = make_dictionary()
    model, _, _ = tiny(scheme, d)
    # two sentences x three beams, as fairseq's SequenceGenerator lays them out
    src, lengths, _, _ = random_batch(d, bsz=2, src_len=7)
    rows = torch.tensor([0, 0, 0, 1, 1, 1])
    src, lengths = src[rows], lengths[rows]
    _, _, prev, _ = random_batch(d, bsz=6, tgt_len=6, seed=3, pad_rows=False)
    with torch.no_grad():
        full = full_log_probs(model, src, lengths, prev)  # B x T x V
        enc_out = model.encoder(src, src_lengths=lengths)
        state = {}
        k = 3
        for t in range(k):
            lp = step(model, prev[:, : t + 1], enc_out, state)
            assert (lp - full[:, t]).abs().max().item() <= TOL, f"step {t}"

        # beam search keeps some hypotheses of each sentence, duplicates others, drops the rest
        # (always within a sentence's beams: fairseq skips reordering the cross-attention cache)
        new_order = torch.tensor([1, 1, 0, 5, 3, 3])
        enc_out = model.encoder.reorder_encoder_out(enc_out, new_order)
        model.decoder.reorder_incremental_state_scripting(state, new_order)
        prev_r = prev[new_order]
        full_r = full_log_probs(model, src[new_order], lengths[new_order], prev_r)
        for t in range(k, prev.size(1)):
            lp = step(model, prev_r[:, : t + 1], enc_out, state)
            assert (lp - full_r[:, t]).abs().max().item() <= TOL, f"step {t} after reorder"
        # and a reorder that is ignored would be caught: the rows really differ
        assert (full_r[0, k:] - full[0, k:]).abs().max().item() > 1e-4


@pytest.mark.parametrize("scheme", SCHEMES)
def test_beam_search_scores_equal_teacher_forced_scores(scheme):
    """Beam 5 with fairseq's SequenceGenerator: each hypothesis' per-token scores must equal the
    log-probabilities of the same tokens under one full (teacher-forced) forward pass."""
    from fairseq.sequence_generator import SequenceGenerator

    d = make_dictionary()
    model, _, _ = tiny(scheme, d)
    src, lengths, _, _ = random_batch(d, bsz=3, src_len=6)
    gen = SequenceGenerator([model], d, beam_size=5, max_len_a=0, max_len_b=7, min_len=2)
    with torch.no_grad():
        hypos = gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    checked = 0
    for i, nbest in enumerate(hypos):
        assert len(nbest) == 5
        for hypo in nbest[:3]:
            tokens = hypo["tokens"]  # ends with eos
            prev = torch.cat([torch.tensor([d.eos()]), tokens[:-1]]).unsqueeze(0)
            with torch.no_grad():
                lp = full_log_probs(model, src[i : i + 1], lengths[i : i + 1], prev)[0]
            tf = lp.gather(1, tokens.unsqueeze(1)).squeeze(1)
            assert torch.allclose(tf, hypo["positional_scores"], atol=1e-4), (tf, hypo["positional_scores"])
            checked += 1
    assert checked == 9

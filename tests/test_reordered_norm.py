"""The reordered norm without QK-norm (its default; the registry-wide suite builds it with QK-norm): exact against
the transcription, and QK-norm's gains exist only when asked for."""
import torch

from conftest import build_model, make_dictionary, random_batch
from references import ReorderedNorm, reference_forward
from test_conformance import DEPTH, TOL, randomise_scheme_parameters


def test_without_qk_norm_matches_its_transcription_and_has_no_qk_gains():
    d = make_dictionary()
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "reordered_norm", *DEPTH, dictionary=d)
    assert not [n for n, _ in model.named_parameters() if "proj.norm" in n]
    assert not [n for n, _ in model.named_parameters() if n.endswith("layers.0.self_attn_layer_norm.weight")]
    randomise_scheme_parameters(model)
    src, lengths, prev, _ = random_batch(d, bsz=5)
    with torch.no_grad():
        _, lp_ref = reference_forward(model, src, prev, ReorderedNorm())
        _, lp_ctl = reference_forward(model, src, prev, ReorderedNorm(input_norm=True))
        lp = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    keep = prev.ne(d.pad())
    assert (lp - lp_ref)[keep].abs().max().item() <= TOL
    assert (lp - lp_ctl)[keep].abs().max().item() > 1e-3


def test_qk_norm_adds_one_gain_per_query_and_key_projection():
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "reordered_norm",
                              "--reordered-norm-qk-norm", *DEPTH)
    gains = [n for n, _ in model.named_parameters() if "proj.norm" in n]
    # encoder: 3 self-attentions; decoder: 2 self- and 2 cross-attentions; q and k each
    assert len(gains) == 2 * (3 + 2 * 2)

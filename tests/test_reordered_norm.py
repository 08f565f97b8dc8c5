"""The reordered norm without QK-norm (its default; the registry-wide suite builds it with QK-norm): exact against
the transcription, and QK-norm's gains exist only when asked for."""

from conftest import build_model, make_dictionary
from references import ReorderedNorm, assert_matches_transcription
from test_conformance import DEPTH, TOL, randomise_scheme_parameters


def test_without_qk_norm_matches_its_transcription_and_has_no_qk_gains():
    d = make_dictionary()
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "reordered_norm", *DEPTH, dictionary=d)
    assert not [n for n, _ in model.named_parameters() if "proj.norm" in n]
    assert not [n for n, _ in model.named_parameters() if n.endswith("layers.0.self_attn_layer_norm.weight")]
    randomise_scheme_parameters(model)
    assert_matches_transcription(model, d, ReorderedNorm(), [ReorderedNorm(input_norm=True)], tol=TOL)


def test_qk_norm_adds_one_gain_per_query_and_key_projection():
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "reordered_norm",
                              "--reordered-norm-qk-norm", *DEPTH)
    gains = [n for n, _ in model.named_parameters() if "proj.norm" in n]
    # encoder: 3 self-attentions; decoder: 2 self- and 2 cross-attentions; q and k each
    assert len(gains) == 2 * (3 + 2 * 2)

"""ResiDual's dual-stream scale c: invisible in the output, visible in the range of x_d; validated."""
import math

import pytest
import torch

from conftest import build_model, make_dictionary, random_batch
from fairseq_residual.schemes.resi_dual import ResiDualDecoderLayer, ResiDualEncoderLayer

pytestmark = pytest.mark.model


def model_with_scale(c, d, state_dict=None):
    model, _, _ = build_model(
        "residual_transformer_tiny", "--residual-scheme", "resi_dual", "--resi-dual-scale", c,
        "--encoder-layers", 4, "--decoder-layers", 4, dictionary=d,
    )
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model


def run_and_track_x_d(model, batch):
    """Log-probs and the largest |x_d| over all ResiDual layers (forward hooks on layer outputs)."""
    largest = []

    def hook(module, inputs, output):
        largest.append(output[1].abs().max().item())

    handles = [
        m.register_forward_hook(hook)
        for m in model.modules()
        if isinstance(m, (ResiDualEncoderLayer, ResiDualDecoderLayer))
    ]
    src, lengths, prev, _ = batch
    with torch.no_grad():
        lp = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    for h in handles:
        h.remove()
    assert len(largest) == 8  # 4 encoder + 4 decoder layers
    return lp, max(largest)


def test_small_scale_keeps_output_and_shrinks_dual_stream():
    d = make_dictionary()
    ref = model_with_scale(1.0, d)
    small = model_with_scale(0.05, d, state_dict=ref.state_dict())
    assert small.encoder.dual_scale == 0.05 and small.decoder.dual_scale == 0.05
    batch = random_batch(d, bsz=4)
    lp_ref, xd_ref = run_and_track_x_d(ref, batch)
    lp_small, xd_small = run_and_track_x_d(small, batch)
    assert (lp_ref - lp_small).abs().max().item() <= 1e-4
    assert xd_ref / xd_small == pytest.approx(20.0, rel=1e-3)


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--resi-dual-scale", 0),
        ("--resi-dual-scale", -0.5),
        ("--resi-dual-scale", 1.5),
        ("--resi-dual-scale", float("nan")),
        ("--encoder-resi-dual-scale", 2.0),
        ("--decoder-resi-dual-scale", 0.0),
    ],
)
def test_scale_outside_unit_interval_is_refused(flag, value):
    with pytest.raises(ValueError, match=r"resi-dual-scale.*must be in \(0, 1\]"):
        build_model("residual_transformer_tiny", flag, value)


def test_non_finite_alpha_is_refused():
    with pytest.raises(ValueError, match="--decoder-resi-dual-alpha must be a finite number"):
        build_model("residual_transformer_tiny", "--decoder-resi-dual-alpha", math.inf)


def test_normalize_before_contradicting_the_scheme_is_refused():
    with pytest.raises(ValueError, match="--encoder-normalize-before asks for Pre-LN but --residual-scheme is resi_dual"):
        build_model("residual_transformer_tiny", "--encoder-normalize-before")
    # with pre_ln it is simply redundant
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "pre_ln", "--encoder-normalize-before")
    assert model.encoder.layers[0].normalize_before


def test_cross_self_attention_is_refused_for_resi_dual():
    with pytest.raises(
        ValueError, match="--cross-self-attention is not supported with --residual-scheme resi_dual"
    ):
        build_model("residual_transformer_tiny", "--cross-self-attention")
    # post_ln / pre_ln keep fairseq's behaviour
    build_model("residual_transformer_tiny", "--residual-scheme", "post_ln", "--cross-self-attention")

"""ResiDual's dual-stream scale c: invisible in the output down to its lower bound, visible in the range of
x_d; validated."""
import math

import pytest
import torch

from conftest import build_model, make_dictionary, random_batch
from fairseq_residual.schemes.resi_dual import MIN_SCALE



def model_with_scale(c, d, state_dict=None):
    model, _, _ = build_model(
        "residual_transformer_tiny", "--residual-scheme", "resi_dual", "--resi-dual-scale", c,
        "--encoder-layers", 4, "--decoder-layers", 4, dictionary=d,
    )
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model


def run_and_track_x_d(model, batch):
    """Log-probs and the largest |x_d| over all ResiDual layers (forward hooks on layer outputs, read through
    the stack's view of the residual state)."""
    largest = []

    def hook_of(stack):
        def hook(module, inputs, output):
            largest.append(stack.layer_view(output)[1]["x_d"].abs().max().item())
        return hook

    handles = [layer.register_forward_hook(hook_of(stack))
               for stack in (model.encoder, model.decoder) for layer in stack.layers]
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
    assert small.encoder.residual.dual_scale == 0.05 and small.decoder.residual.dual_scale == 0.05
    batch = random_batch(d, bsz=4)
    lp_ref, xd_ref = run_and_track_x_d(ref, batch)
    lp_small, xd_small = run_and_track_x_d(small, batch)
    assert (lp_ref - lp_small).abs().max().item() <= 1e-4
    assert xd_ref / xd_small == pytest.approx(20.0, rel=1e-3)


def test_the_smallest_allowed_scale_still_changes_nothing_but_the_range():
    """At c = MIN_SCALE the log-probabilities equal those at c = 1 (to float rounding): LN_final's eps
    scales with c^2. The authors' fixed eps 1e-7 at the same c moves them (negative control), and a c below
    the bound is refused."""
    d = make_dictionary()
    ref = model_with_scale(1.0, d)
    at_bound = model_with_scale(MIN_SCALE, d, state_dict=ref.state_dict())
    assert at_bound.decoder.layer_norm.eps == pytest.approx(1e-7 * MIN_SCALE ** 2)
    batch = random_batch(d, bsz=4)
    lp_ref, xd_ref = run_and_track_x_d(ref, batch)
    lp_bound, xd_bound = run_and_track_x_d(at_bound, batch)
    assert (lp_ref - lp_bound).abs().max().item() <= 1e-5
    assert xd_ref / xd_bound == pytest.approx(1 / MIN_SCALE, rel=1e-3)
    for stack in (at_bound.encoder, at_bound.decoder):
        stack.layer_norm.eps = 1e-7  # the authors' LN_final
    lp_fixed_eps, _ = run_and_track_x_d(at_bound, batch)
    assert (lp_ref - lp_fixed_eps).abs().max().item() > 1e-4
    with pytest.raises(ValueError, match=r"--resi-dual-scale \(model.resi_dual_scale\) must be in \[0.01, 1\]"):
        build_model("residual_transformer_tiny", "--resi-dual-scale", MIN_SCALE / 2)


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
    with pytest.raises(ValueError, match=rf"{flag} \(model.\w+\) must be in \[0.01, 1\]"):
        build_model("residual_transformer_tiny", flag, value)


@pytest.mark.parametrize("value", [math.inf, -1e308, 1e308, float("nan"), -0.5, 11.0])
def test_alpha_outside_its_range_is_refused(value):
    with pytest.raises(ValueError, match=r"--decoder-resi-dual-alpha \(model.decoder_resi_dual_alpha\) must be "
                                         r"in \[0, 10\]"):
        build_model("residual_transformer_tiny", f"--decoder-resi-dual-alpha={value!r}")


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

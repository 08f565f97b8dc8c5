"""The running sums' peaks (fairseq_residual/analyze/ranges.py), which docs/precision.md tabulates: every
scheme's forward shows them, including the sums a post-norm brings back to unit scale before any layer
output could show them, and an fp16 overflow is recorded as inf."""
import math

import pytest
import torch

from conftest import build_model, make_dictionary, random_batch
from fairseq_residual.analyze.ranges import RunningSums
from fairseq_residual.schemes import SCHEME_NAMES


DEPTH = ["--encoder-layers", 2, "--decoder-layers", 2]


def _tiny(scheme, d):
    torch.manual_seed(1)
    return build_model("residual_transformer_tiny", "--residual-scheme", scheme, *DEPTH, dictionary=d)[0].eval()


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_every_scheme_shows_its_running_sums_and_the_hooks_go(scheme):
    d = make_dictionary()
    model = _tiny(scheme, d)
    src, lengths, prev, _ = random_batch(d)
    with torch.no_grad():
        before = model(src, lengths, prev)[0]
        with RunningSums(model) as sums:
            during = model(src, lengths, prev)[0]
        after = model(src, lengths, prev)[0]
    assert torch.equal(before, during) and torch.equal(before, after)
    top = sums.top()
    assert 0 < top["peak"] < 1e3 and top["fp16_headroom"] > 1, top
    assert any(site.startswith("encoder.") for site in sums.peaks) and any(s.startswith("decoder.") for s in sums.peaks)
    assert not [m for m in model.modules() if m._forward_pre_hooks]
    assert not [m for m in model.modules() if {"prepare", "update", "start", "between"} & set(vars(m))]


@pytest.mark.parametrize("scheme", ["post_ln", "deepnorm"])
def test_a_sum_that_a_post_norm_hides_is_seen(scheme):
    """FFN outputs 1e6 times too large: the post-norm brings the layer output back to unit scale, so the
    layer outputs (inner_states) stay small, but the sum before that norm is over fp16's limit: the peak says
    so, at a LayerNorm's input or the residual's update."""
    d = make_dictionary()
    model = _tiny(scheme, d)
    with torch.no_grad():
        for layer in model.encoder.layers:
            layer.fc2.weight.mul_(1e6)
    src, lengths, prev, _ = random_batch(d)
    with torch.no_grad(), RunningSums(model) as sums:
        enc = model.encoder(src, src_lengths=lengths, return_all_hiddens=True)
    assert max(float(h.abs().max()) for h in enc["encoder_states"]) < 100
    top = sums.top()
    assert top["peak"] > 65504 and top["fp16_headroom"] < 1 and top["site"].startswith("encoder.layers."), top


def test_an_fp16_overflow_is_inf_and_gradients_are_recorded():
    d = make_dictionary()
    model = _tiny("resi_dual", d).train()
    src, lengths, prev, _ = random_batch(d)
    with RunningSums(model, gradients=True) as sums:
        model(src, lengths, prev)[0].float().logsumexp(-1).sum().backward()
    assert sums.top(grads=True)["peak"] > 0 and set(sums.grad_peaks) <= set(sums.peaks)
    with torch.no_grad():
        model.encoder.layers[0].fc2.weight.mul_(1e6)
    half = model.half().eval()
    with torch.no_grad(), RunningSums(half) as sums:
        half(src, lengths, prev)
    assert sums.top()["peak"] == math.inf and sums.top()["fp16_headroom"] == 0


@pytest.mark.parametrize("scheme, scaled", [("hyper_connections", False), ("post_ln", True)])
def test_the_analysis_tool_reports_the_largest_running_sum(scheme, scaled):
    """``fairseq-residual-analyze``'s ``running_sums`` is the peak a plain forward shows under RunningSums (on a
    scheme whose width mixings the tool also records, so both wrap the same ``prepare``), every wrapper is gone
    after it, and a sum over fp16's range (Post-LN with FFN outputs 1e6 too large) is flagged in the summary."""
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    from fairseq_residual.analyze import analyze_model
    from fairseq_residual.analyze.cli import summary_table

    d = make_dictionary()
    model, _, task = build_model("residual_transformer_tiny", "--residual-scheme", scheme, *DEPTH, "--dropout", 0,
                                 dictionary=d)
    if scaled:
        with torch.no_grad():
            for layer in model.encoder.layers:
                layer.fc2.weight.mul_(1e6)
    src, lengths, prev, tgt = random_batch(d)
    with torch.no_grad(), RunningSums(model.eval()) as plain:
        model(src, lengths, prev)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
              "target": tgt, "ntokens": int(tgt.ne(d.pad()).sum()), "nsentences": src.size(0)}
    got = analyze_model(model, LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1),
                        [sample])["running_sums"]
    want = plain.top()
    assert got["site"] == want["site"] and got["peak"] == pytest.approx(want["peak"], rel=1e-6), (got, want)
    assert not [m for m in model.modules() if m._forward_pre_hooks or m._forward_hooks]
    assert not [m for m in model.modules() if {"prepare", "update", "start", "between", "final_input"} & set(vars(m))]
    run = {"label": scheme, "encoder_layers": 2, "decoder_layers": 2, "cosine_consecutive": {"encoder": [], "decoder": []},
           "grad_norm_low_top": {"encoder": 1.0, "decoder": 1.0}, "running_sums": got}
    table = summary_table([run])
    if scaled:
        assert got["fp16_headroom"] < 1 and "!)" in table and f"largest running sum of {scheme} is above" in table
    else:
        assert got["fp16_headroom"] > 10 and "!" not in table and "largest running sum" not in table

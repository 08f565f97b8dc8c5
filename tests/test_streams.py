"""What the conformance suite does not see of the multi-stream schemes (hyper-connections, mHC,
SiameseNorm): the static variant and other stream counts against the transcription, the starting point
(every scheme starts as Pre-LN, mHC's H_res near the identity and doubly stochastic), SiameseNorm's c_l,
coefficients computed in fp32 under bf16, and the static connection weights' exemption from weight decay
through fairseq's own optimizer construction."""
import math

import pytest
import torch

from conftest import build_model, load_shared_weights, make_dictionary, max_log_prob_difference, random_batch
from references import HyperConnections, reference_forward
from test_conformance import randomise_scheme_parameters


DEPTH = ["--encoder-layers", 3, "--decoder-layers", 2]


def tiny(*flags, d=None, seed=1):
    torch.manual_seed(seed)
    model, args, task = build_model("residual_transformer_tiny", *flags, dictionary=d or make_dictionary())
    return model


@pytest.mark.parametrize("streams, static", [(1, False), (2, True), (4, False), (5, True)])
def test_hyper_connections_match_the_transcription_for_other_stream_counts_and_static(streams, static):
    d = make_dictionary()
    model = tiny("--residual-scheme", "hyper_connections", "--hc-streams", streams,
                 *(["--hc-static"] if static else []), *DEPTH, d=d)
    assert (model.encoder.layers[0].ffn_residual.dynamic_alpha_fn is None) == static
    randomise_scheme_parameters(model)
    src, lengths, prev, _ = random_batch(d, bsz=5)
    with torch.no_grad():
        _, lp_ref = reference_forward(model, src, prev, HyperConnections(streams, static=static))
        lp = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    assert (lp - lp_ref)[prev.ne(d.pad())].abs().max().item() <= 1e-5
    # initialisation: the one-hot A_m cycles over the stack's sub-layers, k mod n with k counting SA, CA, FFN
    # in order (so the decoder's cycle does not line up with its layers); A_r = I, B = 1
    fresh = tiny("--residual-scheme", "hyper_connections", "--hc-streams", streams, *DEPTH, d=d)
    residuals = [getattr(layer, f"{kind}_residual") for layer in fresh.decoder.layers
                 for kind in ("self_attn", "encoder_attn", "ffn")]
    assert [r.static_alpha[:, 0].argmax().item() for r in residuals] == [k % streams for k in range(len(residuals))]
    assert all(torch.equal(r.static_alpha[:, 0].sum(), torch.tensor(1.0)) for r in residuals)
    assert all(torch.equal(r.static_alpha[:, 1:], torch.eye(streams)) for r in residuals)
    assert all(torch.equal(r.static_beta, torch.ones(streams)) for r in residuals)


@pytest.mark.parametrize("scheme, flags, tol", [
    ("hyper_connections", ["--hc-streams", 4], 5e-5),
    ("hyper_connections", ["--hc-streams", 3, "--hc-static"], 5e-5),
    ("mhc", ["--mhc-streams", 4], 2e-2),
])
def test_multi_stream_schemes_start_as_pre_ln(scheme, flags, tol):
    """At initialisation every stream is the Pre-LN residual stream (hyper-connections exactly, up to the final
    LayerNorm's eps, which sees n times the stream; mHC up to its H_res, within 1.3e-3 of the identity, and its
    branch reading LN(n/2 x) = LN(x)): with the weights of a Pre-LN model of the same seed, the log-probabilities
    agree."""
    d = make_dictionary()
    ours = tiny("--residual-scheme", scheme, *flags, *DEPTH, d=d)
    pre = tiny("--residual-scheme", "pre_ln", *DEPTH, d=d)
    load_shared_weights(ours, pre)
    assert max_log_prob_difference(ours, pre, d) <= tol


def test_mhc_mixing_is_doubly_stochastic_and_starts_near_the_identity():
    from fairseq_residual.schemes.mhc import sinkhorn_knopp

    d = make_dictionary()
    model = tiny("--residual-scheme", "mhc", *DEPTH, d=d)
    res = model.encoder.layers[0].self_attn_residual
    streams = torch.randn(4, 5, 3, 64)
    pre, post, h_res = res.coefficients(streams)
    one_hot = torch.full((4,), 0.5).index_fill_(0, torch.tensor(0), torch.sigmoid(torch.tensor(1.0)))  # sub-layer 0
    assert torch.allclose(pre, one_hot.expand_as(pre)) and torch.allclose(post, torch.ones_like(post))
    assert (h_res - torch.eye(4)).abs().max() < 1.3e-3
    randomise_scheme_parameters(model)
    with torch.no_grad():
        res.b_res.normal_()  # logits of order 1: the streams really mix
    _, _, h_res = res.coefficients(streams)
    assert (h_res - torch.eye(4)).abs().max() > 0.05
    torch.testing.assert_close(h_res.sum(-1), torch.ones(5, 3, 4))  # rows (eq. 9's T_r last): exactly stochastic
    torch.testing.assert_close(h_res.sum(-2), torch.ones(5, 3, 4), atol=1e-2, rtol=0)  # columns: after 20 rounds
    big = sinkhorn_knopp(torch.full((2, 2), 1e4), 20)  # no overflow for large logits
    assert torch.isfinite(big).all()


def _sinkhorn_loop(logits, rounds, dims):
    """Independent Sinkhorn-Knopp: exp, then ``rounds`` times normalise over ``dims[0]``, then ``dims[1]``."""
    m = torch.exp(logits)
    for _ in range(rounds):
        for dim in dims:
            m = m / m.sum(dim=dim, keepdim=True)
    return m


#: weakly coupled streams: H_res's logits with off-diagonal entries far below the diagonal and unequal, so that
#: Sinkhorn-Knopp converges slowly (20 rounds leave the 2 x 2 case 1.3e-2 from doubly stochastic)
WEAK = ([[0.0, -6.0], [-2.0, 0.0]],
        [[0.0, -8.0, -8.0], [-3.0, 0.0, -8.0], [-8.0, -5.0, 0.0]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rounds", [1, 3, 20])
@pytest.mark.parametrize("case", [0, 1])
def test_mhc_sinkhorn_normalises_columns_then_rows_as_eq_9(case, rounds, dtype):
    """The paper's eq. 9, ``M(t) = T_r(T_c(M(t-1)))``: columns first, rows last, so H_res's rows sum to 1 up to
    rounding after any number of rounds. Negative control: where the rounds have not converged, the transposed
    order (rows first, columns last, what the plugin computed before) gives another matrix, and by more than a
    margin that follows from the row sums alone: A (rows exact) and B (columns exact, row sums r_j) satisfy
    sum_i (A - B)[j, i] = 1 - r_j for every row j, so max |A - B| >= max_j |1 - r_j| / n."""
    from fairseq_residual.schemes.mhc import sinkhorn_knopp

    logits = torch.tensor(WEAK[case], dtype=dtype)
    n = logits.size(-1)
    got = sinkhorn_knopp(logits, rounds)
    want = _sinkhorn_loop(logits, rounds, (-2, -1))  # eq. 9
    other = _sinkhorn_loop(logits, rounds, (-1, -2))  # eq. 9 transposed
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got, want, rtol=8 * eps, atol=8 * eps)
    assert (got.sum(-1) - 1).abs().max().item() <= 4 * n * eps  # rows: exact up to rounding
    row_defect = (other.sum(-1) - 1).abs().max().item()
    assert row_defect > 1e-2, "the case must not converge within the rounds, or it cannot tell the orders apart"
    margin = row_defect / n - 4 * n * eps
    assert (got - other).abs().max().item() >= margin
    if case == 0 and rounds == 20:  # the derived bound against what the two orders give (2 x 2: exactly twice)
        assert margin > 6e-3 and (got - other).abs().max().item() > 1.3e-2


def test_mhc_model_follows_eq_9_where_sinkhorn_does_not_converge():
    """The whole model against the transcription with eq. 9's order and with the transposed order, with every
    H_res weakly coupled (b_res 0 on the diagonal, -2 to -8 off it, unequal): the model equals the first and
    differs from the second in its log-probabilities."""
    from references import MHC

    d = make_dictionary()
    model = tiny("--residual-scheme", "mhc", "--mhc-streams", 3, *DEPTH, d=d)
    randomise_scheme_parameters(model)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("b_res"):
                p.copy_(torch.tensor(WEAK[1]) + 0.3 * torch.randn(3, 3))
            elif name.endswith(("phi_res", "alpha_res")):
                p.zero_()  # H_res from b_res alone: the same weak coupling at every position
    src, lengths, prev, _ = random_batch(d, bsz=5)
    keep = prev.ne(d.pad())
    with torch.no_grad():
        lp = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
        _, lp_eq9 = reference_forward(model, src, prev, MHC(3))
        _, lp_transposed = reference_forward(model, src, prev, MHC(3, row_first=True))
    assert (lp - lp_eq9)[keep].abs().max().item() <= 1e-5
    assert (lp - lp_transposed)[keep].abs().max().item() > 1e-3


IDENTITY_CASES = [("hyper_connections", 2, False), ("hyper_connections", 4, False),
                  ("hyper_connections", 2, True), ("hyper_connections", 4, True),
                  ("mhc", 2, False), ("mhc", 4, False), ("mhc", 2, True), ("mhc", 4, True)]


def streams_model(scheme, streams, static, seed=1):
    """``(model, dictionary)``: a tiny float64 model of ``scheme`` (hyper-connections or mHC) with ``streams``
    streams, no dropout and randomised scheme parameters. ``static``: hyper-connections' static variant; for
    mHC, coefficients from the biases alone (projections and gates zero)."""
    d = make_dictionary()
    prefix = "hc" if scheme == "hyper_connections" else "mhc"
    flags = ["--residual-scheme", scheme, f"--{prefix}-streams", streams, "--dropout", 0, *DEPTH]
    if static and scheme == "hyper_connections":
        flags.append("--hc-static")
    model = tiny(*flags, d=d, seed=seed).double()
    randomise_scheme_parameters(model, seed=seed)
    if static and scheme == "mhc":
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.rsplit(".", 1)[-1] in ("phi_pre", "phi_post", "phi_res", "alpha_pre", "alpha_post",
                                               "alpha_res"):
                    p.zero_()
    return model, d


def restructured_against_frozen(scheme, streams, static, seed=1):
    """Max |difference| of the log-probabilities and of every parameter's gradient between a float64 model and
    its twin whose connections run the frozen computation (``tests/frozen_streams.py``), in training mode
    without dropout. ``static``: hyper-connections' static variant; for mHC, coefficients from the biases
    alone (projections and gates zero)."""
    import copy

    from frozen_streams import freeze

    model, d = streams_model(scheme, streams, static, seed)
    frozen = copy.deepcopy(model)
    assert freeze(frozen) == 2 * 3 + 3 * 2  # every connection of the 3 + 2 layers
    src, lengths, prev, _ = random_batch(d, bsz=5)
    weights = torch.randn(5, prev.size(1), len(d), dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    results = []
    for m in (model, frozen):
        m.train()
        m.zero_grad(set_to_none=True)
        lp = torch.log_softmax(m(src, lengths, prev)[0], dim=-1)  # fairseq's get_normalized_probs is fp32
        assert lp.dtype == torch.float64
        (lp * weights)[prev.ne(d.pad())].sum().div(prev.ne(d.pad()).sum()).backward()  # per-token mean
        results.append((lp.detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None}))
    (lp_new, grads_new), (lp_old, grads_old) = results
    keep = prev.ne(d.pad())
    assert grads_new.keys() == grads_old.keys() and any("residual" in n for n in grads_new)
    out_diff = (lp_new - lp_old)[keep].abs().max().item()
    grad_diff = max((grads_new[n] - grads_old[n]).abs().max().item() for n in grads_new)
    return out_diff, grad_diff


@pytest.mark.parametrize("scheme, streams, static", IDENTITY_CASES)
def test_restructured_connections_compute_the_frozen_function(scheme, streams, static):
    """The restructured hyper-connection / mHC residuals (one projection, normalisation after it, one mixing
    product, Sinkhorn-Knopp with its own backward, positions-first streams) compute the same function as the
    frozen copy of the computation they replace: in float64 on the whole model, log-probabilities and every
    parameter's gradient within 1e-12."""
    out_diff, grad_diff = restructured_against_frozen(scheme, streams, static)
    assert out_diff <= 1e-12 and grad_diff <= 1e-12, (out_diff, grad_diff)


def test_float64_coefficients_are_computed_in_float64():
    """In a float64 model the connection coefficients are float64 (at least fp32, never below the streams'
    precision): equal to a float64 computation, not rounded to fp32."""
    for scheme in ("hyper_connections", "mhc"):
        model = tiny("--residual-scheme", scheme).double()
        randomise_scheme_parameters(model)
        res = model.encoder.layers[0].self_attn_residual
        streams = torch.randn(4, 5, 3, 64, dtype=torch.float64)
        for got in res.coefficients(streams):
            assert got.dtype == torch.float64
        h_res_or_alpha = res.coefficients(streams)[-1 if scheme == "mhc" else 0]
        rounded = h_res_or_alpha.float().double()
        assert (h_res_or_alpha - rounded).abs().max() > 0  # not fp32 values in a float64 tensor


@pytest.mark.parametrize("rounds", [1, 20])
def test_sinkhorn_backward_recomputes_the_rounds_exactly(rounds):
    """Sinkhorn-Knopp's own backward (recomputing the rounds from the logits) gives autograd's gradient of the
    loop, and its forward is the loop, bit for bit; under TorchScript the loop itself runs."""
    from fairseq_residual.schemes.mhc import sinkhorn_knopp_positions_last, sinkhorn_knopp_recomputed

    gen = torch.Generator().manual_seed(0)
    logits = (2 * torch.randn(4, 4, 37, dtype=torch.float64, generator=gen)).requires_grad_()
    grad = torch.randn(4, 4, 37, dtype=torch.float64, generator=gen)
    got = sinkhorn_knopp_recomputed(logits, rounds)
    want = sinkhorn_knopp_positions_last(logits, rounds)
    assert torch.equal(got, want)
    g_got, = torch.autograd.grad(got, logits, grad)
    g_want, = torch.autograd.grad(want, logits, grad)
    assert (g_got - g_want).abs().max().item() <= 1e-13
    assert torch.autograd.gradcheck(lambda x: sinkhorn_knopp_recomputed(x, rounds), (logits,))
    f32 = logits.detach().float()
    assert torch.equal(sinkhorn_knopp_recomputed(f32, rounds), sinkhorn_knopp_positions_last(f32, rounds))
    scripted = torch.jit.script(sinkhorn_knopp_recomputed)
    assert torch.equal(scripted(f32, rounds), sinkhorn_knopp_positions_last(f32, rounds))


def test_siamese_norm_c_l_counts_the_sub_layers_of_its_stack():
    model = tiny("--residual-scheme", "siamese_norm", "--encoder-layers", 4, "--decoder-layers", 3)
    for stack, s in ((model.encoder, 2), (model.decoder, 3)):
        for l, layer in enumerate(stack.layers):
            assert 1 / layer.ffn_residual.inv_c == pytest.approx(math.sqrt(s * (l + 1)))
    # the reference's values for a 2-sub-layer block: 1.414, 2, 2.449, 2.828
    assert [round(1 / layer.ffn_residual.inv_c, 3) for layer in model.encoder.layers] == [1.414, 2.0, 2.449, 2.828]


@pytest.mark.parametrize("scheme", ["hyper_connections", "mhc"])
def test_coefficients_are_computed_in_fp32_under_bf16(scheme):
    """In a bf16 model the connection coefficients come from fp32 arithmetic: equal, to fp32 precision, to
    an fp32 computation with the same bf16-rounded parameters and streams (computing them in bf16 would be
    off by bf16's 3 digits)."""
    import copy

    d = make_dictionary()
    model = tiny("--residual-scheme", scheme, d=d)
    randomise_scheme_parameters(model)
    res_bf16 = copy.deepcopy(model.encoder.layers[0].self_attn_residual).bfloat16()
    res_fp32 = copy.deepcopy(res_bf16).float()  # the same rounded parameters, in fp32
    streams = torch.randn(4, 5, 3, 64).bfloat16()
    for got, want in zip(res_bf16.coefficients(streams), res_fp32.coefficients(streams.float())):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    model.bfloat16()
    src, lengths, prev, _ = random_batch(d)
    out = model(src, lengths, prev)[0]
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def _adam(params, weight_decay, **common):
    from omegaconf import OmegaConf

    import fairseq.optim

    cfg = OmegaConf.create({"_name": "adam", "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-8,
                            "weight_decay": weight_decay, "lr": [1e-3], "use_old_adam": False,
                            "fp16_adam_stats": False, "tpu": False})
    return fairseq.optim.build_optimizer(cfg, params)


def test_static_connection_weights_get_no_weight_decay():
    """Through fairseq's own optimizer construction (the function the trainer calls), hyper-connections'
    static weights land in a group without weight decay; every other parameter keeps --weight-decay. One
    step with zero gradients shrinks only the decayed parameters."""
    model = tiny("--residual-scheme", "hyper_connections")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = _adam(params, weight_decay=0.1)
    groups = opt.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    static = {id(p) for n, p in model.named_parameters() if n.endswith(("static_alpha", "static_beta"))}
    assert {id(p) for p in groups[1]["params"]} == static and len(static) == 2 * (2 * 2 + 2 * 3)  # 2 + 2 layers
    assert all(g["lr"] == groups[0]["lr"] for g in groups)
    opt.set_lr(2e-3)  # schedulers set every group
    assert all(g["lr"] == 2e-3 for g in groups)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        moved = not torch.equal(p, before[n])
        if n.endswith(("static_alpha", "static_beta")):
            assert not moved, n
        elif before[n].abs().sum() > 0:
            assert moved, n
    # another scheme's optimizer is one group, as fairseq builds it
    assert len(_adam(list(tiny("--residual-scheme", "pre_ln").parameters()), 0.1).optimizer.param_groups) == 1


def test_the_analysis_tool_reports_stream_similarity_and_mixing_distance():
    """At initialisation hyper-connections' streams are identical (cosine 1) and their mixing the identity
    (distance 0). With random static connections the tool's distance equals ||prod_k A_r(k)^T - I|| / sqrt(n)
    over each layer's sub-layers, from the parameters, and its stream cosine the mean pairwise cosine of the
    streams each layer returns."""
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    from fairseq_residual.analyze import analyze_model

    d = make_dictionary()
    n = 3
    model, args, task = build_model("residual_transformer_tiny", "--residual-scheme", "hyper_connections",
                                    "--hc-streams", n, "--hc-static", "--dropout", 0, *DEPTH, dictionary=d)
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    src, lengths, prev, tgt = random_batch(d, bsz=5)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
              "target": tgt, "ntokens": int(tgt.ne(d.pad()).sum()), "nsentences": 5}
    got = analyze_model(model, crit, [sample])
    for s, layers in (("encoder", 3), ("decoder", 2)):
        assert got["stream_cosine"][s] == pytest.approx([1.0] * layers, abs=1e-6)
        assert got["mixing_distance"][s] == pytest.approx([0.0] * layers, abs=1e-7)

    randomise_scheme_parameters(model)
    outputs = {}
    for s, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        for l, layer in enumerate(stack.layers):
            layer.register_forward_hook(lambda m, i, o, key=(s, l): outputs.__setitem__(
                key, (o[0] if isinstance(o, tuple) else o)[0].detach()))
    got = analyze_model(model, crit, [sample])
    masks = {"encoder": src.ne(d.pad()).t(), "decoder": prev.ne(d.pad()).t()}
    for s, stack, kinds in (("encoder", model.encoder, ("self_attn", "ffn")),
                            ("decoder", model.decoder, ("self_attn", "encoder_attn", "ffn"))):
        for l, layer in enumerate(stack.layers):
            m = torch.eye(n, dtype=torch.float64)
            for kind in kinds:
                m = getattr(layer, f"{kind}_residual").static_alpha[:, 1:].t().double().detach() @ m
            want = float((m - torch.eye(n, dtype=torch.float64)).norm() / math.sqrt(n))
            assert got["mixing_distance"][s][l] == pytest.approx(want, rel=1e-6)
            h = outputs[(s, l)]  # n x T x B x C
            pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
            cos = sum(torch.nn.functional.cosine_similarity(h[i], h[j], dim=-1) for i, j in pairs) / len(pairs)
            assert got["stream_cosine"][s][l] == pytest.approx(float(cos[masks[s]].double().mean()), rel=1e-5)


@pytest.mark.parametrize("scheme", ["hyper_connections", "mhc"])
def test_training_parts_the_streams(scheme):
    """The n streams start as copies of one another; training must make them differ, or the scheme is Pre-LN
    at n times the cost. With every stream read alike (mHC's H_pre all 1/2 before its one-hot b_pre), each
    stream's gradient and update is the same: after 4 fp32 updates without dropout the encoder's streams
    differed by 4.9e-7 of their largest magnitude (rounding only). Measured with the one-hot: mHC 1.3e-4 (its
    gates start at 0.01), hyper-connections 2.4e-2; the bound 1e-5 lies between."""
    from trainers import samples, trainer

    tr, d = trainer(scheme, "--dropout", "0.0", "--encoder-layers", 2, "--decoder-layers", 1)
    for batch in samples(d, 4):
        tr.train_step([batch])
    model = tr.get_model().eval()
    seen = []
    stack = model.encoder.residual

    def final_input(state, _f=stack.final_input):
        seen.append(state[0].detach())
        return _f(state)

    stack.final_input = final_input
    net_input = samples(d, 1, seed=5)[0]["net_input"]
    with torch.no_grad():
        model.encoder(net_input["src_tokens"], net_input["src_lengths"])
    streams = seen[0]  # n x T x B x C
    spread = float((streams - streams[:1]).abs().max() / streams.abs().max())
    assert spread > 1e-5, f"{scheme}: the streams are still copies of one another after training ({spread:.3g})"


def test_stream_ops_backward_is_autograd_of_the_textbook_formula():
    """The closed-form backward of the normalise-then-project products and of the streams' update
    (``fairseq_residual/stream_ops.py``) gives autograd's gradient of the textbook formula (normalise, then
    project; ``c + k o``), in float64 within 1e-12, and passes gradcheck."""
    import torch.nn.functional as F

    from fairseq_residual.stream_ops import layer_norm_projection, rms_projection, stream_update

    gen = torch.Generator().manual_seed(0)
    for shift in (0.0, 3.0):  # rows with a mean away from 0 go through the centring's cancellation
        h = (torch.randn(40, 16, dtype=torch.float64, generator=gen) + shift).requires_grad_()
        w = torch.randn(16, 6, dtype=torch.float64, generator=gen).requires_grad_()
        g = torch.randn(40, 6, dtype=torch.float64, generator=gen)
        for got, want in ((layer_norm_projection(h, w, 1e-5), F.layer_norm(h, (16,)) @ w),
                          (rms_projection(h, w, 1e-20), (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-20) @ w).t())):
            assert (got - want).abs().max().item() <= 1e-12
            grads = torch.autograd.grad(got, (h, w), g if got.shape == g.shape else g.t())
            wants = torch.autograd.grad(want, (h, w), g if got.shape == g.shape else g.t())
            assert max((a - b).abs().max().item() for a, b in zip(grads, wants)) <= 1e-12
        assert torch.autograd.gradcheck(lambda h, w: layer_norm_projection(h, w, 1e-5), (h[:8], w))
        assert torch.autograd.gradcheck(lambda h, w: rms_projection(h, w, 1e-20), (h[:8], w))
    carried = torch.randn(5, 2, 3, 8, dtype=torch.float64, generator=gen).requires_grad_()  # T x B x n x C
    k = torch.randn(3, 5, 2, dtype=torch.float64, generator=gen).requires_grad_()
    o = torch.randn(5, 2, 8, dtype=torch.float64, generator=gen).requires_grad_()
    got = stream_update(carried.permute(2, 0, 1, 3), k, o)
    assert got.permute(1, 2, 0, 3).is_contiguous()  # positions-first
    assert (got - (carried.permute(2, 0, 1, 3) + k.unsqueeze(-1) * o)).abs().max().item() <= 1e-12
    assert torch.autograd.gradcheck(lambda c, k, o: stream_update(c.permute(2, 0, 1, 3), k, o), (carried, k, o))


COMPILE_FLAGS = {"hyper_connections": "--hc-compile", "mhc": "--mhc-compile"}


@pytest.mark.parametrize("scheme", sorted(COMPILE_FLAGS))
def test_compile_option_leaves_evaluation_torchscript_and_decoding_plain(scheme, monkeypatch):
    """``--hc-compile`` / ``--mhc-compile`` compile only eager training: evaluation, incremental decoding and
    TorchScript run the plain code (torch.compile is never called)."""
    from fairseq.sequence_generator import SequenceGenerator

    def refuse(*args, **kwargs):
        raise AssertionError("torch.compile called outside eager training")

    d = make_dictionary()
    model = tiny("--residual-scheme", scheme, COMPILE_FLAGS[scheme], d=d).eval()
    assert all(m.compile_training for m in model.modules() if hasattr(m, "compile_training"))
    monkeypatch.setattr(torch, "compile", refuse)
    src, lengths, prev, _ = random_batch(d, bsz=3)
    with torch.no_grad():
        eager = model(src, lengths, prev)[0]
        scripted = torch.jit.script(model)
        assert (scripted(src, lengths, prev)[0] - eager).abs().max().item() <= 1e-5
        SequenceGenerator([model], d, beam_size=2, max_len_b=5).generate([model], {"net_input": {
            "src_tokens": src, "src_lengths": lengths}})


@pytest.mark.parametrize("scheme", sorted(COMPILE_FLAGS))
def test_compile_option_is_refused_where_torch_compile_cannot_run(scheme, monkeypatch):
    """Where torch.compile cannot run, the first training step refuses the option, naming it and why; the model
    still builds, evaluates and decodes (a checkpoint trained with it loads anywhere)."""
    from fairseq_residual import stream_ops
    from fairseq_residual.user_errors import UnavailableHereError

    monkeypatch.setattr(stream_ops, "_COMPILED", {})
    monkeypatch.setattr(stream_ops, "compile_unavailable", lambda: "no C++ compiler (test)")
    d = make_dictionary()
    model = tiny("--residual-scheme", scheme, COMPILE_FLAGS[scheme], d=d)
    src, lengths, prev, _ = random_batch(d, bsz=3)
    with torch.no_grad():
        model.eval()(src, lengths, prev)
    with pytest.raises(UnavailableHereError, match=f"{COMPILE_FLAGS[scheme]} cannot be honoured here: no C\\+\\+ "
                                                   "compiler"):
        model.train()(src, lengths, prev)


@pytest.mark.slow  # torch.compile: about 2-3 minutes of compiling per scheme on a loaded 2-core CPU
@pytest.mark.parametrize("scheme", sorted(COMPILE_FLAGS))
def test_compiled_connections_match_eager_in_fp32(scheme):
    """The compiled connections compute the eager function: in fp32 on the whole model in training mode (no
    dropout), log-probabilities and every parameter's gradient agree within a tolerance derived from fp32
    rounding. Both fp32 computations differ from the exact function by their rounding only; with the eager
    one's rounding error measured against the float64 model, ``e = max |eager_fp32 - float64|``, and the
    compiled kernels' reordered sums allowed at most twice that error, the triangle inequality bounds
    ``|compiled - eager| <= e + 2 e``: the test asserts ``<= 3 e`` (per output: log-probabilities, and every
    gradient against the largest eager gradient error)."""
    import copy

    d = make_dictionary()
    model = tiny("--residual-scheme", scheme, COMPILE_FLAGS[scheme], "--dropout", 0, *DEPTH, d=d)
    randomise_scheme_parameters(model)
    exact = copy.deepcopy(model).double()
    src, lengths, prev, _ = random_batch(d, bsz=5)
    keep = prev.ne(d.pad())

    def run(m, compile_on):
        for module in m.modules():
            if hasattr(module, "compile_training"):
                module.compile_training = compile_on
        m.train()
        m.zero_grad(set_to_none=True)
        lp = torch.log_softmax(m(src, lengths, prev)[0], dim=-1)
        lp[keep].sum().div(keep.sum()).backward()
        return lp.detach()[keep].double(), {n: p.grad.double() for n, p in m.named_parameters() if p.grad is not None}

    (lp_c, g_c), (lp_e, g_e), (lp_x, g_x) = run(model, True), run(model, False), run(exact, False)
    assert g_c.keys() == g_e.keys() == g_x.keys()
    out_err = (lp_e - lp_x).abs().max().item()
    grad_err = max((g_e[n] - g_x[n]).abs().max().item() for n in g_e)
    assert 0 < out_err < 1e-4 and 0 < grad_err < 1e-3  # fp32 rounding, not a float64 run
    assert (lp_c - lp_e).abs().max().item() <= 3 * out_err
    assert max((g_c[n] - g_e[n]).abs().max().item() for n in g_e) <= 3 * grad_err


@pytest.mark.parametrize("scheme", ["hyper_connections", "mhc"])
def test_streams_stay_positions_first_from_the_stack_start(scheme):
    """After a connection on the stack's start (n expanded copies) and after one on updated streams, the streams
    are laid out positions-first (T x B x n x C in memory), so that the next connection reads them without a
    copy."""
    model = tiny("--residual-scheme", scheme).train()
    residual = model.encoder.layers[0].self_attn_residual
    state = model.encoder.residual.start(torch.randn(5, 3, 64))
    for _ in range(2):
        ctx = {}
        branch, state = residual.prepare(state, ctx)
        state = residual.update(state, torch.randn_like(branch), ctx)
        assert state[0].permute(1, 2, 0, 3).is_contiguous()

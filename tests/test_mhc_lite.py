"""mHC-lite beyond the conformance suite: H_res is a convex combination of the n! permutation matrices (doubly
stochastic to rounding, the orientation P_k[j, s_k(j)] = 1 against an independent enumeration), the exactness
with the permutation weights spread over every permutation (the suite's randomised model keeps them near the
identity), the start as Pre-LN, the eval path equal to the training path, and n > 5 refused naming its cost."""
import itertools
import math

import pytest
import torch

from conftest import build_model, load_shared_weights, make_dictionary, max_log_prob_difference, random_batch
from references import MHCLite, reference_forward
from test_conformance import randomise_scheme_parameters

DEPTH = ["--encoder-layers", 2, "--decoder-layers", 2]


def tiny(*flags, d=None, seed=1):
    torch.manual_seed(seed)
    model, args, task = build_model("residual_transformer_tiny", "--residual-scheme", "mhc_lite", *flags,
                                    dictionary=d or make_dictionary())
    return model


def spread(model):
    """Randomised scheme parameters with ``b_res`` 0: the permutation weights spread over every permutation."""
    randomise_scheme_parameters(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("b_res"):
                p.zero_()


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_h_res_is_the_softmax_mix_of_the_permutations_and_doubly_stochastic(n):
    from fairseq_residual.schemes.mhc_lite import permutation_basis

    basis = permutation_basis(n)
    assert basis.shape == (n * n, math.factorial(n)) and torch.equal(basis[:, 0], torch.eye(n).flatten())
    d = make_dictionary()
    model = tiny("--mhc-lite-streams", n, "--encoder-layers", 1, "--decoder-layers", 1, d=d)
    spread(model)
    res = model.encoder.layers[0].ffn_residual
    torch.manual_seed(0)
    streams = torch.randn(n, 5, 3, model.encoder.embed_tokens.embedding_dim)
    with torch.no_grad():
        h_res = res.coefficients(streams)[2]  # T x B x n x n
        flat = streams.permute(1, 2, 0, 3).reshape(5, 3, -1)
        x = flat / flat.pow(2).mean(dim=-1, keepdim=True).add(1e-20).sqrt()
        w = torch.softmax(res.alpha_res * (x @ res.phi_res) + res.b_res, dim=-1)
    want = torch.zeros(5, 3, n, n)
    for k, s in enumerate(itertools.permutations(range(n))):
        for j in range(n):
            want[..., j, s[j]] += w[..., k]
    assert (h_res - want).abs().max().item() <= 1e-6
    assert (h_res.sum(dim=-1) - 1).abs().max().item() <= 1e-6 and (h_res.sum(dim=-2) - 1).abs().max().item() <= 1e-6
    if n > 2:  # the transposed orientation (inverse permutations) is another matrix
        assert (h_res - want.transpose(-1, -2)).abs().max().item() > 1e-2
    # at initialisation: 0 on the identity, -8 elsewhere
    fresh = tiny("--mhc-lite-streams", n, "--encoder-layers", 1, "--decoder-layers", 1, d=d)
    with torch.no_grad():
        start = fresh.encoder.layers[0].ffn_residual.coefficients(streams)[2]
    off = (math.factorial(n - 1) * math.exp(-8)) / (1 + (math.factorial(n) - 1) * math.exp(-8))
    assert torch.allclose(start, torch.full((n, n), off).fill_diagonal_(1 - (n - 1) * off).expand_as(start), atol=1e-5)


@pytest.mark.parametrize("n", [2, 4])
def test_matches_the_transcription_with_the_weights_spread_over_every_permutation(n):
    d = make_dictionary()
    model = tiny("--mhc-lite-streams", n, *DEPTH, d=d)
    spread(model)
    src, lengths, prev, _ = random_batch(d, bsz=4)
    keep = prev.ne(d.pad())
    with torch.no_grad():
        _, lp_ref = reference_forward(model, src, prev, MHCLite(n))
        _, lp_ctl = reference_forward(model, src, prev, MHCLite(n, identity_only=True))
        model.eval()
        lp_eval = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout) or hasattr(m, "apply_during_inference"):
            m.p = 0.0
    lp_train = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)  # with gradients
    lp_train.sum().backward()
    assert (lp_eval - lp_ref)[keep].abs().max().item() <= 1e-5
    assert (lp_train.detach() - lp_ref)[keep].abs().max().item() <= 1e-5
    assert (lp_eval - lp_ctl)[keep].abs().max().item() > 1e-3
    res = model.decoder.layers[1].ffn_residual
    for p in (res.phi_res, res.b_res, res.alpha_res):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().max() > 0


def test_starts_as_pre_ln():
    """With the weights of a Pre-LN model of the same seed, the log-probabilities agree (as mHC's: the branch
    reads LN(a x) = LN(x), the final LayerNorm n times the stream; H_res leaves n copies of a stream unchanged)."""
    d = make_dictionary()
    ours = tiny(*DEPTH, d=d)
    torch.manual_seed(1)
    pre, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "pre_ln", *DEPTH, dictionary=d)
    load_shared_weights(ours, pre)
    assert max_log_prob_difference(ours, pre, d) <= 2e-2


def test_more_than_five_streams_is_refused_naming_the_cost():
    with pytest.raises(ValueError, match=r"--mhc-lite-streams.*at most 5.*n! permutation weights.*720"):
        tiny("--mhc-lite-streams", 6)

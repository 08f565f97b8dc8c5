"""Attention Residuals: Full and Block variants against the transcription of the official pseudo-code
(tests/references.py) with negative controls, the sources the state keeps, the zero-query initialisation (a
uniform average), incremental decoding of the Block variant, and the refusals of the options (the registry-wide
suite, tests/test_conformance.py, runs Block N = 2 against the transcription and the default Full variant
everywhere else)."""
import pytest
import torch

from conftest import build_model, make_dictionary, random_batch
from references import AttnRes as Reference
from references import assert_matches_transcription

DEPTH = ["--encoder-layers", 4, "--decoder-layers", 3]


def build(*flags, seed=None, d=None):
    if seed is not None:
        torch.manual_seed(seed)
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "attn_res", *flags,
                              dictionary=d or make_dictionary())
    return model


def randomise(model, seed=1):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "residual" in name:
                p.add_(0.3 * torch.randn_like(p))


@pytest.mark.parametrize("blocks", [0, 3])
def test_matches_the_transcription_and_the_controls_differ(blocks):
    """Full (0) and Block with N = 3 over 4 encoder layers (blocks of 2, 1, 1) and 3 decoder layers (1 each);
    controls: raw keys (no RMSNorm), and a partial sum that is never restarted (Block only)."""
    d = make_dictionary()
    model = build(*DEPTH, "--attn-res-blocks", blocks, d=d)
    randomise(model)
    model.eval()
    controls = [Reference(blocks, rms_keys=False)] + ([Reference(blocks, restart=False)] if blocks else [])
    assert_matches_transcription(model, d, Reference(blocks), controls)


def test_full_and_block_differ_and_block_counts_layers():
    from fairseq_residual.schemes.attn_res import block_of, starts_block

    assert [block_of(j, 6, 3) for j in range(6)] == [0, 0, 1, 1, 2, 2]  # S = L / N
    assert [block_of(j, 4, 3) for j in range(4)] == [0, 0, 1, 2]  # sizes differ by one where N does not divide L
    assert [starts_block(j, 6, 2) for j in range(6)] == [True, False, False, True, False, False]
    model = build(*DEPTH, "--attn-res-blocks", 2)
    starts = [[getattr(getattr(layer, f"{k}_residual"), "starts", "first") for k in ("self_attn", "encoder_attn",
                                                                                       "ffn")]
              for layer in model.decoder.layers]
    assert starts == [["first", False, False], [False, False, False], [True, False, False]]  # blocks {0, 1}, {2}
    full = build(*DEPTH)
    assert all(getattr(layer, f"{k}_residual").starts for i, layer in enumerate(full.decoder.layers)
               for k in ("self_attn", "encoder_attn", "ffn") if i or k != "self_attn")


@pytest.mark.parametrize("blocks, sources", [(0, 1 + 2 * 4), (2, 3), (3, 4)])
def test_the_state_keeps_one_tensor_per_source(blocks, sources):
    """Encoder of 4 layers: Full keeps v_0 and 8 outputs; Block keeps b_0 = v_0, the completed blocks and the
    partial sum (N + 1)."""
    d = make_dictionary()
    model = build(*DEPTH, "--attn-res-blocks", blocks, d=d)
    model.eval()
    x = torch.randn(5, 2, model.encoder.embed_tokens.embedding_dim)
    state = model.encoder.residual.start(x)
    with torch.no_grad():
        for layer in model.encoder.layers:
            state, _ = layer(state, None)
    assert len(state) == sources and state[1] is x


def test_a_new_model_averages_uniformly():
    """w = 0, g = 1: every sub-layer reads the plain mean of its sources; the parameters are where the docstring
    says."""
    from fairseq_residual.schemes.attn_res import aggregate

    model = build("--encoder-layers", 2, "--decoder-layers", 2)
    names = {n for n, _ in model.named_parameters() if "residual" in n}
    assert "encoder.residual.query" in names and "decoder.layers.1.encoder_attn_residual.key_gain" in names
    # query and gain per stack and per sub-layer but the first of each stack (its one source is v_0)
    assert len(names) == 2 * (2 + (2 * 2 - 1) + (2 * 3 - 1))
    assert not any(n.startswith(("encoder.layers.0.self_attn_residual", "decoder.layers.0.self_attn_residual"))
                   for n in names)
    for n, p in model.named_parameters():
        if n.endswith("residual.query"):
            assert torch.equal(p, torch.zeros_like(p))
        if n.endswith("residual.key_gain"):
            assert torch.equal(p, torch.ones_like(p))
    sources = [torch.randn(3, 2, 8) * s for s in (1.0, 10.0, 0.1)]
    torch.testing.assert_close(aggregate(sources, torch.zeros(8), torch.ones(8), 1e-6), sum(sources) / 3)
    # a query along one source's direction picks it out (keys RMS-normalised: the scale does not matter)
    w = 50 * sources[2][0, 0] / sources[2][0, 0].norm()
    out = aggregate(sources, w, torch.ones(8), 1e-6)
    torch.testing.assert_close(out[0, 0], sources[2][0, 0], atol=1e-3, rtol=0)


def test_block_incremental_decoding_equals_the_full_forward():
    d = make_dictionary()
    model = build(*DEPTH, "--attn-res-blocks", 2, d=d)
    randomise(model)
    model.eval()
    src, lengths, _, _ = random_batch(d, bsz=3, src_len=6)
    _, _, prev, _ = random_batch(d, bsz=3, tgt_len=5, seed=3, pad_rows=False)
    with torch.no_grad():
        full = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
        enc_out, state = model.encoder(src, src_lengths=lengths), {}
        for t in range(prev.size(1)):
            out = model.decoder(prev[:, : t + 1], encoder_out=enc_out, incremental_state=state)
            step = model.get_normalized_probs(out, log_probs=True)[:, -1]
            assert (step - full[:, t]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("flags, message", [
    (["--attn-res-blocks", 3, "--encoder-layers", 4, "--decoder-layers", 2],
     r"--attn-res-blocks 3 is larger than --decoder-layers 2: a block needs at least one layer; use "
     r"--attn-res-blocks 2 or less, or 0 for Full AttnRes"),
    (["--attn-res-blocks=-1"], r"--attn-res-blocks \(model.attn_res_blocks\) must be an integer in \[0, 64\]"),
    (["--encoder-layerdrop", 0.1], r"--encoder-layerdrop is not supported with --residual-scheme attn_res: a "
                                   r"dropped layer would remove sources .*; drop --encoder-layerdrop"),
    (["--decoder-layers-to-keep", "0"], r"--decoder-layers-to-keep is not supported with --residual-scheme "
                                        r"attn_res"),
])
def test_refusals_name_the_problem_and_the_fix(flags, message):
    with pytest.raises(ValueError, match=message):
        build(*flags)


def test_the_option_belongs_to_attn_res():
    with pytest.raises(ValueError, match=r"--attn-res-blocks"):
        build_model("residual_transformer_tiny", "--residual-scheme", "pre_ln", "--attn-res-blocks", 2)

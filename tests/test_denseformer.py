"""DenseFormer: the DWA weights' layout and identity initialisation (a new model is Pre-LN), the dilation and
period options against the transcription of epfml/DenseFormer (tests/references.py) with negative controls,
incremental decoding with them, and the refusals of the options (the default 1 x 1 model runs the
registry-wide suite: tests/test_conformance.py)."""
import pytest
import torch

from conftest import build_model, make_dictionary, random_batch
from references import DenseFormer as Reference
from references import assert_matches_transcription

DEPTH = ["--encoder-layers", 4, "--decoder-layers", 3]
#: (dilation k, period p) beyond the default 1 x 1
SHAPES = [(2, 1), (1, 2), (2, 2), (3, 1)]


def build(*flags, seed=None, d=None):
    if seed is not None:
        torch.manual_seed(seed)
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "denseformer", *flags,
                              dictionary=d or make_dictionary())
    return model


def kxp(k, p):
    return ["--denseformer-dilation", k, "--denseformer-period", p]


def randomise(model, seed=1):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "residual" in name:
                p.add_(0.3 * torch.randn_like(p))


def test_alpha_layout_and_identity_initialisation():
    from fairseq_residual.schemes.denseformer import dwa_layout

    model = build("--encoder-layers", 6, "--decoder-layers", 6)
    alpha = model.encoder.residual.alpha
    assert alpha.numel() == 6 * 9 // 2 and alpha.requires_grad  # L(L+3)/2
    assert torch.equal(model.encoder.residual.weights(), torch.eye(7))
    assert {n for n, _ in model.named_parameters() if ".residual." in n} == {"encoder.residual.alpha",
                                                                            "decoder.residual.alpha"}
    # k = 2, p = 2 at L = 6: averages after layers 2, 4, 6 over j = 0, 2, .., i
    assert dwa_layout(6, 2, 2) == [-1, 0, -1, 2, -1, 5]
    w = build(*kxp(2, 2), "--encoder-layers", 6, "--decoder-layers", 6).encoder.residual
    assert w.alpha.numel() == 2 + 3 + 4 and torch.equal(w.weights(), torch.eye(7))
    w.alpha.data.copy_(torch.arange(1.0, 10.0))
    expected = torch.eye(7)
    expected[2] = torch.tensor([1.0, 0, 2, 0, 0, 0, 0])
    expected[4] = torch.tensor([3.0, 0, 4, 0, 5, 0, 0])
    expected[6] = torch.tensor([6.0, 0, 7, 0, 8, 0, 9])
    assert torch.equal(w.weights(), expected)


@pytest.mark.parametrize("k, p", [(1, 1), (2, 2)])
def test_a_new_model_is_the_pre_ln_model(k, p):
    """alpha_ii = 1, the others 0: the same seed builds the same weights as pre_ln (fairseq's own layers), which
    compute the same log-probabilities."""
    d = make_dictionary()
    ours = build(*DEPTH, *kxp(k, p), seed=3, d=d)
    torch.manual_seed(3)
    pre_ln, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "pre_ln", *DEPTH, dictionary=d)
    shared = {n: v for n, v in pre_ln.state_dict().items() if not n.endswith("residual_scheme_id")}
    assert all(torch.equal(ours.state_dict()[n], v) for n, v in shared.items())
    src, lengths, prev, _ = random_batch(d, bsz=4)
    ours.eval(), pre_ln.eval()
    with torch.no_grad():
        a = ours.get_normalized_probs(ours(src, lengths, prev), log_probs=True)
        b = pre_ln.get_normalized_probs(pre_ln(src, lengths, prev), log_probs=True)
    keep = prev.ne(d.pad())
    assert (a - b)[keep].abs().max().item() <= 1e-5


class IgnoresResidueClass(Reference):
    """Negative control: each average reads the latest (i + k) // k outputs, whatever their residue mod k."""

    def start(self, stack, x):
        return {"x": x, "all": [x]}

    def between(self, stack, l, state):
        i, x = l + 1, state["x"]
        outputs = state["all"] + [x]
        if i % self.p == 0:
            w = self._weights(stack)[i]
            x = torch.tensordot(w, torch.stack(outputs[-len(w):]), dims=1)
        return {"x": x, "all": outputs}


@pytest.mark.parametrize("k, p", SHAPES)
def test_dilation_and_period_match_the_transcription(k, p):
    d = make_dictionary()
    model = build(*DEPTH, *kxp(k, p), d=d)
    randomise(model)
    model.eval()
    controls = [Reference(k, p, store_averages=True)] + ([IgnoresResidueClass(k, p)] if k > 1 else [])
    assert_matches_transcription(model, d, Reference(k, p), controls)


@pytest.mark.parametrize("k, p", [(2, 1), (2, 2)])
def test_incremental_decoding_equals_the_full_forward_and_caches_nothing_more(k, p):
    """Each decoding step equals the full forward, also after a beam reorder, and the incremental state holds
    exactly the keys a Pre-LN decoder's holds (fairseq's attention caches): no per-token cache of layer outputs."""
    d = make_dictionary()
    model = build("--encoder-layers", 3, "--decoder-layers", 4, *kxp(k, p), d=d)
    randomise(model)
    model.eval()
    src, lengths, _, _ = random_batch(d, bsz=2, src_len=6)
    rows = torch.tensor([0, 0, 1, 1])  # two sentences x two beams, as fairseq's SequenceGenerator lays them out
    src, lengths = src[rows], lengths[rows]
    _, _, prev, _ = random_batch(d, bsz=4, tgt_len=6, seed=3, pad_rows=False)
    with torch.no_grad():
        full = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
        enc = model.encoder(src, src_lengths=lengths)
        state = {}
        for t in range(3):
            out = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
            lp = model.get_normalized_probs(out, log_probs=True)[:, -1]
            assert (lp - full[:, t]).abs().max().item() <= 1e-5, t
        order = torch.tensor([1, 1, 3, 2])  # beams of the same sentence
        enc = model.encoder.reorder_encoder_out(enc, order)
        model.decoder.reorder_incremental_state_scripting(state, order)
        full_r = model.get_normalized_probs(model(src[order], lengths[order], prev[order]), log_probs=True)
        for t in range(3, prev.size(1)):
            out = model.decoder(prev[order][:, : t + 1], encoder_out=enc, incremental_state=state)
            lp = model.get_normalized_probs(out, log_probs=True)[:, -1]
            assert (lp - full_r[:, t]).abs().max().item() <= 1e-5, t
        assert (full_r[0, 3:] - full[0, 3:]).abs().max().item() > 1e-4  # an ignored reorder would show
    torch.manual_seed(0)
    pre_ln, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "pre_ln", "--encoder-layers", 3,
                               "--decoder-layers", 4, dictionary=d)
    pre_ln.eval()
    pre_state = {}
    with torch.no_grad():
        pre_ln.decoder(prev[:, :1], encoder_out=pre_ln.encoder(src, src_lengths=lengths), incremental_state=pre_state)
    strip = lambda key: key.split(".", 1)[1]  # noqa: E731  (keys start with the module's unique id)
    assert sorted(map(strip, state)) == sorted(map(strip, pre_state))


def test_every_weight_is_read_and_trained():
    d = make_dictionary()
    model = build(*DEPTH, *kxp(2, 2), d=d)
    src, lengths, prev, tgt = random_batch(d, bsz=3)
    model.train()
    lp = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    lp.gather(-1, tgt.unsqueeze(-1)).sum().backward()
    for stack in (model.encoder, model.decoder):
        assert stack.residual.alpha.grad is not None and bool((stack.residual.alpha.grad != 0).all())


@pytest.mark.parametrize("flag, value, stack, depth", [("--denseformer-period", 4, "decoder", 3),
                                                       ("--denseformer-dilation", 5, "encoder", 4)])
def test_a_dilation_or_period_beyond_a_stacks_depth_is_refused(flag, value, stack, depth):
    with pytest.raises(ValueError, match=rf"^{flag} {value} is larger than --{stack}-layers {depth}: .*; use {flag} "
                                         rf"{depth} or less$"):
        build(*DEPTH, flag, value)
    build(*DEPTH, flag, 3)  # at most the shallower stack's depth: accepted


def test_torchscript_with_dilation_and_period():
    d = make_dictionary()
    model = build(*DEPTH, *kxp(2, 2), d=d)
    randomise(model)
    model.eval()
    src, lengths, prev, _ = random_batch(d, bsz=3)
    scripted = torch.jit.script(model)
    with torch.no_grad():
        torch.testing.assert_close(scripted(src, lengths, prev)[0], model(src, lengths, prev)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_average_keeps_the_outputs_not_copies_for_the_backward_pass(dtype):
    """In fp32 and bf16 the tensors autograd saves for the averages' backward pass are the layer outputs
    themselves (and alpha's entries), no fp32 copy of them: an average of i + 1 outputs in reduced precision would
    otherwise hold i + 1 more activations until the backward pass."""
    from fairseq_residual.schemes.denseformer import DenseFormerStack

    stack = DenseFormerStack("decoder", 3, 8).to(dtype)
    with torch.no_grad():
        stack.alpha.add_(0.3 * torch.randn_like(stack.alpha))
    outputs = [torch.randn(5, 2, 8, dtype=dtype, requires_grad=True) for _ in range(4)]
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        state = stack.start(outputs[0])
        for index in range(3):
            state = stack.between(index, [outputs[index + 1]] + state[1:])
    large = [t for t in saved if t.numel() > 1]
    assert large and all(any(t.data_ptr() == x.data_ptr() and t.dtype == dtype for x in outputs) for t in large)
    state[0].float().sum().backward()
    assert all(x.grad is not None for x in outputs) and stack.alpha.grad is not None
    expected = sum(stack.weights()[3, j].float() * outputs[j].float() for j in range(4)).to(dtype)
    torch.testing.assert_close(state[0], expected)  # the dtype's tolerance

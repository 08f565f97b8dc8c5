"""``--norm layernorm|rmsnorm|dyt|derf`` (fairseq_residual/norms.py): pairwise, not the full cross product.

* each norm module against its formula, DyT and Derf against independent transcriptions of their reference
  code (facebookresearch/DyT ``DynamicTanh``, lucidrains/x-transformers ``Derf``), with a negative control;
* every norm with pre_ln, post_ln, resi_dual and hyper_connections against the scheme's transcription in
  ``tests/references.py`` with the transcription's LayerNorm replaced by the norm's formula (negative control:
  the LayerNorm the option replaced);
* every scheme of the registry with rmsnorm: every LayerNorm module replaced, or refused with the scheme's
  reason; every scheme and norm: built exactly where the scheme does not refuse it;
* ``layernorm`` is the model as it was (no buffer, the same parameters and outputs);
* incremental decoding equals the full forward for dyt; checkpoints record the norm; the options;
* no product module computes a layer norm functionally except those a scheme declares (``formula_norms``).
"""
import glob
import math
import os
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import references
from conftest import build_model, make_dictionary, random_batch
from fairseq_residual.norms import (NORM_OPTIONS, NORMS, DynamicErf, DynamicTanh, NormMismatchError, RMSNorm,
                                    is_layer_norm)
from fairseq_residual.schemes import SCHEME_NAMES, SCHEMES, get_scheme
from fairseq_residual.schemes.base import OptionError

TOL = 1e-5
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPTH = ["--encoder-layers", 3, "--decoder-layers", 2]


def tiny(scheme, *flags, d=None, seed=0):
    torch.manual_seed(seed)
    return build_model("residual_transformer_tiny", "--residual-scheme", scheme, *flags,
                       dictionary=d or make_dictionary())[0]


# ---------------------------------------------------------------------------------------------
# independent transcriptions of the norms


def dyt_reference(m, x):
    """facebookresearch/DyT ``dynamic_tanh.py``, ``DynamicTanh.forward`` with ``channels_last``."""
    x = torch.tanh(m.alpha * x)
    return x * m.weight + m.bias


def derf_reference(m, x):
    """lucidrains/x-transformers ``Derf.forward`` (``unit_offset=False``: offset 0); its ``s``, ``gamma``,
    ``beta`` are ``shift``, ``weight``, ``bias`` here."""
    scale_offset = 0.0
    x = x * (m.alpha + scale_offset) + m.shift
    activated = torch.erf(x)
    return activated * (m.weight + scale_offset) + m.bias


def rms_reference(m, x, eps):
    """RMSNorm, arXiv 1910.07467 eq. 4: x / sqrt(mean(x^2) + eps) * g."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * m.weight


def norm_reference(m, x, eps=references.EPS):
    """The formula of whichever norm ``m`` is (the transcription's eps for LayerNorm and RMSNorm)."""
    if isinstance(m, RMSNorm) or type(m).__name__ == "_RMSNorm":
        return rms_reference(m, x, eps)
    if isinstance(m, DynamicTanh):
        return dyt_reference(m, x)
    if isinstance(m, DynamicErf):
        return derf_reference(m, x)
    return F.layer_norm(x, (x.shape[-1],), m.weight, m.bias, eps)


def _randomised(module, seed=0):
    """Non-trivial norm parameters (gamma, beta, alpha, s) and scheme parameters, as the conformance suite's
    ``randomise_scheme_parameters``; every parameter of a lone norm module."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name or "residual" in name or "." not in name:
                p.add_(0.3 * torch.randn_like(p))
    return module


@pytest.mark.parametrize("kind", ["rmsnorm", "rmsnorm_before_torch_2_4", "dyt", "derf"])
def test_each_norm_module_equals_its_formula(kind):
    from fairseq_residual.norms import _RMSNorm

    x = 3 * torch.randn(5, 2, 16)  # T x B x C
    m = {"rmsnorm": lambda: RMSNorm(16, eps=1e-5), "rmsnorm_before_torch_2_4": lambda: _RMSNorm(16, eps=1e-5),
         "dyt": lambda: DynamicTanh(16, 0.5), "derf": lambda: DynamicErf(16, 0.5, 0.0)}[kind]()
    _randomised(m)
    got = m(x)
    want = norm_reference(m, x, 1e-5)
    assert (got - want).abs().max().item() <= TOL
    # negative control: the same parameters through LayerNorm's formula
    ln = F.layer_norm(x, (16,), m.weight, getattr(m, "bias", None), 1e-5)
    assert (got - ln).abs().max().item() > 1e-2


def test_dyt_and_derf_start_as_their_references_initialise_them():
    dyt, derf = DynamicTanh(8, 0.8), DynamicErf(8, 0.5, 0.25)
    assert dyt.alpha.shape == (1,) and dyt.alpha.item() == pytest.approx(0.8)
    assert torch.equal(dyt.weight, torch.ones(8)) and torch.equal(dyt.bias, torch.zeros(8))
    assert derf.alpha.item() == 0.5 and derf.shift.item() == 0.25
    x = torch.randn(3, 8)
    torch.testing.assert_close(dyt(x), torch.tanh(0.8 * x), rtol=0, atol=1e-7)
    torch.testing.assert_close(derf(x), torch.erf(0.5 * x + 0.25), rtol=0, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# whole models against the schemes' transcriptions


def _transcriptions(scheme):
    """(flags, transcription) of ``scheme`` from tests/references.py; ResiDual at c = 1 (DyT and Derf refuse
    another c)."""
    flags, ref, _ = references.REFERENCES[scheme]
    if scheme == "resi_dual":
        flags = ["--encoder-resi-dual-alpha", references._ALPHA["encoder"], "--decoder-resi-dual-alpha",
                 references._ALPHA["decoder"]]
        ref = references.ResiDual({"encoder": 1.0, "decoder": 1.0}, references._ALPHA)
    return flags, ref


def _layer_norms(model):
    return [name for name, m in model.named_modules() if is_layer_norm(m)]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("scheme", ["pre_ln", "post_ln", "resi_dual", "hyper_connections"])
def test_every_norm_with_a_few_schemes_matches_the_transcription(scheme, norm, monkeypatch):
    d = make_dictionary()
    flags, ref = _transcriptions(scheme)
    plain = tiny(scheme, *DEPTH, *flags, d=d)
    model = tiny(scheme, *DEPTH, *flags, "--norm", norm, d=d)
    norms = [name for name, m in model.named_modules() if isinstance(m, (nn.LayerNorm, RMSNorm, DynamicTanh,
                                                                         DynamicErf))]
    assert norms == _layer_norms(plain), "every LayerNorm, and only those, replaced in place"
    assert _layer_norms(model) == ([] if norm != "layernorm" else norms)
    _randomised(model, seed=1)
    src, lengths, prev, _ = random_batch(d, bsz=5)
    keep_src, keep_tgt = src.ne(d.pad()).t(), prev.ne(d.pad())
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
        lp = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
        enc_ln, lp_ln = references.reference_forward(model, src, prev, ref) if norm == "layernorm" else (None, None)
        monkeypatch.setattr(references, "ref_ln", norm_reference)
        enc_ref, lp_ref = references.reference_forward(model, src, prev, ref)
    assert (enc - enc_ref)[keep_src].abs().max().item() <= TOL
    assert (lp - lp_ref)[keep_tgt].abs().max().item() <= TOL
    if norm == "layernorm":
        assert (lp - lp_ln)[keep_tgt].abs().max().item() <= TOL
        return
    monkeypatch.undo()  # negative control: the transcription with LayerNorm's formula, as before --norm
    ctl_norm = (lambda m, x, eps=references.EPS:
                F.layer_norm(x, (x.shape[-1],), m.weight, getattr(m, "bias", None), eps))
    monkeypatch.setattr(references, "ref_ln", ctl_norm)
    with torch.no_grad():
        _, lp_ctl = references.reference_forward(model, src, prev, ref)
    assert (lp - lp_ctl)[keep_tgt].abs().max().item() > 1e-3


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_every_scheme_honours_rmsnorm_or_refuses_it_with_a_reason(scheme):
    d = make_dictionary()
    s = get_scheme(scheme)
    reason = s.norm_refusal("rmsnorm", build_model("residual_transformer_tiny", "--residual-scheme", scheme,
                                                   dictionary=d)[1])
    if reason:
        with pytest.raises(OptionError, match=rf"--norm rmsnorm is not supported with --residual-scheme {scheme}: "
                                              rf"{re.escape(reason)}"):
            tiny(scheme, "--norm", "rmsnorm", d=d)
        return
    plain = tiny(scheme, d=d)
    model = tiny(scheme, "--norm", "rmsnorm", d=d)
    assert _layer_norms(model) == []
    rms = [name for name, m in model.named_modules() if isinstance(m, RMSNorm)]
    assert rms and rms == _layer_norms(plain)
    assert int(model.encoder.residual_norm_id) == int(model.decoder.residual_norm_id) == 1
    src, lengths, prev, _ = random_batch(d)
    with torch.no_grad():
        out = model(src, lengths, prev)[0]
        ref = plain(src, lengths, prev)[0]
    assert torch.isfinite(out).all() and (out - ref).abs().max().item() > 1e-4


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_a_scheme_builds_exactly_the_norms_it_does_not_refuse(scheme):
    d = make_dictionary()
    s = get_scheme(scheme)
    for norm in NORMS[1:]:
        expected = s.norm_refusal(norm, build_model("residual_transformer_tiny", "--residual-scheme", scheme,
                                                    dictionary=d)[1])
        if expected:
            assert len(expected) > 20, f"{scheme} refuses --norm {norm} without saying why"
            with pytest.raises(OptionError, match="--norm"):
                tiny(scheme, "--norm", norm, d=d)
        else:
            assert _layer_norms(tiny(scheme, "--norm", norm, d=d)) == []
    if not s.has_layer_norm:
        assert all(s.norm_refusal(n, None) for n in NORMS[1:])


def test_layernorm_is_the_model_as_it_was():
    d = make_dictionary()
    for scheme in ("pre_ln", "resi_dual"):
        before, given = tiny(scheme, d=d), tiny(scheme, "--norm", "layernorm", d=d)
        assert list(before.state_dict()) == list(given.state_dict())
        assert not any("residual_norm_id" in k for k in before.state_dict())
        for (k, a), b in zip(before.state_dict().items(), given.state_dict().values()):
            assert torch.equal(a, b), k
        src, lengths, prev, _ = random_batch(d)
        with torch.no_grad():
            assert torch.equal(before(src, lengths, prev)[0], given(src, lengths, prev)[0])


# ---------------------------------------------------------------------------------------------
# decoding, checkpoints, options


def test_incremental_decoding_equals_the_full_forward_with_dyt():
    d = make_dictionary()
    model = tiny("resi_dual", "--norm", "dyt", d=d)
    _randomised(model, seed=2)
    src, lengths, _, _ = random_batch(d, bsz=3, src_len=7)
    _, _, prev, _ = random_batch(d, bsz=3, tgt_len=6, seed=3, pad_rows=False)
    with torch.no_grad():
        full = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
        enc_out = model.encoder(src, src_lengths=lengths)
        state = {}
        for t in range(prev.size(1)):
            out = model.decoder(prev[:, : t + 1], encoder_out=enc_out, incremental_state=state)
            lp = model.get_normalized_probs(out, log_probs=True)[:, -1, :]
            assert (lp - full[:, t]).abs().max().item() <= TOL, f"step {t}"


def test_per_position_alphas_follow_the_dyt_llama_recipe():
    model = tiny("pre_ln", "--norm", "dyt", "--dyt-attn-alpha", 0.8, "--dyt-ffn-alpha", 0.2, "--dyt-final-alpha",
                 0.15, "--dyt-alpha", 0.3, "--layernorm-embedding")
    alphas = {name: m.alpha.item() for name, m in model.named_modules() if isinstance(m, DynamicTanh)}
    for name, alpha in alphas.items():
        last = name.split(".")[-1]
        want = (0.8 if last in ("self_attn_layer_norm", "encoder_attn_layer_norm") else 0.2 if last == "final_layer_norm"
                else 0.15 if name in ("encoder.layer_norm", "decoder.layer_norm") else 0.3)
        assert alpha == pytest.approx(want), name
    assert alphas["encoder.layernorm_embedding"] == pytest.approx(0.3)
    derf = tiny("pre_ln", "--norm", "derf", "--derf-alpha", 0.3, "--derf-shift", 0.1)
    assert {(round(m.alpha.item(), 6), round(m.shift.item(), 6)) for m in derf.modules()
            if isinstance(m, DynamicErf)} == {(0.3, 0.1)}
    rms = tiny("resi_dual", "--norm", "rmsnorm", "--resi-dual-scale", 0.5)
    assert rms.encoder.layer_norm.eps == pytest.approx(1e-7 * 0.25)  # ResiDual's c^2-scaled eps, kept
    assert rms.encoder.layers[0].final_layer_norm.eps == 1e-5
    assert tiny("pre_ln", "--norm", "rmsnorm", "--rmsnorm-eps", 1e-6).encoder.layer_norm.eps == 1e-6


def test_a_checkpoint_records_its_norm_and_another_norm_is_refused_naming_both():
    d = make_dictionary()
    dyt, args = build_model("residual_transformer_tiny", "--residual-scheme", "pre_ln", "--norm", "dyt",
                            dictionary=d)[:2]
    assert args.norm == "dyt"  # saved with the checkpoint's configuration, which fairseq rebuilds the model from
    plain, derf = tiny("pre_ln", d=d), tiny("pre_ln", "--norm", "derf", d=d)
    with pytest.raises(NormMismatchError, match="trained with --norm dyt but this model's encoder uses --norm "
                                                "layernorm: fairseq-generate, .* drop norm from --model-overrides; fairseq-train: "
                                                "resume with --norm dyt"):
        plain.load_state_dict(dyt.state_dict())
    with pytest.raises(NormMismatchError, match="trained with --norm layernorm .* uses --norm dyt"):
        dyt.load_state_dict(plain.state_dict())
    with pytest.raises(NormMismatchError, match="trained with --norm derf .* uses --norm dyt"):
        dyt.load_state_dict(derf.state_dict())
    _randomised(dyt)
    twin = tiny("pre_ln", "--norm", "dyt", d=d, seed=5)
    twin.load_state_dict(dyt.state_dict())
    src, lengths, prev, _ = random_batch(d)
    with torch.no_grad():
        assert torch.equal(twin(src, lengths, prev)[0], dyt(src, lengths, prev)[0])


def test_a_training_checkpoint_of_another_norm_is_not_resumed():
    from fairseq_residual.checkpoint_safety import _misfit

    d = make_dictionary()
    dyt, plain = tiny("pre_ln", "--norm", "dyt", d=d), tiny("pre_ln", d=d)
    assert _misfit(plain.state_dict(), dyt).kind == "norm"
    assert "--norm layernorm, this run's uses --norm dyt" in _misfit(plain.state_dict(), dyt).problem
    assert "--norm dyt, this run's uses --norm layernorm" in _misfit(dyt.state_dict(), plain).problem
    assert _misfit(dyt.state_dict(), tiny("pre_ln", "--norm", "dyt", d=d)) is None


@pytest.mark.parametrize("flags, message", [
    (["--norm", "rmsnorm", "--dyt-alpha", 0.8], r"--dyt-alpha \(model.dyt_alpha\) is an option of --norm dyt \(model.norm=dyt\), but the norm is "
     r"rmsnorm: .*fairseq-train: drop --dyt-alpha or use --norm dyt$"),  # outside the tools: both tools' fixes
    (["--norm", "dyt", "--derf-shift", 0.5], r"--derf-shift \(model.derf_shift\) is an option of --norm derf \(model.norm=derf\), but the norm is dyt"),
    (["--norm", "dyt", "--dyt-alpha", 0], r"--dyt-alpha \(model.dyt_alpha\) must be in \(0, 100\]"),
    (["--norm", "dyt", "--dyt-ffn-alpha", math.nan], r"--dyt-ffn-alpha \(model.dyt_ffn_alpha\) must be in"),
    (["--residual-scheme", "resi_dual", "--norm", "derf", "--resi-dual-scale", 0.05],
     "--norm derf is not supported with --residual-scheme resi_dual: with a dual-stream scale c below 1"),
    (["--residual-scheme", "rezero", "--norm", "dyt"], "it has no LayerNorm to replace"),
])
def test_bad_norm_options_are_refused_naming_the_problem(flags, message):
    if "--residual-scheme" not in flags:
        flags = ["--residual-scheme", "pre_ln", *flags]
    with pytest.raises(OptionError, match=message):
        build_model("residual_transformer_tiny", *flags)


def test_a_dyt_model_scripts_and_the_range_report_sees_its_norms():
    from fairseq_residual.analyze.ranges import RunningSums

    d = make_dictionary()
    model = tiny("pre_ln", "--norm", "derf", d=d)
    torch.jit.script(model)
    src, lengths, prev, _ = random_batch(d)
    with torch.no_grad(), RunningSums(model) as sums:
        model(src, lengths, prev)
    assert "encoder.layer_norm.input" in sums.peaks and "decoder.layers.0.final_layer_norm.input" in sums.peaks


def test_the_precision_tool_takes_norm():
    import sys

    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import precision_check

    assert precision_check.NORMS == NORMS
    assert precision_check._args(["--norm", "dyt", "--out", "x.json"]).norm == "dyt"
    with pytest.raises(SystemExit):
        precision_check._args(["--norm", "batchnorm", "--out", "x.json"])


#: a layer norm computed by a function call rather than a LayerNorm module
FUNCTIONAL = re.compile(r"(?:\b(?:F|torch|functional|aten)\.|(?<![\w.]))(?:native_)?(?:layer_norm|rms_norm)\(")
#: helper modules whose functional norms belong to the formula of the schemes that use them
HELPERS = {"stream_ops.py": ("hyper_connections", "mhc")}


def test_no_module_computes_a_layer_norm_functionally_unless_its_scheme_declares_it():
    """``--norm`` replaces LayerNorm modules; a scheme that computes a norm by a function call keeps it, and must
    say so (``formula_norms``, shown in the README's compatibility table)."""
    package = os.path.join(REPO, "fairseq_residual")
    by_module = {s.name: s for s in SCHEMES}
    found = []
    for path in sorted(glob.glob(os.path.join(package, "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            code = [line.split("#")[0] for line in f if not line.lstrip().startswith(("def ", "#"))]
        if any(FUNCTIONAL.search(line) and "``" not in line for line in code):
            found.append(os.path.relpath(path, package))
    assert {"stream_ops.py", os.path.join("schemes", "hyper_connections.py")} <= set(found)  # the audit sees calls
    for rel in found:
        name = os.path.splitext(os.path.basename(rel))[0]
        owners = HELPERS.get(rel) or ((name,) if rel.startswith("schemes") and name in by_module else ())
        assert owners, f"{rel} computes a layer norm functionally, outside any scheme: make it a LayerNorm module"
        for owner in owners:
            assert by_module[owner].formula_norms, f"{owner} computes a norm functionally without formula_norms"


def test_layers_wrapped_by_fsdp_are_refused_not_half_replaced():
    from fairseq_residual.norms import NormOptions, replace_layer_norms

    class FullyShardedDataParallel(nn.Module):  # the class name fairscale's FSDP wrapper has
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

    model = nn.Sequential(FullyShardedDataParallel(nn.LayerNorm(8)))
    with pytest.raises(ValueError, match="--norm dyt is not supported with --ddp-backend fully_sharded"):
        replace_layer_norms(model, NormOptions(kind="dyt"))
    assert replace_layer_norms(model, NormOptions()) == 0  # layernorm: nothing to do


def test_fairseq_train_saves_the_norm_and_a_load_with_another_norm_fails_clearly(tiny_data_bin, tmp_path):
    """fairseq-train --norm dyt (in-process, 2 updates): the checkpoint rebuilds as DyT from its own
    configuration; overriding the norm fails naming both."""
    from fairseq import checkpoint_utils

    from conftest import USER_DIR
    from inprocess import fairseq_main

    _, data_bin = tiny_data_bin
    fairseq_main("fairseq-train", data_bin, "--user-dir", USER_DIR, "--task", "translation", "--arch",
                 "residual_transformer_tiny", "--residual-scheme", "pre_ln", "--norm", "dyt", "--dyt-attn-alpha",
                 "0.8", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "120", "--required-batch-size-multiple",
                 "1", "--disable-validation", "--no-epoch-checkpoints", "--seed", "3", "--num-workers", "0",
                 "--max-update", "2", "--save-dir", tmp_path, "--cpu")
    path = str(tmp_path / "checkpoint_last.pt")
    models, cfg = checkpoint_utils.load_model_ensemble([path], task=None, arg_overrides={"data": str(data_bin)})
    assert cfg.model.norm == "dyt" and cfg.model.dyt_attn_alpha == 0.8
    assert isinstance(models[0].encoder.layers[0].self_attn_layer_norm, DynamicTanh)
    assert _layer_norms(models[0]) == []
    with pytest.raises(NormMismatchError, match="trained with --norm dyt but this model's encoder uses --norm "
                                                "layernorm"):
        checkpoint_utils.load_model_ensemble([path], arg_overrides={"data": str(data_bin), "norm": "layernorm",
                                                                    "dyt_attn_alpha": None})

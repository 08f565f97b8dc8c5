"""The conformance suite: every registered scheme, read from the registry, passes the same checks.

* exactness against its transcription in ``tests/references.py`` (one table; a scheme without an entry
  fails), with N = 3 != M = 2, padding in the batch, every LayerNorm and scheme parameter randomised, and a
  negative control that changes the scheme's defining term;
* incremental decoding equals the full forward pass, also after beam search reorders the batch, and beam
  search's scores equal the teacher-forced ones;
* state-dict round trip, and a state dict of another scheme refused naming both; a validation after an update
  through ``p.data`` (fairseq's optimizers) reads the updated parameters;
* the options: every scheme option refused outside its range (and non-finite) naming its flag, an option
  of another scheme refused the same way for every scheme; fairseq options the scheme cannot honour
  refused by name;
* activation checkpointing gives the same gradients;
* the analysis tool's numbers equal an independent computation (parameter gradients by
  ``torch.autograd.grad``, consecutive-layer cosines from fairseq's ``return_all_hiddens`` states);
* the presets and ``--help`` name the scheme.
"""
import copy
import math

import numpy as np
import pytest
import torch

from conftest import build_model, log_probs, make_dictionary, random_batch
from fairseq_residual.encoder_decoder import SchemeMismatchError
from fairseq_residual.model import ARCH_NAMES, PRESETS
from fairseq_residual.schemes import SCHEME_NAMES, SCHEMES, get_scheme
from fairseq_residual.training_checks import check_training, namespace_config
from references import CONFORMANCE_NOISE, REFERENCES, assert_matches_transcription


TOL = 1e-5
DEPTH = ["--encoder-layers", 3, "--decoder-layers", 2]


def flags_of(scheme):
    return ["--residual-scheme", scheme, *REFERENCES[scheme][0]]


def tiny(scheme, *flags, d=None, seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    model, args, task = build_model("residual_transformer_tiny", *flags_of(scheme), *flags,
                                    dictionary=d or make_dictionary())
    return model


def randomise_scheme_parameters(model, seed=1, scale=None, mark_profiled=False):
    """Non-trivial LayerNorm affine parameters and scheme parameters (omegas, layer-history weights,
    ReZero's alphas, ...), so that a misplaced LayerNorm or a lost scheme parameter shows: noise of std ``scale``,
    by default 0.3 or the scheme's ``CONFORMANCE_NOISE`` (tests/references.py); ``mark_profiled``: Admin's
    omegas marked as profiled."""
    scale = CONFORMANCE_NOISE.get(model.residual_scheme, 0.3) if scale is None else scale
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "residual" in name:
                p.add_(scale * torch.randn_like(p))
        if mark_profiled:
            for name, b in model.named_buffers():
                if name.endswith("residual.profiled"):
                    b.fill_(1)


def test_every_registered_scheme_has_a_reference_transcription():
    assert set(REFERENCES) == set(SCHEME_NAMES)


def test_every_scheme_has_a_colour_of_its_own():
    """The one palette of every plot (``schemes.colors``): a plot of all schemes tells each line apart, every two
    colours at least 0.15 apart in RGB (teal and darkcyan, 0.06, are not)."""
    import itertools
    import math

    from matplotlib.colors import to_rgb

    from fairseq_residual.schemes import colors

    palette = colors()
    assert set(palette) == set(SCHEME_NAMES)
    close = [(a, b) for a, b in itertools.combinations(sorted(palette), 2)
             if math.dist(to_rgb(palette[a]), to_rgb(palette[b])) < 0.15]
    assert not close, close


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_matches_its_reference_transcription(scheme):
    d = make_dictionary()
    model = tiny(scheme, *DEPTH, d=d)
    assert model.residual_scheme == scheme
    randomise_scheme_parameters(model)
    _, reference, control = REFERENCES[scheme]
    assert_matches_transcription(model, d, reference, [control], tol=TOL)


# ---------------------------------------------------------------------------------------------
# incremental decoding


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_incremental_equals_full_and_survives_reorder(scheme):
    d = make_dictionary()
    model = tiny(scheme, d=d)
    randomise_scheme_parameters(model)
    # two sentences x three beams, as fairseq's SequenceGenerator lays them out
    src, lengths, _, _ = random_batch(d, bsz=2, src_len=7)
    rows = torch.tensor([0, 0, 0, 1, 1, 1])
    src, lengths = src[rows], lengths[rows]
    _, _, prev, _ = random_batch(d, bsz=6, tgt_len=6, seed=3, pad_rows=False)
    with torch.no_grad():
        full = log_probs(model, src, lengths, prev)  # B x T x V
        enc_out = model.encoder(src, src_lengths=lengths)
        state, k = {}, 3
        for t in range(k):
            out = model.decoder(prev[:, : t + 1], encoder_out=enc_out, incremental_state=state)
            lp = model.get_normalized_probs(out, log_probs=True)[:, -1, :]
            assert (lp - full[:, t]).abs().max().item() <= TOL, f"step {t}"
        # beam search keeps some hypotheses of each sentence, duplicates others, drops the rest
        new_order = torch.tensor([1, 1, 0, 5, 3, 3])
        enc_out = model.encoder.reorder_encoder_out(enc_out, new_order)
        model.decoder.reorder_incremental_state_scripting(state, new_order)
        prev_r = prev[new_order]
        full_r = log_probs(model, src[new_order], lengths[new_order], prev_r)
        for t in range(k, prev.size(1)):
            out = model.decoder(prev_r[:, : t + 1], encoder_out=enc_out, incremental_state=state)
            lp = model.get_normalized_probs(out, log_probs=True)[:, -1, :]
            assert (lp - full_r[:, t]).abs().max().item() <= TOL, f"step {t} after reorder"
        assert (full_r[0, k:] - full[0, k:]).abs().max().item() > 1e-4  # an ignored reorder would show


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_beam_search_scores_equal_teacher_forced_scores(scheme):
    from fairseq.sequence_generator import SequenceGenerator

    d = make_dictionary()
    model = tiny(scheme, d=d)
    randomise_scheme_parameters(model)
    src, lengths, _, _ = random_batch(d, bsz=3, src_len=6)
    gen = SequenceGenerator([model], d, beam_size=5, max_len_a=0, max_len_b=7, min_len=2)
    with torch.no_grad():
        hypos = gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    for i, nbest in enumerate(hypos):
        assert len(nbest) == 5
        for hypo in nbest[:3]:
            tokens = hypo["tokens"]
            prev = torch.cat([torch.tensor([d.eos()]), tokens[:-1]]).unsqueeze(0)
            with torch.no_grad():
                lp = log_probs(model, src[i: i + 1], lengths[i: i + 1], prev)[0]
            torch.testing.assert_close(lp.gather(1, tokens.unsqueeze(1)).squeeze(1), hypo["positional_scores"],
                                       atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------------
# checkpoints


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_state_dict_round_trip_and_another_schemes_refused(scheme):
    d = make_dictionary()
    ours = tiny(scheme, d=d)
    randomise_scheme_parameters(ours)
    other_name = "pre_ln" if scheme == "post_ln" else "post_ln"
    other = tiny(other_name, d=d)
    with pytest.raises(SchemeMismatchError, match=rf"trained with residual scheme '{scheme}' .* '{other_name}'"):
        other.load_state_dict(ours.state_dict())
    with pytest.raises(SchemeMismatchError, match=rf"trained with residual scheme '{other_name}' .* '{scheme}'"):
        ours.load_state_dict(other.state_dict())
    twin = tiny(scheme, d=d)
    twin.load_state_dict(ours.state_dict())
    for (name, a), b in zip(twin.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), name
    src, lengths, prev, _ = random_batch(d)
    with torch.no_grad():
        torch.testing.assert_close(log_probs(twin, src, lengths, prev), log_probs(ours, src, lengths, prev),
                                   rtol=0, atol=0)


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_validation_after_an_update_through_p_data_reads_the_updated_parameters(scheme):
    """As fairseq's trainer runs: validate (eval, no gradients), ``train()``, an optimizer step that updates
    every parameter in place through ``p.data`` (``fairseq/optim/adam.py``; it leaves the parameter's version
    counter as it was), ``eval()``, validate again: the second validation equals a fresh model's with the same
    parameters (nothing computed from the parameters outlives the update), and differs from the first (the
    update mattered)."""
    d = make_dictionary()
    model = tiny(scheme, d=d)
    randomise_scheme_parameters(model)
    src, lengths, prev, _ = random_batch(d)
    model.eval()
    with torch.no_grad():
        before = log_probs(model, src, lengths, prev)
    model.train()
    torch.manual_seed(2)
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    model.eval()
    fresh = tiny(scheme, d=d)
    fresh.load_state_dict(model.state_dict())
    fresh.eval()
    with torch.no_grad():
        after = log_probs(model, src, lengths, prev)
        torch.testing.assert_close(after, log_probs(fresh, src, lengths, prev), rtol=0, atol=0)
    assert not torch.allclose(after, before, atol=1e-3)


# ---------------------------------------------------------------------------------------------
# options and refusals


def _out_of_range(option):
    """Values outside the option's range (and, for a float, non-finite ones; argparse refuses them for an int)."""
    values = [math.inf, math.nan] if option.type is float else []
    if option.low is not None:
        values.append(option.type(option.low - 1))
    if option.high is not None:
        values.append(option.type(option.high + 1))
    return values


OPTIONS = [(s.name, o) for s in SCHEMES for o in s.OPTIONS if o.type in (int, float)]


@pytest.mark.parametrize("scheme, option", OPTIONS, ids=[f"{s}-{o.dest}" for s, o in OPTIONS])
def test_every_numeric_option_is_refused_outside_its_range(scheme, option):
    for value in _out_of_range(option):
        kind = "an integer in" if option.type is int else "in"
        with pytest.raises(ValueError, match=rf"^{option.flag} \(model.{option.dest}\) must be {kind} "):
            build_model("residual_transformer_tiny", "--residual-scheme", scheme, f"{option.flag}={value!r}")


INT_OPTIONS = [(s.name, o) for s in SCHEMES for o in s.OPTIONS if o.type is int]


@pytest.mark.parametrize("scheme, option", INT_OPTIONS, ids=[f"{s}-{o.dest}" for s, o in INT_OPTIONS])
def test_an_integer_option_given_a_fraction_under_hydra_says_integer(scheme, option):
    """Hydra hands a number over as typed (+model.hc_streams=2.5), past argparse's int: the refusal says that
    an integer is wanted, not only the range the fraction lies in."""
    from fairseq_residual.config import residual_options

    _, args, _ = build_model("residual_transformer_tiny", "--residual-scheme", scheme)
    setattr(args, option.dest, (option.low if option.low is not None else 1) + 0.5)
    with pytest.raises(ValueError, match=rf"^{option.flag} \(model.{option.dest}\) must be an integer in .*got "
                                         rf"{getattr(args, option.dest)}"):
        residual_options(args)


GIVEN = [(s.name, o) for s in SCHEMES for o in s.OPTIONS if o.default is not None or o.type is str]


@pytest.mark.parametrize("scheme, option", GIVEN, ids=[f"{s}-{o.dest}" for s, o in GIVEN])
def test_an_option_of_another_scheme_is_refused_the_same_way(scheme, option):
    if option.type is bool:
        flag, value = (option.negative if option.default else option.flag), None
    elif option.choices:
        value = next(c for c in option.choices if c != option.default)
    elif option.type is str:
        value = "some-file"
    else:
        value = option.high if option.high is not None and option.high != option.default else option.low
    if option.type is not bool:
        flag = option.flag
    other = "pre_ln" if scheme != "pre_ln" else "post_ln"
    key = rf"model\.{option.dest}=false" if flag == option.negative else rf"model\.{option.dest}"
    with pytest.raises(ValueError, match=rf"^{flag} \({key}\) is an option of --residual-scheme {scheme} "
                                         rf"\(model\.residual_scheme={scheme}\), but the model's "
                                         rf"scheme is {other}: fairseq-generate, -interactive and -validate: .*drop "
                                         rf"residual_scheme from --model-overrides\); fairseq-train: drop {flag} or use "
                                         rf"--residual-scheme {scheme}$"):
        build_model("residual_transformer_tiny", "--residual-scheme", other, flag, *([] if value is None else [value]))


def test_a_depth_that_is_no_integer_is_refused_by_name():
    """Hydra hands over what was typed (model.encoder_layers=two), past argparse's int: named, not int()'s error."""
    from fairseq_residual.config import residual_options

    _, args, _ = build_model("residual_transformer_tiny")
    for typed in ("two", 2.5, True):
        args.encoder_layers = typed
        with pytest.raises(ValueError, match=rf"^--encoder-layers \(model\.encoder_layers\) must be an integer, at "
                                             rf"least 1, got {typed!r}"):
            residual_options(args)
    for accepted in ("3", np.int64(3)):  # a digit string (a legacy namespace), a numpy integer
        args.encoder_layers = accepted
        assert residual_options(args).encoder_layers == 3


def test_an_option_of_another_scheme_is_refused_before_its_range_is_checked():
    """Its value is moot: a user told "must be in [0.01, 1]" would fix the value, only to be told to drop it."""
    with pytest.raises(ValueError, match=r"^--resi-dual-scale \(model\.resi_dual_scale\) is an option of "
                                         r"--residual-scheme resi_dual .* is pre_ln"):
        build_model("residual_transformer_tiny", "--residual-scheme", "pre_ln", "--resi-dual-scale", 2)
    with pytest.raises(ValueError, match=r"^--resi-dual-scale \(model\.resi_dual_scale\) must be in \[0.01, 1\]"):
        build_model("residual_transformer_tiny", "--residual-scheme", "resi_dual", "--resi-dual-scale", 2)


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_options_the_scheme_cannot_honour_are_refused(scheme):
    s = get_scheme(scheme)
    if not s.normalize_before:
        with pytest.raises(ValueError, match=rf"--encoder-normalize-before asks for Pre-LN but --residual-scheme "
                                             rf"is {scheme}"):
            tiny(scheme, "--encoder-normalize-before")
    else:
        tiny(scheme, "--encoder-normalize-before")  # redundant, accepted
    if s.fairseq_path:
        tiny(scheme, "--cross-self-attention")  # fairseq's own layers implement it
    else:
        with pytest.raises(ValueError, match=rf"--cross-self-attention is not supported with --residual-scheme "
                                             rf"{scheme}; drop --cross-self-attention"):
            tiny(scheme, "--cross-self-attention")
    if s.has_layer_norm:
        tiny(scheme, "--layernorm-embedding")
    else:
        with pytest.raises(ValueError, match=rf"--layernorm-embedding adds a LayerNorm but --residual-scheme {scheme}"):
            tiny(scheme, "--layernorm-embedding")
    if s.layerdrop:
        tiny(scheme, "--encoder-layerdrop", 0.5)
    else:
        with pytest.raises(ValueError, match=rf"--encoder-layerdrop is not supported with --residual-scheme {scheme}"):
            tiny(scheme, "--encoder-layerdrop", 0.5)
    for flag in ("--encoder-layers", "--decoder-layers"):
        with pytest.raises(ValueError, match=rf"^{flag} must be at least 1, got 0"):
            tiny(scheme, flag, 0)
    # per-parameter optimizer settings: the registry's optim_overrides says which (scripts/train.sh reads it), and
    # fairseq's flat --fp16 master copy, one parameter group, is refused for them
    keys = {k for p in tiny(scheme).parameters() for k in (getattr(p, "optim_overrides", None) or {})}
    assert keys == set(s.optim_overrides_keys) and bool(keys) == bool(s.optim_overrides)
    if keys:  # the check fairseq's Trainer runs (fairseq_residual/training_checks.py), on fairseq-train's arguments
        fp16 = ("--fp16", "--optimizer", "adam", "--weight-decay", 0.1)
        flat, per_parameter = (build_model("residual_transformer_tiny", *flags_of(scheme), *fp16, *extra)
                               for extra in ((), ("--fp16-no-flatten-grads",)))
        with pytest.raises(ValueError, match=rf"--residual-scheme {scheme} trains {s.optim_overrides}, but --fp16 "
                                             rf"keeps one flat fp32 copy .* add --fp16-no-flatten-grads"):
            check_training(namespace_config(flat[1]), flat[0])
        check_training(namespace_config(per_parameter[1]), per_parameter[0])


# ---------------------------------------------------------------------------------------------
# activation checkpointing, the analysis tool, presets


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_activation_checkpointing_gives_the_same_gradients(scheme):
    d = make_dictionary()
    src, lengths, prev, _ = random_batch(d)
    grads = []
    for flags in ((), ("--checkpoint-activations",)):
        model = tiny(scheme, *flags, d=d, seed=1)
        randomise_scheme_parameters(model)
        model.train()
        torch.manual_seed(2)  # the same dropout masks (and, for Admin, the same profile) in both runs
        model(src, lengths, prev)[0].sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], msg=name)


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_the_analysis_tool_equals_a_direct_computation(scheme):
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    from fairseq_residual.analyze import analyze_model

    d = make_dictionary()
    model, args, task = build_model("residual_transformer_tiny", *flags_of(scheme), *DEPTH, "--dropout", 0,
                                    dictionary=d)
    randomise_scheme_parameters(model)
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    src, lengths, prev, tgt = random_batch(d, bsz=5)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
              "target": tgt, "ntokens": int(tgt.ne(d.pad()).sum()), "nsentences": 5}
    got = analyze_model(model, crit, [sample])

    model.zero_grad(set_to_none=True)  # the direct computation: fairseq's own forward, autograd
    model.train()
    enc = model.encoder(src, src_lengths=lengths, return_all_hiddens=True)
    net_output = model.decoder(prev, encoder_out=enc, src_lengths=lengths, return_all_hiddens=True)
    loss, _ = crit.compute_loss(model, net_output, sample, reduce=True)
    (loss / sample["ntokens"]).backward()
    states = {"encoder": enc["encoder_states"], "decoder": net_output[1]["inner_states"]}
    masks = {"encoder": src.ne(d.pad()).t(), "decoder": prev.ne(d.pad()).t()}
    for s, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        norms = [math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in layer.parameters() if p.grad is not None))
                 for layer in stack.layers]
        assert got["param_grad_norm"][s] == pytest.approx(norms, rel=1e-5)
        ys = states[s][1:]  # after each layer (index 0 is the embedding output)
        cos = [float(torch.nn.functional.cosine_similarity(a, b, dim=-1)[masks[s]].double().mean())
               for a, b in zip(ys, ys[1:])]
        assert got["cosine_consecutive"][s] == pytest.approx(cos, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_presets_name_the_scheme(scheme):
    for preset in PRESETS:
        assert f"{preset}_{scheme}" in ARCH_NAMES
    model, args, _ = build_model(f"residual_transformer_iwslt_de_en_{scheme}", "--encoder-layers", 1,
                                 "--decoder-layers", 1)
    assert model.residual_scheme == scheme and model.encoder.embed_tokens.embedding_dim == 256


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_readme_and_help_describe_the_scheme(scheme):
    """The README's scheme table has a row for the scheme and docs/schemes.md its recommended training a
    bullet; the model's --help names it with its update."""
    import os

    from fairseq_residual.config import add_residual_args
    import argparse

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    with open(os.path.join(root, "docs", "schemes.md"), encoding="utf-8") as f:
        details = f.read()
    assert f"\n| `{scheme}` " in readme or f"\n| `{scheme}` (default)" in readme
    s = get_scheme(scheme)
    if not s.fairseq_path:
        assert f"\n* `{scheme}`: " in details, f"docs/schemes.md: no recommended training for {scheme}"
    parser = argparse.ArgumentParser()
    add_residual_args(parser)
    text = parser.format_help()
    assert scheme in text and s.label in text


def _scripted_generator(scheme, tmp_path):
    """A tiny ``scheme`` model (scheme parameters randomised), fairseq's ``SequenceGenerator`` (beam 3) over it,
    and that generator compiled with ``torch.jit.script``, saved and loaded: ``(d, model, generator, loaded)``.

    Scripting the generator compiles its ``EnsembleModel`` and the model with it, each module's ``forward`` and
    exported methods (``torch.jit``'s recursive rules), so the loaded generator holds the scripted model."""
    from fairseq.sequence_generator import SequenceGenerator

    d = make_dictionary()
    model = tiny(scheme, d=d)
    randomise_scheme_parameters(model)
    generator = SequenceGenerator([model], d, beam_size=3, max_len_a=0, max_len_b=6)
    torch.jit.script(generator).save(str(tmp_path / "generator.pt"))
    return d, model, generator, torch.jit.load(str(tmp_path / "generator.pt"))


def _check_scripted_generator(d, model, generator, loaded):
    src, lengths, prev, _ = random_batch(d, bsz=3)
    scripted_model = getattr(loaded.model.models, "0")
    assert scripted_model.original_name == type(model).__name__
    with torch.no_grad():
        torch.testing.assert_close(scripted_model(src, lengths, prev)[0], model(src, lengths, prev)[0],
                                   atol=1e-5, rtol=0)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    with torch.no_grad():
        eager, jit = generator.forward(sample), loaded.forward(sample)
    assert len(eager) == len(jit) == 3
    for a, b in zip(eager, jit):
        assert torch.equal(a[0]["tokens"], b[0]["tokens"])
        torch.testing.assert_close(a[0]["score"], b[0]["score"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_torchscript_model_ensemble_and_sequence_generator(scheme, tmp_path):
    """fairseq's own scripting path (its tests/test_export.py and test_sequence_generator.py): fairseq's
    ``SequenceGenerator`` with its ``EnsembleModel`` and the model compile with ``torch.jit.script``, save and
    load; the loaded model's log-probabilities equal the eager model's, and the loaded generator finds the
    eager generator's hypotheses with its scores. The generator's beam search runs in TorchScript's
    interpreter without graph optimisation (``torch.jit.optimized_execution(False)``: the same scripted code,
    a twentieth of the time; the optimising executor on the generator once, in the next test)."""
    scripted = _scripted_generator(scheme, tmp_path)
    with torch.jit.optimized_execution(False):
        _check_scripted_generator(*scripted)


def test_torchscript_generator_under_the_optimising_executor(tmp_path):
    """The scripted generator and model of the residual protocol's generic loop (ResiDual) run under
    TorchScript's default, optimising executor (as a user runs them) and agree with the eager ones."""
    _check_scripted_generator(*_scripted_generator("resi_dual", tmp_path))


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_retain_dropout_modules_takes_fairseqs_names_and_ours(scheme):
    """--retain-dropout-modules as fairseq's transformer understands it (Monte-Carlo dropout at inference):
    fairseq's class names and the plugin's select the same modules; an unknown name is refused, not ignored."""
    from omegaconf import OmegaConf

    from fairseq.modules import FairseqDropout

    d = make_dictionary()
    src, lengths, prev, _ = random_batch(d)

    def prepared(names):
        model = tiny(scheme, "--dropout", 0.3, d=d, seed=1)
        cfg = OmegaConf.create({"generation": {"retain_dropout": True, "retain_dropout_modules": names,
                                               "beam": 5, "print_alignment": False, "no_beamable_mm": False}})
        model.prepare_for_inference_(cfg)
        model.eval()
        return model, {n for n, m in model.named_modules() if isinstance(m, FairseqDropout) and m.apply_during_inference}

    layer_kind = "TransformerEncoderLayerBase"
    fairseq_model, fairseq_kept = prepared(["TransformerEncoderLayer", "TransformerDecoder"])
    ours = "ResidualEncoderLayer" if not get_scheme(scheme).fairseq_path else "TransformerEncoderLayerBase"
    _, our_kept = prepared([ours, "ResidualTransformerDecoder" if get_scheme(scheme).fairseq_path else "ProtocolDecoder"])
    assert fairseq_kept == our_kept
    assert "decoder.dropout_module" in fairseq_kept and "encoder.dropout_module" not in fairseq_kept
    assert {n for n in fairseq_kept if n.startswith("encoder.layers.")} == {
        f"encoder.layers.{i}.{m}" for i in range(2) for m in ("dropout_module", "activation_dropout_module")}, layer_kind
    with torch.no_grad():  # dropout really applies in eval mode: two runs differ
        a, b = fairseq_model(src, lengths, prev)[0], fairseq_model(src, lengths, prev)[0]
    assert (a - b).abs().max() > 0
    with pytest.raises(ValueError, match=r"--retain-dropout-modules TransformerEncoderLayerz: no module of "
                                         r"residual_transformer has this name"):
        prepared(["TransformerEncoderLayerz"])


def _rebuild(args, d):
    from fairseq.tasks.translation import TranslationTask

    model = TranslationTask(args, d, d).build_model(args)
    model.eval()
    return model


@pytest.mark.parametrize("scheme", [s.name for s in SCHEMES if s.layerdrop])
def test_layers_to_keep_prunes_to_the_trained_sub_network(scheme):
    """fairseq's pruning of a LayerDrop-trained model (--encoder-layers-to-keep / --decoder-layers-to-keep
    through the model's load path): the pruned model computes exactly the trained model with only the kept
    layers run, each keeping its index and depth constants (DeepNorm's alpha, Mix-LN's split, LayerNorm
    Scaling's 1/sqrt(l), ...)."""
    d = make_dictionary()
    full, args, _ = build_model("residual_transformer_tiny", *flags_of(scheme), "--encoder-layers", 4,
                                "--decoder-layers", 3, "--encoder-layerdrop", 0.2, "--decoder-layerdrop", 0.2,
                                dictionary=d)
    randomise_scheme_parameters(full)
    if scheme == "admin":  # a trained Admin model is profiled
        for stack in (full.encoder, full.decoder):
            stack.residual.profiled.fill_(1)
    state = full.state_dict()
    keep = {"encoder": [0, 2, 3], "decoder": [1, 2]}
    # as fairseq-generate --model-overrides "{'encoder_layers_to_keep': '0,2,3', ...}" sets them
    pargs = copy.deepcopy(args)
    pargs.encoder_layers_to_keep, pargs.decoder_layers_to_keep = "0,2,3", "1,2"
    pruned = _rebuild(pargs, d)
    assert len(pruned.encoder.layers) == 3 and len(pruned.decoder.layers) == 2
    pruned.load_state_dict(state, model_cfg=pargs)
    for name, stack in (("encoder", full.encoder), ("decoder", full.decoder)):  # the trained sub-network
        stack.layers = torch.nn.ModuleList([stack.layers[i] for i in keep[name]])
    full.eval()
    src, lengths, prev, _ = random_batch(d)
    with torch.no_grad():
        torch.testing.assert_close(log_probs(pruned, src, lengths, prev), log_probs(full, src, lengths, prev),
                                   atol=1e-5, rtol=0)


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_no_decoder_final_norm_is_honoured_or_refused(scheme):
    """--no-decoder-final-norm removes the decoder's final LayerNorm (and only it) where the scheme's output is
    its last state, as fairseq's Pre-LN does; a scheme whose output formula holds that LayerNorm (ResiDual's
    LN(x_d), SiameseNorm's LN_final) refuses it, naming the flag."""
    needed = get_scheme(scheme).final_norm_needed
    if needed:
        with pytest.raises(ValueError, match=rf"--no-decoder-final-norm .*--residual-scheme {scheme} needs"):
            tiny(scheme, "--no-decoder-final-norm")
        return
    plain, dropped = tiny(scheme, seed=0), tiny(scheme, "--no-decoder-final-norm", seed=0)
    assert dropped.decoder.layer_norm is None
    assert (dropped.encoder.layer_norm is None) == (plain.encoder.layer_norm is None)
    extra = {n for n, _ in plain.named_parameters()} - {n for n, _ in dropped.named_parameters()}
    assert extra <= {"decoder.layer_norm.weight", "decoder.layer_norm.bias"}


def test_pruning_keeps_the_stack_without_a_list_and_a_pruned_checkpoint_as_it_is():
    """The load-time pruning renumbers a whole stack's kept layers, leaves a stack without a list and a
    checkpoint that already holds only the kept layers (a model trained pruned) as they are, and refuses a
    checkpoint that matches neither (fairseq's prune_state_dict drops the other stack's layers and prunes a
    pruned checkpoint again)."""
    from fairseq_residual.pruning import prune_to_kept_layers
    from fairseq_residual.schemes import SchemeOptions

    options = SchemeOptions(scheme="lns", params={}, encoder_layers=4, decoder_layers=2,
                            encoder_kept=(1, 3), decoder_kept=(0, 1))
    whole = {f"{s}.layers.{i}.w": torch.tensor(float(10 * (s == "decoder") + i))
             for s, n in (("encoder", 4), ("decoder", 2)) for i in range(n)}
    whole["encoder.layer_norm.weight"] = torch.ones(1)
    pruned = prune_to_kept_layers(dict(whole), options)
    assert {k: float(v) for k, v in pruned.items() if ".layers." in k} == {
        "encoder.layers.0.w": 1.0, "encoder.layers.1.w": 3.0, "decoder.layers.0.w": 10.0, "decoder.layers.1.w": 11.0}
    assert "encoder.layer_norm.weight" in pruned
    assert prune_to_kept_layers(dict(pruned), options).keys() == pruned.keys()  # pruned once, not twice
    del pruned["encoder.layers.1.w"]
    with pytest.raises(ValueError, match=r"holds 2 of the trained model's 4 encoder layers .*checkpoint holds 1"):
        prune_to_kept_layers(pruned, options)
    unpruned = SchemeOptions(scheme="lns", params={}, encoder_layers=4, decoder_layers=2,  # a depth override
                             encoder_kept=(0, 1, 2, 3), decoder_kept=(0, 1))
    with pytest.raises(ValueError, match=r"built with 4 encoder layers \(encoder_layers 4, every layer kept\), but the checkpoint "
                                         r"holds 1 encoder layers: .*fairseq-train: train with --encoder-layers 1"):
        prune_to_kept_layers(pruned, unpruned)


@pytest.mark.parametrize("written", ["TransformerEncoderLayer,TransformerDecoder",
                                     "['TransformerEncoderLayer', 'TransformerDecoder']",
                                     "ResidualEncoderLayer ProtocolDecoder"])
def test_retain_dropout_modules_as_fairseqs_command_line_passes_it(written):
    """fairseq-generate / fairseq-interactive hand ``--retain-dropout-modules`` over as the string typed
    (fairseq types the option ``Any``): a comma- or space-separated list or a Python list literal selects the
    same modules as the list; a name that is no module is still refused by name."""
    from omegaconf import OmegaConf

    from fairseq.modules import FairseqDropout

    def kept(names):
        model = tiny("resi_dual", "--dropout", 0.3, seed=1)
        cfg = OmegaConf.create({"generation": {"retain_dropout": True, "retain_dropout_modules": names,
                                               "beam": 5, "print_alignment": False, "no_beamable_mm": False}})
        model.prepare_for_inference_(cfg)
        return {n for n, m in model.named_modules() if isinstance(m, FairseqDropout) and m.apply_during_inference}

    assert kept(written) == kept(["TransformerEncoderLayer", "TransformerDecoder"]) != set()
    with pytest.raises(ValueError, match=r"expected module names, as A,B or"):
        kept("['TransformerEncoderLayer'")
    with pytest.raises(ValueError, match=r"^--retain-dropout-modules TransformerEncoderLayerz: no module of "):
        kept(written.replace("TransformerEncoderLayer", "TransformerEncoderLayerz").replace(
            "ResidualEncoderLayer", "TransformerEncoderLayerz"))

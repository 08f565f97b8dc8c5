"""``fairseq-residual-analyze``: why depth breaks, measured per layer.

The ResiDual paper (Xie et al. 2023, arXiv 2304.14802) argues that Post-LN's gradients vanish in the
lower layers and that Pre-LN's layer outputs collapse into each other, while ResiDual avoids both.
This tool measures both effects, and the fp16 range of ResiDual's dual stream, on a trained
checkpoint or a freshly initialised model, over K batches of a binarized data set::

    fairseq-residual-analyze data-bin/ding-de-en --arch residual_transformer_iwslt_de_en \\
        --residual-scheme all --layers 24 --embed-dim 64 --ffn-dim 128 --heads 4 \\
        --batches 2 --output-dir analysis/
    fairseq-residual-analyze data-bin/ding-de-en --checkpoint run/checkpoint_best.pt --output-dir a/

What is measured (``analysis.json``, and one PNG per quantity with every model overlaid):

* ``param_grad_norm``: the L2 norm of the gradient of each encoder / decoder layer's parameters.
  The loss is fairseq's criterion (``label_smoothed_cross_entropy``, or ``cross_entropy`` with
  ``--loss cross_entropy``) summed over the K batches and divided by their number of target tokens,
  exactly as fairseq-train normalises an update of ``--update-freq K`` before clipping. The model is
  in train mode with every dropout (and LayerDrop) set to 0, unless ``--keep-dropout``.
  ``grad_norm_low_top`` = layer 1's norm / the top layer's norm (Post-LN's vanishing gradient
  shows as a ratio well below 1).
* ``sublayer_output_grad_norm``: the L2 norm of the gradient with respect to each sub-layer's output
  ``h`` (self-attention, cross-attention, FFN; the branch that is added to the residual stream),
  taken over all positions of the K batches (T x B x C each). Forward hooks on the sub-modules
  ``self_attn``, ``encoder_attn`` and ``fc2`` (fairseq's names) capture the output and
  ``retain_grad`` keeps its gradient, so the same code serves all three schemes. With dropout off
  this output *is* the branch ``h``; with ``--keep-dropout`` it is the output before the dropout.
* ``cosine_consecutive``: for l = 1 .. L-1, the mean over non-padding token positions of
  ``cos(y_l, y_{l+1})``, where ``y_l`` is layer l's output (the residual stream before any final
  LayerNorm; for ResiDual the Post-LN stream ``x_a``). Values near 1 mean the layers hardly change
  the representation (Pre-LN's collapse). For ResiDual ``cosine_consecutive_dual`` gives the same
  for the dual stream ``x_d``, taken from the second element of the layer's output tuple.
* ``dual_stream`` (ResiDual only): ``max_abs``, the largest ``|x_d|`` after each layer over all
  positions (padding included: an overflow there is just as fatal), the ``headroom`` to fp16's
  largest value 65504 (``config.FP16_MAX``), and ``safe_scale``, the ``--resi-dual-scale`` this rule
  recommends:

      c_safe = the largest number of the 1-2-5 series 1, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, ...
               with c_safe * M <= safety * 65504,

  where ``M`` is the largest ``|x_d|`` with c = 1 (the measured value divided by the model's c; the
  dual stream is linear in c) and ``safety`` is ``--fp16-safety`` (default 0.1: a factor 10 of room
  for the growth of ``x_d`` during training, for longer sentences and other batches). A smaller c
  does not change the model's function, since ``LN(c * x_d) = LN(x_d)`` up to LayerNorm's eps
  (1e-7); ``ln_eps_relative`` = eps / (c_safe^2 * smallest per-token variance of the top layer's
  ``x_d`` at c = 1) checks that this still holds (it should be far below 1e-3). Measured on a fresh
  model, ``M`` is a lower bound of what training produces: run the tool on a checkpoint for a
  number that reflects training.

Bad input (a missing checkpoint, a checkpoint of another scheme than ``--residual-scheme``, a
missing data directory or an empty subset) ends with one message naming the problem and the fix,
and exit code 2.
"""
import argparse
import json
import logging
import math
import os
import sys
import warnings
from argparse import Namespace

import torch

from .config import FP16_MAX
from .schemes import SCHEME_NAMES as SCHEMES
from .schemes import colors, labels, scheme_by_id
from .schemes.resi_dual import FINAL_LN_EPS as RESI_DUAL_FINAL_LN_EPS

POST_LN, PRE_LN, RESI_DUAL = "post_ln", "pre_ln", "resi_dual"

PROG = "fairseq-residual-analyze"
PKG_DIR = os.path.dirname(os.path.abspath(__file__))
ALL = "all"
DEFAULT_ARCH = "residual_transformer_iwslt_de_en"

#: Sub-layers per stack, and the fairseq sub-module whose output is the sub-layer's branch ``h``.
SUBLAYERS = {"encoder": ("self_attn", "ffn"), "decoder": ("self_attn", "cross_attn", "ffn")}
HOOKED_MODULE = {"self_attn": "self_attn", "cross_attn": "encoder_attn", "ffn": "fc2"}
STACKS = ("encoder", "decoder")
SCHEME_NAMES = labels()
SUBLAYER_NAMES = {"self_attn": "self-attention", "cross_attn": "cross-attention", "ffn": "FFN"}
SCHEME_COLORS = colors()

logger = logging.getLogger("fairseq_residual.analyze")


class AnalyzeError(Exception):
    """Bad input; the message names the problem and the fix (printed without traceback, exit 2)."""


# ---------------------------------------------------------------------------------------------
# the --resi-dual-scale rule
# ---------------------------------------------------------------------------------------------


def scale_ladder(smallest=1e-6):
    """The 1-2-5 series 1, 0.5, 0.2, 0.1, 0.05, ... down to ``smallest``, largest first."""
    out, decade = [], 1.0
    while decade >= smallest:
        out += [decade, decade / 2, decade / 5]
        decade /= 10
    return [c for c in out if c >= smallest]


def safe_dual_scale(max_abs_unscaled, safety=0.1, fp16_max=FP16_MAX):
    """Largest 1-2-5 value ``c <= 1`` with ``c * max_abs_unscaled <= safety * fp16_max``, or None.

    Args:
        max_abs_unscaled: the largest ``|x_d|`` of the dual stream with c = 1.
        safety: fraction of the fp16 range the dual stream may use, 0 < safety <= 1.
    """
    limit = safety * fp16_max
    for c in scale_ladder():
        if c * max_abs_unscaled <= limit:
            return c
    return None


# ---------------------------------------------------------------------------------------------
# input checks and model / data loading
# ---------------------------------------------------------------------------------------------


def _import_plugin():
    """Register the plugin with fairseq (it is this package; fairseq needs to know its path)."""
    from fairseq import utils

    utils.import_user_module(Namespace(user_dir=PKG_DIR))


def check_data(data, subset, source_lang=None, target_lang=None):
    """Check that ``data`` is a fairseq-preprocess directory holding a non-empty ``subset``.

    Returns:
        ``(source_lang, target_lang)`` (inferred from the file names when not given).

    Raises:
        AnalyzeError: missing directory, dictionaries or subset files, or a subset of 0 sentences.
    """
    from fairseq.data import data_utils, indexed_dataset

    fix = (
        "pass the --destdir of fairseq-preprocess (it holds dict.SRC.txt, dict.TGT.txt and "
        "SUBSET.SRC-TGT.SRC.bin/.idx)"
    )
    if not os.path.isdir(data):
        raise AnalyzeError(f"data directory not found: {data}: {fix}")
    if source_lang is None or target_lang is None:
        source_lang, target_lang = data_utils.infer_language_pair(data)
        if source_lang is None:
            raise AnalyzeError(
                f"no binarized data in {data} (no train.SRC-TGT.SRC.idx to infer the languages "
                f"from): {fix}, or name the languages with --source-lang/--target-lang"
            )
    for lang in (source_lang, target_lang):
        if not os.path.isfile(os.path.join(data, f"dict.{lang}.txt")):
            raise AnalyzeError(f"dictionary {os.path.join(data, f'dict.{lang}.txt')} not found: {fix}")
    prefix = None
    for src, tgt in ((source_lang, target_lang), (target_lang, source_lang)):
        candidate = os.path.join(data, f"{subset}.{src}-{tgt}.{source_lang}")
        if indexed_dataset.dataset_exists(candidate, impl=None):
            prefix = candidate
            break
    if prefix is None:
        raise AnalyzeError(
            f"subset '{subset}' not found in {data} (no {subset}.{source_lang}-{target_lang}."
            f"{source_lang}.bin/.idx): binarize it with fairseq-preprocess "
            f"(--validpref / --testpref / --trainpref) or choose another --subset (train, valid, test)"
        )
    # Every sentence holds at least its end-of-sentence token, so an empty .bin has 0 sentences
    # (and fairseq's memory-mapped reader cannot open an empty file).
    n = 0
    if os.path.getsize(indexed_dataset.data_file_path(prefix)) > 0:
        dataset = data_utils.load_indexed_dataset(prefix, None)
        n = 0 if dataset is None else len(dataset)
    if n == 0:
        raise AnalyzeError(
            f"subset '{subset}' of {data} has 0 sentences: re-run fairseq-preprocess with a "
            f"non-empty text file for it, or choose another --subset (train, valid, test)"
        )
    return source_lang, target_lang


def fairseq_model_argv(data, arch, scheme, layers=None, embed_dim=None, ffn_dim=None, heads=None,
                       seed=1, source_lang=None, target_lang=None, extra=()):
    """fairseq-train command-line arguments that describe a fresh model (used by ``build_fresh_model``)."""
    argv = [data, "--user-dir", PKG_DIR, "--task", "translation", "--arch", arch,
            "--seed", str(seed), "--required-batch-size-multiple", "1"]
    if scheme is not None:
        argv += ["--residual-scheme", scheme]
    if source_lang:
        argv += ["--source-lang", source_lang, "--target-lang", target_lang]
    for stack in STACKS:
        for flag, value in (("layers", layers), ("embed-dim", embed_dim),
                            ("ffn-embed-dim", ffn_dim), ("attention-heads", heads)):
            if value is not None:
                argv += [f"--{stack}-{flag}", str(value)]
    return argv + list(extra)


def build_fresh_model(argv, seed=1):
    """A freshly initialised model from fairseq-train arguments (``fairseq_model_argv``).

    The RNG is seeded with ``seed`` right before ``task.build_model``, so the same arguments and
    seed give the same weights.

    Returns:
        ``(model, task)``.
    """
    from fairseq import options, tasks

    _import_plugin()
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    task = tasks.setup_task(args)
    torch.manual_seed(seed)
    try:
        model = task.build_model(args)
    except ValueError as exc:  # fairseq's / the plugin's option errors
        hint = ""
        if "joined dictionary" in str(exc):
            hint = (": binarize the data with fairseq-preprocess --joined-dictionary, or pick an "
                    "--arch without shared embeddings (e.g. residual_transformer)")
        raise AnalyzeError(f"cannot build the model: {exc}{hint}")
    return model, task


def checkpoint_scheme(state):
    """The residual scheme a checkpoint was trained with (its buffer, else its config)."""
    weights = state.get("model") or {}
    if "encoder.residual_scheme_id" in weights:
        return scheme_by_id(int(weights["encoder.residual_scheme_id"])).name
    cfg = state.get("cfg")
    model_cfg = cfg["model"] if cfg is not None else state.get("args")
    scheme = getattr(model_cfg, "residual_scheme", None)
    if scheme is None and hasattr(model_cfg, "get"):
        scheme = model_cfg.get("residual_scheme", None)
    if scheme in SCHEMES:
        return scheme
    # fairseq's stock transformer: Pre-LN iff it has a final LayerNorm
    return PRE_LN if "encoder.layer_norm.weight" in weights else POST_LN


def load_checkpoint_model(path, data, scheme=None):
    """Load a fairseq checkpoint for analysis, with ``data`` as the task's data directory.

    Args:
        path: checkpoint file written by fairseq-train.
        data: binarized data directory (its dictionaries must be the checkpoint's).
        scheme: the scheme the user expects (``--residual-scheme``), or None / ``all`` for any.

    Returns:
        ``(model, task, scheme)``.

    Raises:
        AnalyzeError: missing or unreadable file, scheme mismatch, dictionaries that do not fit.
    """
    from fairseq import checkpoint_utils, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import open_dict

    _import_plugin()
    if not os.path.isfile(path):
        raise AnalyzeError(
            f"checkpoint not found: {path}: pass a checkpoint written by fairseq-train (e.g. "
            f"SAVE_DIR/checkpoint_best.pt), or analyse a fresh model with --arch PRESET "
            f"--residual-scheme S --layers N instead of --checkpoint"
        )
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as exc:  # torch / pickle raise many types for a file that is not a checkpoint
        raise AnalyzeError(
            f"cannot read checkpoint {path} ({type(exc).__name__}: {exc}): pass a checkpoint file "
            f"written by fairseq-train"
        )
    saved = checkpoint_scheme(state)
    if scheme not in (None, ALL) and scheme != saved:
        raise AnalyzeError(
            f"scheme mismatch: checkpoint {path} was trained with --residual-scheme {saved} but "
            f"--residual-scheme {scheme} was given: drop --residual-scheme (a checkpoint's scheme is "
            f"read from it) or pass --residual-scheme {saved}"
        )
    cfg = state.get("cfg")
    if cfg is None:
        cfg = convert_namespace_to_omegaconf(state["args"])
    with open_dict(cfg):
        cfg.task.data = os.path.abspath(data)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    try:
        model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    except RuntimeError as exc:
        raise AnalyzeError(
            f"checkpoint {path} does not fit the data in {data} ({str(exc).splitlines()[0]} ...): "
            f"pass the data directory the checkpoint was trained on (same dictionaries)"
        )
    return model, task, saved


def load_batches(task, model, subset, num_batches, max_tokens=4096, max_sentences=None, seed=1):
    """The first ``num_batches`` batches of ``subset`` in a seeded random batch order.

    Batches are formed by fairseq's ``get_batch_iterator`` (sentences of similar length together,
    ``required_batch_size_multiple`` 1 so no sentence is dropped) and shuffled with ``seed``.

    Returns:
        list of fairseq samples (on the CPU).
    """
    from fairseq import utils

    task.load_dataset(subset)
    dataset = task.dataset(subset)
    if len(dataset) == 0:
        raise AnalyzeError(f"subset '{subset}' has 0 sentences: choose another --subset")
    itr = task.get_batch_iterator(
        dataset=dataset,
        max_tokens=max_tokens,
        max_sentences=max_sentences,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True,
        required_batch_size_multiple=1,
        seed=seed,
    ).next_epoch_itr(shuffle=True)
    batches = []
    for sample in itr:
        if not sample:
            continue
        batches.append(sample)
        if len(batches) == num_batches:
            break
    if not batches:
        raise AnalyzeError(
            f"no batch could be formed from subset '{subset}' (every sentence longer than the "
            f"model's max positions?): choose another --subset"
        )
    return batches


def build_criterion(task, loss="label_smoothed_cross_entropy", label_smoothing=0.1):
    """fairseq's criterion for the analysis loss (token-level; ``sentence_avg`` off)."""
    if loss == "label_smoothed_cross_entropy":
        from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

        return LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=label_smoothing)
    from fairseq.criterions.cross_entropy import CrossEntropyCriterion

    return CrossEntropyCriterion(task, sentence_avg=False)


# ---------------------------------------------------------------------------------------------
# the measurements
# ---------------------------------------------------------------------------------------------


def model_scheme(model):
    """Residual scheme of a model (plugin attribute, else fairseq's normalize_before)."""
    scheme = getattr(model.encoder, "residual_scheme", None)
    if scheme in SCHEMES:
        return scheme
    return PRE_LN if getattr(model.encoder, "layer_norm", None) is not None else POST_LN


def disable_dropout(model):
    """Set every dropout probability (and LayerDrop) of ``model`` to 0; return how many were > 0."""
    from fairseq.modules import FairseqDropout, LayerDropModuleList

    changed = 0
    for module in model.modules():
        if isinstance(module, (FairseqDropout, torch.nn.Dropout, LayerDropModuleList)):
            if module.p > 0:
                changed += 1
            module.p = 0.0
    return changed


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def analyze_model(model, criterion, batches, keep_dropout=False, safety=0.1):
    """Measure per-layer gradient norms, consecutive-layer cosine similarity and the dual stream.

    Args:
        model: a fairseq encoder-decoder (``encoder.layers`` / ``decoder.layers`` with fairseq's
            sub-module names); it is put in train mode, its dropout set to 0 unless
            ``keep_dropout``, and its gradients are overwritten.
        criterion: a fairseq criterion returning ``(summed loss, sample_size, logging_output)``.
        batches: fairseq samples on the model's device.
        keep_dropout: measure with the model's dropout probabilities.
        safety: fraction of the fp16 range the dual stream may use (``safe_dual_scale``).

    Returns:
        dict of the measurements (see the module docstring); lists run from layer 1 (lowest) up.
    """
    from .tasks import layer_grad_norms

    scheme = model_scheme(model)
    model.train()
    dropouts_disabled = 0 if keep_dropout else disable_dropout(model)
    model.zero_grad(set_to_none=True)
    stacks = {name: getattr(model, name) for name in STACKS}
    n_layers = {name: len(stack.layers) for name, stack in stacks.items()}

    captured = {}  # (stack, sublayer, i) -> tensor with retained grad; (stack, "out", i) -> outputs
    hooks = []

    def sub_hook(key):
        def hook(module, inputs, output):
            h = _first(output)
            if h.requires_grad:
                h.retain_grad()
            captured[key] = h

        return hook

    def layer_hook(key):
        def hook(module, inputs, output):
            x_d = output[1] if scheme == RESI_DUAL and isinstance(output, (tuple, list)) else None
            captured[key] = (_first(output).detach(), None if x_d is None else x_d.detach())

        return hook

    for name, stack in stacks.items():
        for i, layer in enumerate(stack.layers):
            for sub in SUBLAYERS[name]:
                module = getattr(layer, HOOKED_MODULE[sub], None)
                if module is not None:
                    hooks.append(module.register_forward_hook(sub_hook((name, sub, i))))
            hooks.append(layer.register_forward_hook(layer_hook((name, "out", i))))

    zeros = lambda n: torch.zeros(n, dtype=torch.float64)  # noqa: E731
    sub_sq = {(s, sub): zeros(n_layers[s]) for s in STACKS for sub in SUBLAYERS[s]}
    cos_sum = {s: zeros(max(n_layers[s] - 1, 0)) for s in STACKS}
    cos_dual_sum = {s: zeros(max(n_layers[s] - 1, 0)) for s in STACKS}
    cos_count = {s: zeros(max(n_layers[s] - 1, 0)) for s in STACKS}  # token positions per pair
    dual_max = {s: zeros(n_layers[s]) for s in STACKS}
    dual_min_var = {s: math.inf for s in STACKS}
    total_tokens = sum(int(sample["ntokens"]) for sample in batches)
    loss_sum = nll_sum = 0.0
    sentences = src_tokens = 0
    pad = {"encoder": model.encoder.padding_idx, "decoder": model.decoder.padding_idx}

    try:
        for sample in batches:
            captured.clear()
            loss, sample_size, logging_output = criterion(model, sample)
            (loss / total_tokens).backward()
            loss_sum += float(logging_output["loss"])
            nll_sum += float(logging_output.get("nll_loss", logging_output["loss"]))
            sentences += int(sample["nsentences"])
            masks = {  # T x B, True at real tokens
                "encoder": sample["net_input"]["src_tokens"].ne(pad["encoder"]).t(),
                "decoder": sample["net_input"]["prev_output_tokens"].ne(pad["decoder"]).t(),
            }
            src_tokens += int(masks["encoder"].sum())
            for s in STACKS:
                mask = masks[s]
                for sub in SUBLAYERS[s]:
                    for i in range(n_layers[s]):
                        h = captured.get((s, sub, i))
                        if h is not None and h.grad is not None:
                            sub_sq[s, sub][i] += float(h.grad.detach().double().pow(2).sum())
                # a layer skipped by LayerDrop (--keep-dropout) has no output: its pairs are skipped
                outs = [captured.get((s, "out", i)) for i in range(n_layers[s])]
                for i in range(n_layers[s] - 1):
                    if outs[i] is None or outs[i + 1] is None:
                        continue
                    cos_count[s][i] += int(mask.sum())
                    cos = torch.nn.functional.cosine_similarity(
                        outs[i][0].float(), outs[i + 1][0].float(), dim=-1
                    )
                    cos_sum[s][i] += float(cos[mask].double().sum())
                    if scheme == RESI_DUAL:
                        cos = torch.nn.functional.cosine_similarity(
                            outs[i][1].float(), outs[i + 1][1].float(), dim=-1
                        )
                        cos_dual_sum[s][i] += float(cos[mask].double().sum())
                if scheme == RESI_DUAL:
                    for i in range(n_layers[s]):
                        if outs[i] is not None:
                            dual_max[s][i] = max(float(dual_max[s][i]), float(outs[i][1].abs().max()))
                    if outs and outs[-1] is not None:
                        top = outs[-1][1].float().var(dim=-1, unbiased=False)  # T x B
                        dual_min_var[s] = min(dual_min_var[s], float(top[mask].min()))
            captured.clear()
        param = {s: layer_grad_norms(stacks[s].layers).double().cpu() for s in STACKS}
    finally:
        for handle in hooks:
            handle.remove()
        captured.clear()

    result = {
        "scheme": scheme,
        "encoder_layers": n_layers["encoder"],
        "decoder_layers": n_layers["decoder"],
        "embed_dim": int(model.encoder.embed_tokens.embedding_dim),
        "dropout": "kept" if keep_dropout else f"off ({dropouts_disabled} dropout modules set to 0)",
        "batches": len(batches),
        "sentences": sentences,
        "source_tokens": src_tokens,
        "target_tokens": total_tokens,
        # fairseq's convention: loss per target token in base 2
        "loss": loss_sum / total_tokens / math.log(2),
        "nll_loss": nll_sum / total_tokens / math.log(2),
        "param_grad_norm": {s: param[s].tolist() for s in STACKS},
        "grad_norm_low_top": {
            s: (float(param[s][0] / param[s][-1]) if n_layers[s] and param[s][-1] > 0 else None)
            for s in STACKS
        },
        "sublayer_output_grad_norm": {
            s: {sub: sub_sq[s, sub].sqrt().tolist() for sub in SUBLAYERS[s]} for s in STACKS
        },
        "cosine_consecutive": {s: _mean_or_none(cos_sum[s], cos_count[s]) for s in STACKS},
        "cosine_consecutive_dual": None,
        "dual_stream": None,
    }
    if scheme == RESI_DUAL:
        result["cosine_consecutive_dual"] = {
            s: _mean_or_none(cos_dual_sum[s], cos_count[s]) for s in STACKS
        }
        result["dual_stream"] = {s: _dual_report(stacks[s], dual_max[s], dual_min_var[s], safety)
                                 for s in STACKS}
    return result


def _mean_or_none(total, count):
    """Element-wise total / count as a list, None where count is 0 (JSON has no NaN)."""
    return [float(t / n) if n > 0 else None for t, n in zip(total.tolist(), count.tolist())]


def _nan(values):
    """None -> NaN, for plotting."""
    return [math.nan if v is None else v for v in values]


def _dual_report(stack, max_abs, min_var, safety):
    c = float(getattr(stack, "dual_scale", 1.0))
    peak = float(max_abs.max()) if len(max_abs) else 0.0
    unscaled = peak / c
    safe = safe_dual_scale(unscaled, safety)
    var_unscaled = min_var / (c * c)
    eps_rel = None
    if safe is not None and var_unscaled > 0:
        eps_rel = RESI_DUAL_FINAL_LN_EPS / (safe * safe * var_unscaled)
    return {
        "scale": c,
        "max_abs": max_abs.tolist(),
        "max_abs_peak": peak,
        "max_abs_unscaled": unscaled,
        "headroom": (FP16_MAX / peak) if peak > 0 else None,
        "fp16_max": FP16_MAX,
        "fp16_safety": safety,
        "safe_scale": safe,
        "ln_eps_relative": eps_rel,
    }


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------


#: Post-LN is drawn wider, under the others: at initialisation ResiDual's encoder x_a stream is the
#: Post-LN computation itself (same seed, same weights), and the two curves coincide.
SCHEME_STYLES = {
    POST_LN: {"marker": "o", "markersize": 5, "linewidth": 2.6, "zorder": 2},
    PRE_LN: {"marker": "s", "markersize": 3, "linewidth": 1.5, "zorder": 3},
    RESI_DUAL: {"marker": "^", "markersize": 3, "linewidth": 1.3, "zorder": 4},
}


def _style(i, run):
    scheme = run["scheme"]
    color = SCHEME_COLORS.get(scheme) if run.get("_unique_scheme", True) else None
    style = {"color": color or f"C{i}", "marker": "o", "markersize": 3, "linewidth": 1.5}
    style.update(SCHEME_STYLES.get(scheme, {}))
    return style


def write_plots(runs, out_dir, meta, dpi=90):
    """One PNG per quantity, every run overlaid; returns the written paths.

    Args:
        runs: the ``models`` entries of the report (``analyze_model`` results plus ``label``).
        out_dir: existing output directory.
        meta: the report's top-level entries (``loss_name``, ``subset``, ``batches``,
            ``target_tokens``, ``dropout``), shown in the titles.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search logs at DEBUG

    counts = {}
    for run in runs:
        counts[run["scheme"]] = counts.get(run["scheme"], 0) + 1
    for run in runs:
        run["_unique_scheme"] = counts[run["scheme"]] == 1
    what = (f"{meta['loss_name']}, {meta['subset']} subset: {meta['batches']} batch(es), "
            f"{meta['target_tokens']} target tokens; dropout {meta['dropout']}")
    paths = []

    def save(fig, name):
        path = os.path.join(out_dir, name)
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
        paths.append(path)

    def layers_axis(ax, n, title, ylabel, log=False):
        ax.set_title(title)
        ax.set_xlabel("layer (1 = lowest, next to the embedding)")
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        if n <= 24:
            ax.set_xticks(range(1, n + 1, 1 if n <= 12 else 2))

    # 1. per-layer parameter gradient norms
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, s in zip(axes, STACKS):
        n = 0
        for i, run in enumerate(runs):
            values = run["param_grad_norm"][s]
            n = max(n, len(values))
            ratio = run["grad_norm_low_top"][s]
            label = run["label"] + (f" (layer 1 / top = {ratio:.3g})" if ratio is not None else "")
            ax.plot(range(1, len(values) + 1), values, label=label, **_style(i, run))
        layers_axis(ax, n, f"{s}", "||grad of layer parameters|| (log)", log=True)
        ax.legend(fontsize=8)
    fig.suptitle(f"Gradient norm of each layer's parameters\n({what})", fontsize=10)
    save(fig, "grad_norm_layers.png")

    # 2. sub-layer output gradient norms
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    panels = [("encoder", "self_attn"), ("encoder", "ffn"), None,
              ("decoder", "self_attn"), ("decoder", "cross_attn"), ("decoder", "ffn")]
    handles = labels = None
    for ax, panel in zip(axes.flat, panels):
        if panel is None:
            legend_ax = ax
            continue
        s, sub = panel
        n = 0
        for i, run in enumerate(runs):
            values = run["sublayer_output_grad_norm"][s][sub]
            n = max(n, len(values))
            ax.plot(range(1, len(values) + 1), values, label=run["label"], **_style(i, run))
        layers_axis(ax, n, f"{s} {SUBLAYER_NAMES[sub]}", "||grad of sub-layer output h|| (log)",
                    log=True)
        handles, labels = ax.get_legend_handles_labels()
    legend_ax.axis("off")
    if handles:
        legend_ax.legend(handles, labels, loc="center", title="model")
    fig.suptitle("Gradient norm at each sub-layer's output h (the branch added to the residual "
                 f"stream), all positions\n({what})", fontsize=10)
    save(fig, "grad_norm_sublayers.png")

    # 3. consecutive-layer cosine similarity
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, s in zip(axes, STACKS):
        n = 0
        for i, run in enumerate(runs):
            values = _nan(run["cosine_consecutive"][s])
            n = max(n, len(values) + 1)
            name = run["label"] + (" x_a stream" if run["scheme"] == RESI_DUAL else "")
            ax.plot(range(1, len(values) + 1), values, label=name, **_style(i, run))
            dual = run.get("cosine_consecutive_dual")
            if dual:
                style = _style(i, run)
                style.update(linestyle="--", marker="s")
                ax.plot(range(1, len(dual[s]) + 1), _nan(dual[s]), label=run["label"] + " dual stream x_d",
                        **style)
        ax.set_title(s)
        ax.set_xlabel("layer l (pair: output of layer l vs layer l+1)")
        ax.set_ylabel("mean cos(y_l, y_l+1) over tokens")
        ax.set_ylim(top=1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Cosine similarity of consecutive layer outputs (1 = the layer changed nothing: "
                 f"representation collapse)\n({what})", fontsize=10)
    save(fig, "cosine_similarity.png")

    # 4. ResiDual dual-stream range
    dual_runs = [(i, r) for i, r in enumerate(runs) if r.get("dual_stream")]
    if dual_runs:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, s in zip(axes, STACKS):
            n = 0
            for i, run in dual_runs:
                d = run["dual_stream"][s]
                n = max(n, len(d["max_abs"]))
                safe = d["safe_scale"]
                label = (f"{run['label']} (c = {d['scale']:g}; "
                         f"safe c = {safe:g})" if safe is not None else f"{run['label']} (c = {d['scale']:g})")
                ax.plot(range(1, len(d["max_abs"]) + 1), d["max_abs"], label=label, **_style(i, run))
            safety = dual_runs[0][1]["dual_stream"][s]["fp16_safety"]
            ax.axhline(FP16_MAX, color="black", linestyle="-", linewidth=1, label="fp16 max 65504")
            ax.axhline(safety * FP16_MAX, color="gray", linestyle=":", linewidth=1,
                       label=f"safety limit {safety:g} x 65504")
            layers_axis(ax, n, s, "max |x_d| after the layer (log)", log=True)
            ax.legend(fontsize=8)
        fig.suptitle(f"ResiDual dual stream x_d: largest magnitude per layer vs the fp16 range\n({what})",
                     fontsize=10)
        save(fig, "dual_stream_range.png")
    for run in runs:
        run.pop("_unique_scheme", None)
    return paths


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Per-layer gradient norms, consecutive-layer cosine similarity and ResiDual's "
        "dual-stream range of Post-LN / Pre-LN / ResiDual Transformers, on a checkpoint or a fresh "
        "model, written as JSON and PNG plots. Other fairseq model options (e.g. --activation-fn "
        "gelu) are passed to fairseq for fresh models.",
        epilog="Definitions and the --resi-dual-scale rule: python -c 'import fairseq_residual."
        "analyze as a; help(a)', or docs/analysis.md.",
    )
    p.add_argument("data", help="binarized data directory (fairseq-preprocess --destdir)")
    p.add_argument("--subset", default="valid", help="subset to draw batches from (default: valid)")
    p.add_argument("-s", "--source-lang", help="source language (default: inferred from DATA)")
    p.add_argument("-t", "--target-lang", help="target language (default: inferred from DATA)")
    g = p.add_argument_group("model (a checkpoint, or a fresh model)")
    g.add_argument("--checkpoint", nargs="+", metavar="PATH",
                   help="checkpoint(s) written by fairseq-train; several are overlaid in the plots")
    g.add_argument("--arch", help=f"fresh model: --arch preset (default: {DEFAULT_ARCH})")
    g.add_argument("--residual-scheme", choices=SCHEMES + (ALL,),
                   help="fresh model: the scheme, or 'all' for the three overlaid (default: all, or the "
                   "preset's _<scheme> suffix); with --checkpoint: the expected scheme (checked)")
    g.add_argument("--layers", type=int, metavar="N", help="fresh model: layers per stack")
    g.add_argument("--embed-dim", type=int, help="fresh model: embedding / model width")
    g.add_argument("--ffn-dim", type=int, help="fresh model: FFN inner width")
    g.add_argument("--heads", type=int, help="fresh model: attention heads")
    g.add_argument("--seed", type=int, default=1, help="initialisation and batch-order seed (default 1)")
    g = p.add_argument_group("measurement")
    g.add_argument("--batches", type=int, default=1, metavar="K",
                   help="number of batches (default 1); gradients are of their summed loss")
    g.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch (default 4096)")
    g.add_argument("--batch-size", "--max-sentences", type=int, dest="max_sentences",
                   help="sentences per batch (default: no limit)")
    g.add_argument("--loss", choices=("label_smoothed_cross_entropy", "cross_entropy"),
                   default="label_smoothed_cross_entropy", help="criterion (default: label-smoothed CE)")
    g.add_argument("--label-smoothing", type=float, default=0.1, help="for the label-smoothed loss")
    g.add_argument("--keep-dropout", action="store_true",
                   help="keep the model's dropout (default: all dropout and LayerDrop set to 0)")
    g.add_argument("--fp16-safety", type=float, default=0.1, metavar="F",
                   help="ResiDual: fraction of the fp16 range (65504) the dual stream may use when "
                   "recommending --resi-dual-scale (default 0.1)")
    g.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    g = p.add_argument_group("output")
    g.add_argument("--output-dir", default="analysis", help="where analysis.json and the PNGs go")
    g.add_argument("--no-plots", action="store_true", help="write the JSON only")
    g.add_argument("--verbose", action="store_true", help="show fairseq's log messages")
    return p


def _check_args(args, extra):
    if args.batches < 1:
        raise AnalyzeError(f"--batches must be >= 1, got {args.batches}")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise AnalyzeError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if not 0 < args.fp16_safety <= 1:
        raise AnalyzeError(f"--fp16-safety must be in (0, 1], got {args.fp16_safety}")
    fresh_only = [f"--{k.replace('_', '-')}" for k in ("arch", "layers", "embed_dim", "ffn_dim", "heads")
                  if getattr(args, k) is not None]
    if args.checkpoint:
        if fresh_only or extra:
            raise AnalyzeError(
                f"{' '.join(fresh_only + list(extra))}: these describe a fresh model, but --checkpoint "
                f"was given (a checkpoint's architecture is read from it): drop them, or drop --checkpoint"
            )
    elif args.layers is not None and args.layers < 1:
        raise AnalyzeError(f"--layers must be >= 1, got {args.layers}")


def _fresh_schemes(args):
    if args.residual_scheme is not None:
        return list(SCHEMES) if args.residual_scheme == ALL else [args.residual_scheme]
    arch = args.arch or DEFAULT_ARCH
    for scheme in SCHEMES:
        if arch.endswith("_" + scheme):
            return [scheme]
    return list(SCHEMES)


def run(args, extra=(), argv=None):
    """Analyse every requested model; write ``analysis.json`` and the plots; return the report."""
    from fairseq import utils

    _check_args(args, extra)
    src, tgt = check_data(args.data, args.subset, args.source_lang, args.target_lang)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    models = []  # (source, path or scheme); built one at a time to keep memory low
    if args.checkpoint:
        for path in args.checkpoint:
            if not os.path.isfile(path):
                load_checkpoint_model(path, args.data, args.residual_scheme)  # raises the message
        for path in args.checkpoint:
            models.append(("checkpoint", path))
    else:
        for scheme in _fresh_schemes(args):
            models.append(("init", scheme))

    runs = []
    for source, what in models:
        if source == "checkpoint":
            model, task, scheme = load_checkpoint_model(what, args.data, args.residual_scheme)
            info = {"source": "checkpoint", "checkpoint": what}
        else:
            arch = args.arch or DEFAULT_ARCH
            fs_argv = fairseq_model_argv(args.data, arch, what, args.layers, args.embed_dim,
                                         args.ffn_dim, args.heads, args.seed, src, tgt, extra)
            model, task = build_fresh_model(fs_argv, seed=args.seed)
            scheme = what
            shown = [("fairseq_residual" if a == PKG_DIR else a) for a in fs_argv[1:]]  # no local paths
            info = {"source": "init", "arch": arch, "seed": args.seed, "fairseq_args": shown}
        model.to(device)
        batches = load_batches(task, model, args.subset, args.batches, args.max_tokens,
                               args.max_sentences, args.seed)
        if len(batches) < args.batches:
            logger.warning(f"subset '{args.subset}' gives only {len(batches)} batch(es) of "
                           f"--max-tokens {args.max_tokens}; using them all")
        if device.type != "cpu":
            batches = [utils.move_to_cuda(b, device) for b in batches]
        criterion = build_criterion(task, args.loss, args.label_smoothing)
        result = analyze_model(model, criterion, batches, args.keep_dropout, args.fp16_safety)
        label = SCHEME_NAMES[scheme] if source == "init" else f"{SCHEME_NAMES[scheme]}: {what}"
        runs.append({"label": label, **info, **result})
        del model, batches

    first = runs[0]
    meta = {
        "tool": PROG,
        "command": [PROG] + list(sys.argv[1:] if argv is None else argv),
        "data": args.data,
        "subset": args.subset,
        "source_lang": src,
        "target_lang": tgt,
        "batches": first["batches"],
        "max_tokens": args.max_tokens,
        "sentences": first["sentences"],
        "target_tokens": first["target_tokens"],
        "loss_name": args.loss if args.loss == "cross_entropy" else
        f"label_smoothed_cross_entropy (eps {args.label_smoothing:g})",
        "dropout": "kept" if args.keep_dropout else "off",
        "device": str(device),
        "fp16_max": FP16_MAX,
        "fp16_safety": args.fp16_safety,
        "definitions": {
            "param_grad_norm": "L2 norm of d(loss)/d(layer parameters); loss = criterion summed over "
            "the batches / their target tokens; layer 1 = lowest",
            "grad_norm_low_top": "param_grad_norm of layer 1 / that of the top layer",
            "sublayer_output_grad_norm": "L2 norm of d(loss)/d(h) over all positions, h = output of "
            "self_attn / encoder_attn / fc2",
            "cosine_consecutive": "entry l-1: mean over non-pad tokens of cos(output of layer l, "
            "output of layer l+1); ResiDual: the x_a stream",
            "cosine_consecutive_dual": "ResiDual: the same for the dual stream x_d",
            "dual_stream.safe_scale": "largest 1-2-5 value c <= 1 with c * max|x_d at c=1| <= "
            "fp16_safety * 65504",
        },
    }
    os.makedirs(args.output_dir, exist_ok=True)
    report = {**meta, "models": runs}
    plots = [] if args.no_plots else write_plots(runs, args.output_dir, meta)
    report["plots"] = [os.path.basename(p) for p in plots]
    path = os.path.join(args.output_dir, "analysis.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(summary_table(runs))
    print(f"wrote {path}" + (f" and {len(plots)} plots ({', '.join(report['plots'])})" if plots else ""))
    return report


def summary_table(runs):
    """A plain-text table of the headline numbers of each run."""
    rows = [("model", "layers", "enc grad L1/top", "dec grad L1/top", "enc cos top", "dec cos top",
             "max|x_d| enc/dec", "safe c enc/dec")]
    for run in runs:
        cos = run["cosine_consecutive"]
        dual = run.get("dual_stream")
        fmt = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
        rows.append((
            run["label"],
            f"{run['encoder_layers']}+{run['decoder_layers']}",
            fmt(run["grad_norm_low_top"]["encoder"]),
            fmt(run["grad_norm_low_top"]["decoder"]),
            fmt(cos["encoder"][-1] if cos["encoder"] else None),  # None: no pair measured
            fmt(cos["decoder"][-1] if cos["decoder"] else None),
            "-" if not dual else f"{dual['encoder']['max_abs_peak']:.3g}/{dual['decoder']['max_abs_peak']:.3g}",
            "-" if not dual else f"{fmt(dual['encoder']['safe_scale'])}/{fmt(dual['decoder']['safe_scale'])}",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


def main(argv=None):
    """Entry point; returns the exit code (0 ok, 2 bad input)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]  # "--" may separate the fairseq options
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:
        for name in ("fairseq", "matplotlib", "PIL"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # harmless torch warnings that fairseq's code triggers on every batch
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        warnings.filterwarnings("ignore", message=".*mismatched key_padding_mask and attn_mask.*")
    try:
        run(args, extra, argv)
    except AnalyzeError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    return 0


def cli_main():
    sys.exit(main())


if __name__ == "__main__":
    cli_main()

"""Input checks and loading for ``fairseq-residual-analyze``: the data directory, a fresh model built
from fairseq-train arguments or a checkpoint, batches of a subset, the criterion."""
import filecmp
import logging
import os
from argparse import Namespace

import torch

from ..schemes import SCHEME_NAMES as SCHEMES
from ..schemes import scheme_by_id
from ..user_errors import UserInputError, closest, long_options
from .common import ALL, PKG_DIR, POST_LN, PRE_LN, STACKS, AnalyzeError

logger = logging.getLogger("fairseq_residual.analyze")

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
    if os.path.isfile(data):
        raise AnalyzeError(f"{data} is a file, not a data directory: the first argument is the binarized data "
                           f"(DATA), a checkpoint goes after --checkpoint: fairseq-residual-analyze DATA "
                           f"--checkpoint {data}")
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

    def refuse(message):  # argparse's error: one line, not fairseq-train's 200-line usage first
        raise AnalyzeError(f"{message} (fairseq-train's model options; fairseq-train --help lists them)")

    parser.error = refuse
    args, unknown = options.parse_args_and_arch(parser, argv, parse_known=True)
    if unknown:
        close = closest(unknown[0].split("=")[0], long_options(parser), cutoff=0.8)
        refuse(f"unknown option(s): {' '.join(unknown)}" + (f" (did you mean {close}?)" if close else ""))
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


def load_checkpoint_model(path, data, scheme=None, langs=None):
    """Load a fairseq checkpoint for analysis, with ``data`` as the task's data directory.

    Args:
        path: checkpoint file written by fairseq-train.
        data: binarized data directory (its dictionaries must be the checkpoint's).
        scheme: the scheme the user expects (``--residual-scheme``), or None / ``all`` for any.
        langs: ``(source, target)`` the user typed (``--source-lang``/``--target-lang``), or None. The model is
            measured in its own direction, whichever way ``data``'s files are named (fairseq reads either): the
            one its checkpoint records, else (trained without ``-s``/``-t``) the one fairseq inferred from the
            file names of the data it was trained on, where that folder still exists, else ``langs``, else
            ``data``'s, with a warning.

    Returns:
        ``(model, task, scheme)``.

    Raises:
        AnalyzeError: missing or unreadable file, scheme mismatch, a model of another direction than ``langs``
            (a joined dictionary binarizes both directions alike, so the shapes would not tell), dictionaries
            that do not fit, or that differ in content from those of the data it was trained on where that
            folder still exists.
    """
    from fairseq import checkpoint_utils, tasks, utils
    from fairseq.data import data_utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import open_dict

    _import_plugin()
    if os.path.isdir(path):
        from ..checkpoint_safety import folder_message

        raise AnalyzeError(folder_message(path, "--checkpoint"))
    if not os.path.isfile(path):
        raise AnalyzeError(
            f"checkpoint not found: {path}: pass a checkpoint written by fairseq-train (e.g. "
            f"SAVE_DIR/checkpoint_best.pt), or analyse a fresh model with --arch PRESET "
            f"--residual-scheme S --layers N instead of --checkpoint"
        )
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except UserInputError as exc:  # the plugin's own reading of the file (truncated, not a PyTorch file)
        raise AnalyzeError(str(exc))
    except KeyError as exc:  # fairseq's upgrade of a checkpoint's fields: a PyTorch file of something else
        raise AnalyzeError(f"{path} is a PyTorch file but not a fairseq checkpoint (it has no {exc}): pass a "
                           f"checkpoint written by fairseq-train")
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
    trained = (getattr(cfg.task, "source_lang", None), getattr(cfg.task, "target_lang", None))
    origin = utils.split_paths(str(getattr(cfg.task, "data", "") or ""))[0]  # the data it was trained on
    origin = origin if origin and os.path.isdir(origin) else None
    if not all(trained) and origin:  # trained without -s/-t: fairseq inferred the pair from its data's file names
        inferred = data_utils.infer_language_pair(origin)
        trained = inferred if all(inferred) else trained
    if langs is not None and all(trained) and tuple(trained) != tuple(langs):
        raise AnalyzeError(
            f"checkpoint {path} was trained {trained[0]}->{trained[1]}, but --source-lang/--target-lang ask for "
            f"{langs[0]}->{langs[1]}: drop them (a checkpoint is measured in its own direction) or pass "
            f"--source-lang {trained[0]} --target-lang {trained[1]}"
        )
    direction = tuple(trained) if all(trained) else tuple(langs) if langs is not None else None
    if direction is None:
        logger.warning(f"checkpoint {path} does not record its direction (trained without --source-lang/"
                       f"--target-lang, and its data directory is gone): measured in the direction {data}'s file "
                       f"names give; if it was trained the other way, pass --source-lang/--target-lang")
    if origin and os.path.realpath(origin) != os.path.realpath(data):
        _check_same_dictionaries(path, origin, data, direction)
    with open_dict(cfg):
        cfg.task.data = os.path.abspath(data)
        if direction is not None:
            cfg.task.source_lang, cfg.task.target_lang = direction
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    try:
        model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    except UserInputError as exc:  # the plugin's check: shapes (a dictionary not the data's), scheme, norm
        raise AnalyzeError(f"checkpoint {path} does not fit the data in {data}: {exc}")
    except RuntimeError as exc:
        raise AnalyzeError(
            f"checkpoint {path} does not fit the data in {data} ({str(exc).splitlines()[0]} ...): "
            f"pass the data directory the checkpoint was trained on (same dictionaries)"
        )
    return model, task, saved


def _check_same_dictionaries(path, origin, data, direction):
    """Refuse ``data`` whose dictionaries differ in content from those of ``origin``, the folder the checkpoint
    ``path`` was trained on (fairseq's checkpoints hold no dictionary: a dictionary of the same size but other
    words loads without an error and measures nonsense). Only the ``dict.<lang>.txt`` of ``direction`` (all of
    them when it is None) that both folders hold are compared.

    Raises:
        AnalyzeError: naming the first dictionary that differs and the fixes.
    """
    names = ([f"dict.{lang}.txt" for lang in direction] if direction else
             sorted(n for n in os.listdir(origin) if n.startswith("dict.") and n.endswith(".txt")))
    for name in names:
        theirs, ours = os.path.join(origin, name), os.path.join(data, name)
        if os.path.isfile(theirs) and os.path.isfile(ours) and not filecmp.cmp(theirs, ours, shallow=False):
            raise AnalyzeError(
                f"checkpoint {path} was trained on {origin}, whose {name} differs from {ours} (the same size or "
                f"not, other words get other rows): pass {origin}, or data binarized with its dictionaries "
                f"(fairseq-preprocess --srcdict/--tgtdict of {origin}'s dict.*.txt)")


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

"""Kill-safe checkpoints: a kill at any moment leaves a save dir that the same command resumes from.

fairseq 0.12 writes each checkpoint atomically (``torch_persistent_save``: ``checkpointN.pt.tmp``, then a
rename) but then *copies* it to ``checkpoint_best.pt`` / ``checkpoint_last.pt`` with
``PathManager.copy`` (``fairseq/checkpoint_utils.py``, ``save_checkpoint``), which writes the destination
in place. A kill during that copy leaves a truncated ``checkpoint_last.pt``, and every later
``fairseq-train`` with that ``--save-dir`` dies in ``torch.load`` with a bare ``EOFError`` or
``PytorchStreamReader failed reading zip archive``; so does ``fairseq-generate`` on it.

Importing the plugin (any ``--user-dir fairseq_residual`` command) fixes this once, where fairseq does it,
for every entry point (fairseq-train, fairseq-hydra-train, scripts, several ranks):

1. :func:`atomic_copy`: ``checkpoint_utils``' copies go to a temporary file in the destination directory
   that is then renamed over the destination (``os.replace``, atomic on POSIX), so a destination is
   always either its old complete version or the new complete one.
2. :func:`load_checkpoint`: when training resumes from the default ``checkpoint_last.pt``, it resumes from
   the complete *training checkpoint of this run* with the most updates instead, if that is not
   ``checkpoint_last.pt``: a truncated ``checkpoint_last.pt`` (left by a kill under stock fairseq), a
   missing one (a kill before the first copy finished) or an older one (a kill between ``checkpointN.pt``
   and its copy) would otherwise lose work or crash. A warning names the checkpoint used. A training
   checkpoint has a name fairseq's training writes, an update count, optimizer state, and a model state
   that loads into this run's model; an averaged checkpoint in the save dir (``checkpoint_avg10.pt``,
   ``checkpoint.avg10.pt``) or one of another model copied there is never resumed from (it would restart
   the schedule, or continue from weights no optimizer state belongs to), and is named in the log.
   When a run starts or resumes it also removes what a save killed half-way left behind
   (:func:`remove_stale_temporaries`: ``checkpoint*.pt.<pid>.copying``, fairseq's ``checkpoint*.pt.tmp``).
3. :func:`load_checkpoint_to_cpu`: a checkpoint that cannot be read because it was cut short raises
   :class:`TruncatedCheckpointError` naming the file, its size and the complete checkpoints beside it,
   instead of ``EOFError``; :func:`load_model_ensemble_and_task` (fairseq-generate's, -interactive's and
   -validate's ``--path``) names a missing checkpoint with the checkpoints beside it.
4. :func:`overwrite_args_by_name`: a ``--model-overrides`` key that a checkpoint of this plugin's model would
   ignore (a misspelt key is set on the saved model Namespace and read by nobody) is refused by name.

Only the names inside ``fairseq.checkpoint_utils`` are replaced; nothing else of fairseq changes.
"""
import glob
import logging
import math
import os
import pickle
import re
import shutil
import zipfile
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from fairseq import checkpoint_utils
from fairseq.file_io import PathManager

from .user_errors import MissingFileError, SettingError, UserInputError, in_hydra_sweep, in_hydra_train

logger = logging.getLogger(__name__)

_stock_load_checkpoint = getattr(
    checkpoint_utils.load_checkpoint, "__wrapped_stock__", checkpoint_utils.load_checkpoint
)
_stock_load_checkpoint_to_cpu = getattr(
    checkpoint_utils.load_checkpoint_to_cpu, "__wrapped_stock__", checkpoint_utils.load_checkpoint_to_cpu
)
_stock_load_model_ensemble_and_task = getattr(
    checkpoint_utils.load_model_ensemble_and_task, "__wrapped_stock__", checkpoint_utils.load_model_ensemble_and_task
)
_stock_overwrite_args_by_name = getattr(
    checkpoint_utils.overwrite_args_by_name, "__wrapped_stock__", checkpoint_utils.overwrite_args_by_name
)


class TruncatedCheckpointError(UserInputError, RuntimeError):
    """A checkpoint file is incomplete (cut short while it was written), so it cannot be loaded."""


class NotACheckpointError(UserInputError, ValueError):
    """A file given as a checkpoint is no file ``torch.save`` wrote (a JSON file, a log, text)."""


class ForeignCheckpointError(UserInputError, ValueError):
    """The save dir's ``checkpoint_last.pt`` is of another model (another residual scheme, ``--norm`` or tensor
    shapes) and no checkpoint of this run is beside it: resuming would load it and fail."""


def is_complete_checkpoint(path: str) -> bool:
    """True if ``path`` is a complete checkpoint as torch >= 1.6 writes it (a zip archive whose central
    directory, written last, is present). A file cut short at any byte fails this test."""
    try:
        return os.path.getsize(path) > 0 and zipfile.is_zipfile(path)
    except OSError:
        return False


def checkpoints_in(save_dir: str, suffix: str = ""):
    """The complete checkpoints of ``save_dir`` (``checkpoint*{suffix}.pt``), newest written first."""
    paths = [
        p for p in glob.glob(os.path.join(glob.escape(save_dir), f"checkpoint*{suffix}.pt"))
        if is_complete_checkpoint(p)
    ]
    return sorted(paths, key=lambda p: os.path.getmtime(p), reverse=True)


def atomic_copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
    """``PathManager.copy`` for local files, made atomic: copy to ``<dst>.<pid>.copying`` in the same
    directory, then ``os.replace`` it over ``dst``. Remote paths (iopath handlers) keep fairseq's copy.

    Returns:
        True, as ``PathManager.copy``.
    """
    if PathManager.path_requires_pathmanager(src_path) or PathManager.path_requires_pathmanager(dst_path):
        return PathManager.copy(src_path, dst_path, overwrite)
    if not overwrite and os.path.exists(dst_path):
        raise FileExistsError(f"{dst_path} exists and overwrite is False")
    tmp = f"{dst_path}.{os.getpid()}.copying"
    try:
        shutil.copyfile(src_path, tmp)
        os.replace(tmp, dst_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return True


#: what a save killed half-way leaves in a save dir: :func:`atomic_copy`'s ``<dst>.<pid>.copying`` and fairseq's
#: ``torch_persistent_save`` temporary ``<checkpoint>.pt.tmp``
_TEMPORARY = re.compile(r"^checkpoint.*\.pt\.(?:(\d+)\.copying|tmp)$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temporaries(save_dir: str):
    """Remove the temporary files that saves killed half-way left in the local ``save_dir`` (a model's size
    each): ``checkpoint*.pt.<pid>.copying`` whose process is gone and ``checkpoint*.pt.tmp``. Called when a run
    starts or resumes (:func:`load_checkpoint`), before it saves anything. Returns the names removed."""
    if not save_dir or PathManager.path_requires_pathmanager(save_dir) or not os.path.isdir(save_dir):
        return []
    removed = []
    for name in sorted(os.listdir(save_dir)):
        m = _TEMPORARY.match(name)
        if not m or (m.group(1) and _alive(int(m.group(1)))):
            continue
        try:
            os.remove(os.path.join(save_dir, name))
            removed.append(name)
        except FileNotFoundError:  # another rank of this run removed it first
            pass
    if removed:
        logger.info(f"removed {len(removed)} temporary file(s) that a killed save left in {save_dir}: "
                    f"{', '.join(removed)}")
    return removed


class _AtomicCopyPathManager(PathManager):
    """fairseq's ``PathManager`` with :func:`atomic_copy` as ``copy`` (used by ``checkpoint_utils`` only)."""

    copy = staticmethod(atomic_copy)


#: fairseq's names for the checkpoints a training run writes (``checkpoint_utils.save_checkpoint``):
#: ``checkpointE``, ``checkpoint_E_U``, ``checkpoint_best``, ``checkpoint.best_METRIC_VALUE`` and
#: ``checkpoint_last``, each followed by the run's checkpoint suffix and ``.pt``
_TRAINING_NAME = r"checkpoint(?:\d+|_\d+_\d+|_best|_last|\.best_.+_-?\d+\.?\d*){suffix}\.pt"


def is_training_checkpoint_name(name: str, suffix: str = "") -> bool:
    """True if ``name`` (a file name, no directory) is a name fairseq gives the checkpoints of a training run
    with checkpoint suffix ``suffix``; False for anything else written into a save dir, such as an averaged
    checkpoint (``checkpoint_avg10.pt``, ``checkpoint.avg10.pt``, ``checkpoint_last10_avg.pt``)."""
    return re.fullmatch(_TRAINING_NAME.format(suffix=re.escape(suffix)), name) is not None


@dataclass
class ResumeCandidate:
    """A complete ``checkpoint*.pt`` of a save dir, as the resume logic sees it.

    Attributes:
        path: the file.
        num_updates: its update count (``optimizer_history[-1]["num_updates"]``), None if it has none or
            could not be read.
        mtime: its modification time.
        problem: why it may not be resumed from (None: it may), e.g. "has no optimizer state".
        by_name: True if ``problem`` is its file name alone (not a name fairseq's training writes).
        misfit: where ``problem`` is that its model state is of another model, what differs (:class:`Misfit`'s
            ``kind``: "scheme", "norm", "dictionaries" or "shapes"); None otherwise.
        scheme: for a misfit, the residual scheme its encoder was trained with (:func:`trained_scheme`), if any.
    """

    path: str
    num_updates: Optional[int]
    mtime: float
    problem: Optional[str] = None
    by_name: bool = False
    misfit: Optional[str] = None
    scheme: Optional[str] = None


def dictionary_rows_differ(saved: dict, own: dict):
    """``(key, rows in saved, rows in own)`` of the first embedding table whose number of rows (words of the
    dictionary) differs, where those tables and the output projection are the only tensors whose shapes differ
    between the state dicts ``saved`` (a checkpoint's) and ``own`` (this model's), which hold the same tensors by
    name; None otherwise (a tensor of one that the other lacks: another model, whatever its dictionaries). Data
    binarized with other dictionaries than the model's changes those shapes and nothing else."""
    if {k for k, v in saved.items() if torch.is_tensor(v)} != {k for k, v in own.items() if torch.is_tensor(v)}:
        return None
    differ = [k for k, v in saved.items()
              if k in own and torch.is_tensor(v) and tuple(v.shape) != tuple(own[k].shape)]
    tables = [k for k in differ if k.endswith("embed_tokens.weight")
              and saved[k].shape[1:] == own[k].shape[1:] and saved[k].shape[0] != own[k].shape[0]]
    if tables and all(k.endswith(("embed_tokens.weight", "output_projection.weight")) for k in differ):
        return tables[0], saved[tables[0]].shape[0], own[tables[0]].shape[0]
    return None


class Misfit(NamedTuple):
    """Why a checkpoint's model state is not of this run's model: ``kind`` is "scheme" (another residual scheme),
    "norm" (another ``--norm``), "dictionaries" (the same tensors but the embeddings' rows) or "shapes" (another
    model); ``problem`` says it in words."""

    kind: str
    problem: str


def _misfit(saved: dict, model) -> Optional[Misfit]:
    """Why the model state ``saved`` (a checkpoint's ``model``) is not of this run's ``model``, or None.

    Compares the residual scheme of each stack (this plugin's ``residual_scheme_id`` buffers, when both
    have them) and its ``--norm`` (``residual_norm_id``, absent for LayerNorm), then the shapes of every tensor of more than one element, as a multiset: names are not
    compared, so the renames that the model's ``upgrade_state_dict`` applies to checkpoints of earlier
    versions do not count, and that upgrade (which may change the model it runs on) is not called.
    """
    from collections import Counter

    from .norms import DEFAULT_NORM, NORM_BY_ID
    from .schemes import scheme_by_id

    own = model.state_dict()
    for stack in ("encoder", "decoder"):
        key = f"{stack}.residual_scheme_id"
        if key in own and torch.is_tensor(saved.get(key)) and int(saved[key]) != int(own[key]):
            try:
                theirs = scheme_by_id(int(saved[key])).name
            except ValueError:
                theirs = f"id {int(saved[key])}"
            return Misfit("scheme", f"its {stack} was trained with residual scheme '{theirs}', this run's uses "
                                    f"residual scheme '{scheme_by_id(int(own[key])).name}'")
        key = f"{stack}.residual_norm_id"  # --norm: absent for LayerNorm
        if f"{stack}.residual_scheme_id" in own:
            theirs, mine = (NORM_BY_ID.get(int(s[key]), f"id {int(s[key])}") if torch.is_tensor(s.get(key))
                            else DEFAULT_NORM for s in (saved, own))
            if theirs != mine:
                return Misfit("norm", f"its {stack} was trained with --norm {theirs}, this run's uses --norm {mine}")

    def shapes(state):
        return Counter(tuple(t.shape) for t in state.values() if torch.is_tensor(t) and t.numel() > 1)

    if shapes(saved) == shapes(own):
        return None
    words = dictionary_rows_differ(saved, own)
    if words:
        key, theirs, mine = words
        return Misfit("dictionaries", f"its dictionaries are not this data's: {key.split('.')[0]}'s embedding has "
                                      f"{theirs} rows in the checkpoint, {mine} with the dictionaries of this data "
                                      "directory")
    named = [f"{k} has shape {tuple(saved[k].shape)}, this run's {tuple(own[k].shape)}" for k in own
             if torch.is_tensor(saved.get(k)) and tuple(saved[k].shape) != tuple(own[k].shape)]
    if not named:
        extra, lacking = shapes(saved) - shapes(own), shapes(own) - shapes(saved)
        named = [f"tensor shapes differ (it has {dict(extra) or 'none'} that this run does not, and lacks "
                 f"{dict(lacking) or 'none'})"]
    return Misfit("shapes", "another model: " + "; ".join(named[:3]) + (" ..." if len(named) > 3 else ""))


def read_checkpoint_structure(path: str):
    """``torch.load`` of a checkpoint with the safe loader (``weights_only=True``, fairseq's types allow-listed),
    memory-mapped so that only its pickled structure is parsed and its tensors are not read; read whole where
    mmap fails (a file system without it, a legacy non-zip file).

    Raises:
        whatever ``torch.load`` raises for a file it cannot read (missing, truncated, not a checkpoint)."""
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except (OSError, RuntimeError, ValueError):
        return torch.load(path, map_location="cpu", weights_only=True)


def unreadable_reason(exc: BaseException) -> str:
    """Why :func:`read_checkpoint_structure` failed, in one line: ``"<exception type>: <the first sentence of its
    message>"`` (at most 200 characters), torch's weights-only advice (to unpickle with ``weights_only=False``,
    which does not apply to a file torch.save never wrote) replaced by what it means here."""
    reason = (str(exc).strip().splitlines() or [""])[0].split(". ")[0][:200]
    if "weights only load failed" in reason.lower():
        reason = "no file torch.save wrote"
    return f"{type(exc).__name__}: {reason}"


#: model settings that shape no tensor of the model: never the reason a checkpoint does not load, so never named
#: among the settings to resume with
_SHAPELESS = re.compile(r".*(dropout|layerdrop|quant_noise.*|checkpoint_activations|offload_activations|"
                        r"min_params_to_wrap|tpu)$")


def settings_differ(path: str, trainer, limit: Optional[int] = 6):
    """The model settings (keys of :meth:`ResidualTransformerModel.known_model_keys`, less those that shape no
    tensor, such as dropout) in which the checkpoint ``path`` was trained otherwise than ``trainer``'s run, as
    ``(key, theirs, this run's)``, at most ``limit`` (None: all; layers and widths first); ``[]`` when the file cannot be
    read with the safe loader (``torch.load(weights_only=True)``, fairseq's types allow-listed) or saved no model
    settings."""
    from .model import ResidualTransformerModel

    saved = _saved_model_settings(path)
    mine = getattr(getattr(trainer, "cfg", None), "model", None)
    if saved is None or mine is None:
        return []
    first = ("encoder_layers", "decoder_layers", "encoder_embed_dim", "decoder_embed_dim", "encoder_ffn_embed_dim",
             "decoder_ffn_embed_dim")
    keys = sorted(ResidualTransformerModel.known_model_keys(), key=lambda k: (k not in first, k))
    missing = object()
    found = []
    for key in keys:
        theirs, ours = getattr(saved, key, missing), getattr(mine, key, missing)
        if (theirs is not missing and ours is not missing and theirs != ours and not key.startswith("_")
                and not _SHAPELESS.fullmatch(key)):
            found.append((key, theirs, ours))
    return found if limit is None else found[:limit]


def _saved_model_settings(path: str):
    """The model settings a checkpoint was trained with (``cfg.model``, or a legacy one's ``args``), read with the
    safe loader; None where it cannot be read so (only an explanation is lost: the refusal itself stands)."""
    try:
        state = read_checkpoint_structure(path)
        return state["cfg"]["model"] if state.get("cfg") is not None else state.get("args")
    except Exception:  # noqa: BLE001
        return None


def trained_arch(path: str, trainer, differ):
    """Where the checkpoint ``path`` was trained under another ``--arch`` (``model._name``) than ``trainer``'s
    run: ``(its arch, this run's arch, the settings of ``differ`` its arch's defaults do not give)``, so that
    resuming names the preset first and only what was set beside it; None where the archs agree, either is
    unknown, or the file cannot be read with the safe loader.

    An arch's defaults are what fairseq's registered arch function (``ARCH_CONFIG_REGISTRY``) fills into an empty
    namespace, as fairseq-train does for the model settings not given on its command line."""
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY

    saved = _saved_model_settings(path)
    mine = getattr(getattr(trainer, "cfg", None), "model", None)
    theirs_arch = getattr(saved, "_name", None) or getattr(saved, "arch", None)
    my_arch = getattr(mine, "_name", None) or getattr(mine, "arch", None)
    if not theirs_arch or not my_arch or theirs_arch == my_arch or theirs_arch not in ARCH_CONFIG_REGISTRY:
        return None
    defaults = argparse.Namespace()
    try:
        ARCH_CONFIG_REGISTRY[theirs_arch](defaults)
    except Exception:  # noqa: BLE001 - an arch function that needs more than a namespace: no advice by preset
        return None
    missing = object()
    beside = [(key, theirs, ours) for key, theirs, ours in differ if getattr(defaults, key, missing) != theirs]
    return theirs_arch, my_arch, beside


def resume_settings(differ) -> str:
    """The settings of :func:`settings_differ`'s ``(key, theirs, this run's)`` as the user types them: for
    fairseq-train ``--key value``, ``--flag`` for a true switch and ``without --flag`` for a false or unset one;
    under fairseq-hydra-train ``model.key=value`` (``true`` / ``false`` / ``null``)."""
    words = []
    for key, theirs, _ in differ:
        if in_hydra_train():
            value = ("null" if theirs is None else str(theirs).lower() if isinstance(theirs, bool)
                     else ",".join(map(str, theirs)) if isinstance(theirs, (list, tuple)) else theirs)
            words.append(f"model.{key}={value}")
            continue
        flag = "--" + key.replace("_", "-")
        if theirs is True:
            words.append(flag)
        elif theirs is False or theirs is None:
            words.append(f"without {flag}")
        else:
            words.append(f"{flag} {','.join(map(str, theirs)) if isinstance(theirs, (list, tuple)) else theirs}")
    return " ".join(words)


def trained_scheme(model_state: dict) -> Optional[str]:
    """The residual scheme the encoder of a checkpoint's model state (its ``model``) was trained with, from its
    ``residual_scheme_id`` buffer; None for a state without one (not this plugin's) or with an unknown id."""
    from .schemes import scheme_by_id

    scheme_id = model_state.get("encoder.residual_scheme_id")
    if not torch.is_tensor(scheme_id):
        return None
    try:
        return scheme_by_id(int(scheme_id)).name
    except ValueError:
        return None


def inspect_checkpoint(path: str, model=None, need_optimizer_state: bool = True,
                       suffix: str = "") -> ResumeCandidate:
    """Whether the complete checkpoint ``path`` may be resumed from, and its update count.

    Only a checkpoint that fairseq's training wrote for *this* run may be: a training name
    (:func:`is_training_checkpoint_name`), an update count, optimizer state (unless the run saves none:
    ``--no-save-optimizer-state``) and, when ``model`` is given, a model state that loads into ``model``
    (same residual schemes and tensor shapes; see :func:`_misfit`). An averaged checkpoint
    (fairseq's ``scripts/average_checkpoints.py`` or this project's, which drops the optimizer state)
    has averaged weights that no optimizer state belongs to: never a candidate.

    The file is read with ``torch.load(mmap=True, weights_only=True)``: only its pickled structure is
    parsed, its tensors are not read.
    """
    name = os.path.basename(path)
    mtime = os.path.getmtime(path)
    if not is_training_checkpoint_name(name, suffix):
        return ResumeCandidate(path, None, mtime, "its name is none that fairseq gives a training checkpoint "
                               "(checkpoint_last, checkpoint_best, checkpointE, checkpoint_E_U, checkpoint.best_*); "
                               "e.g. an averaged checkpoint, which is for decoding only", by_name=True)
    try:
        state = read_checkpoint_structure(path)
    except Exception as exc:  # unreadable for the safe loader: fairseq's load would fail on it too
        return ResumeCandidate(path, None, mtime, f"it cannot be read ({unreadable_reason(exc)})")
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        return ResumeCandidate(path, None, mtime, "it holds no fairseq model state")
    try:
        num_updates = int(state["optimizer_history"][-1]["num_updates"])
    except (KeyError, IndexError, TypeError, ValueError):
        return ResumeCandidate(path, None, mtime, "it has no update count (optimizer_history)")
    if need_optimizer_state and state.get("last_optimizer_state") is None:
        return ResumeCandidate(path, num_updates, mtime, "it has no optimizer state (e.g. an averaged checkpoint, "
                               "for decoding only)")
    if model is not None:
        misfit = _misfit(state["model"], model)
        if misfit:
            return ResumeCandidate(path, num_updates, mtime, misfit.problem, misfit=misfit.kind,
                                   scheme=trained_scheme(state["model"]))
    return ResumeCandidate(path, num_updates, mtime)


def resume_candidates(save_dir: str, suffix: str = "", model=None, need_optimizer_state: bool = True):
    """The checkpoints of ``save_dir`` that a resumed run may start from, best first, and the others.

    Returns:
        ``(candidates, rejected)``: lists of :class:`ResumeCandidate` of the complete ``checkpoint*.pt``
        files; ``candidates`` ordered by update count (most first), then ``checkpoint_last`` first, then
        the files fairseq saves directly (``checkpointE``, ``checkpoint_E_U``) before its copies
        (``checkpoint_best``, ``checkpoint.best_*``, which users sometimes overwrite with an averaged
        model), then newest written first; ``rejected`` (each with its ``problem``) newest first.
    """
    last = f"checkpoint_last{suffix}.pt"
    direct = re.compile(rf"checkpoint(?:\d+|_\d+_\d+){re.escape(suffix)}\.pt")
    found = [inspect_checkpoint(p, model, need_optimizer_state, suffix)
             for p in checkpoints_in(save_dir)]
    candidates = sorted(
        (c for c in found if c.problem is None),
        key=lambda c: (c.num_updates, os.path.basename(c.path) == last,
                       direct.fullmatch(os.path.basename(c.path)) is not None, c.mtime),
        reverse=True,
    )
    rejected = [c for c in found if c.problem is not None]
    return candidates, rejected


def load_checkpoint(cfg, trainer, **passthrough_args):
    """:func:`resume_from_this_run`, then, when the checkpoint loaded is already at ``--max-update``, the end of
    the run: stock fairseq trains one more update before it checks the limit, and saves it over
    ``checkpoint_last.pt`` / ``checkpoint_best.pt``, so running a finished command again changed its result. An
    info line says so and fairseq-train's epoch loop does not start: nothing trained or saved, and the tool
    returns as after training (``--max-update 0``, no limit, and ``--reset-optimizer``, which restarts the
    count, are fairseq's). Returning, not exiting, lets the next job of a ``fairseq-hydra-train -m`` sweep (or a
    launcher that waits for its function's result) run.

    Returns:
        fairseq's ``(extra_state, epoch_itr)``; for a finished run the iterator is a :class:`FinishedEpochs`.
    """
    result = resume_from_this_run(cfg, trainer, **passthrough_args)
    max_update = getattr(getattr(getattr(trainer, "cfg", None), "optimization", None), "max_update", 0) or 0
    if max_update > 0 and result[0] is not None and trainer.get_num_updates() >= max_update:
        done = trainer.get_num_updates()
        logger.info(f"the checkpoint loaded is at update {done}, --max-update {max_update} "
                    f"(optimization.max_update): this training is done; nothing trained or saved (raise "
                    f"--max-update to train on)")
        return result[0], FinishedEpochs(result[1])
    return result


class FinishedEpochs:
    """fairseq's epoch iterator of a finished run, which fairseq-train's loop (``fairseq_cli/train.py``: ``while
    epoch_itr.next_epoch_idx <= max_epoch``) never enters: its ``next_epoch_idx`` is NaN, which compares below
    nothing, also when ``--max-epoch`` is unset (infinite). Every other attribute is the iterator's."""

    next_epoch_idx = math.nan

    def __init__(self, epoch_itr):
        self._epoch_itr = epoch_itr

    def __getattr__(self, name):
        return getattr(self._epoch_itr, name)


def resume_from_this_run(cfg, trainer, **passthrough_args):
    """fairseq's ``checkpoint_utils.load_checkpoint``, resuming from the right checkpoint of a save dir.

    Only the default ``--restore-file checkpoint_last.pt`` is redirected; an explicit ``--restore-file``,
    ``--finetune-from-model`` on a first launch, and ``--continue-once`` are fairseq's. The run resumes from
    the training checkpoint of this run with the most updates (:func:`resume_candidates`), which is
    ``checkpoint_last.pt`` unless a kill left it truncated, missing or older; a warning names the
    checkpoint used and why. A ``checkpoint*.pt`` that is no training checkpoint of this run (an averaged
    checkpoint, one of another model copied in) is never resumed from: a checkpoint with a training name
    is named in a warning, any other one that is newer than the one resumed from in an info line.
    ``cfg.restore_file`` is set back after loading, so the redirection is not saved into later checkpoints.

    Raises:
        TruncatedCheckpointError: ``checkpoint_last.pt`` is truncated and no checkpoint of the save dir
            may be resumed from.
        ForeignCheckpointError: ``checkpoint_last.pt`` is of another model (its residual scheme, ``--norm`` or
            shapes) and no checkpoint of the save dir may be resumed from; fairseq would otherwise load it and
            end on its generic "Cannot load model parameters" exception, the reason buried in the chain.
    """
    remove_stale_temporaries(cfg.save_dir)
    suffix = trainer.checkpoint_suffix or ""
    last = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
    if cfg.restore_file != "checkpoint_last.pt" or PathManager.path_requires_pathmanager(last):
        return _stock_load_checkpoint(cfg, trainer, **passthrough_args)
    # a sharded model's state_dict is collective or partial: checked by name and optimizer state only
    sharded = getattr(trainer, "is_fsdp", False) or getattr(
        trainer.cfg.common, "model_parallel_size", 1) > 1
    model = None if sharded else trainer.get_model()
    candidates, rejected = resume_candidates(
        cfg.save_dir, suffix, model, need_optimizer_state=not getattr(cfg, "no_save_optimizer_state", False)
    )
    chosen = candidates[0] if candidates else None
    last_exists, last_complete = os.path.exists(last), is_complete_checkpoint(last)
    foreign = chosen is None and next(
        (c for c in rejected if c.misfit and os.path.abspath(c.path) == os.path.abspath(last)), None)
    if foreign:  # before the warnings about each checkpoint: the refusal says it for all of them
        scheme = foreign.scheme
        words = foreign.misfit == "dictionaries"  # no model setting makes this one
        other_scheme = scheme is not None and foreign.misfit == "scheme"
        every = [] if words or other_scheme else settings_differ(last, trainer, limit=None)
        preset = trained_arch(last, trainer, every) if every else None
        differ = every[:6]
        if preset:  # a preset's settings: its name, then what was set beside it
            arch = f"model._name={preset[0]}" if in_hydra_train() else f"--arch {preset[0]}"
            settings = " ".join([arch] + ([resume_settings(preset[2][:6])] if preset[2] else [])) + " as it was trained"
        else:
            settings = ("the data directory it was trained on (fairseq-preprocess --destdir), or text binarized with "
                        "its dictionaries (fairseq-preprocess --srcdict/--tgtdict of that directory's dict.*.txt)"
                        if words else f"--residual-scheme {scheme} (model.residual_scheme={scheme})"
                        if other_scheme
                        else resume_settings(differ) + " as it was trained"
                        if differ else "the settings it was trained with")
        problem = foreign.problem if not differ else "it was trained with " + ", ".join(
            ([f"--arch {preset[0]} (this run: {preset[1]})"] if preset else [])
            + [f"{k} {v} (this run: {mine})" for k, v, mine in differ])
        sweep = (" In a sweep (fairseq-hydra-train -m), give each job its own folder by interpolating the keys it "
                 "varies, e.g. 'checkpoint.save_dir=/path/to/sweep/${model.residual_scheme}'"
                 if in_hydra_sweep() else "")
        raise ForeignCheckpointError(
            f"{last} is not a checkpoint of this run's model: {problem}; {cfg.save_dir} holds no "
            f"checkpoint of this run to resume from. Resume with {settings}, or point --save-dir "
            f"(checkpoint.save_dir) elsewhere to train this model from scratch (nothing was loaded or overwritten)."
            f"{sweep}"
        )
    for c in rejected:
        if chosen is None and os.path.abspath(c.path) == os.path.abspath(last):
            continue  # fairseq loads (or refuses) it itself, as without the plugin
        if not c.by_name:
            logger.warning(f"{c.path} is not a training checkpoint of this run, not resumed from: {c.problem} "
                           f"(move it out of {cfg.save_dir} to silence this)")
        elif chosen is None or c.mtime > chosen.mtime:
            logger.info(f"{os.path.basename(c.path)} is not a training checkpoint, not resumed from: {c.problem}")
    if chosen is None or os.path.abspath(chosen.path) == os.path.abspath(last):
        if last_exists and not last_complete and chosen is None:
            raise TruncatedCheckpointError(
                f"{last} is incomplete ({os.path.getsize(last)} bytes; cut short while it was written) "
                f"and {cfg.save_dir} holds no complete checkpoint of this run to resume from: move it away "
                f"to train from scratch, or point --save-dir elsewhere"
            )
        return _stock_load_checkpoint(cfg, trainer, **passthrough_args)
    if not last_exists and getattr(cfg, "finetune_from_model", None):
        return _stock_load_checkpoint(cfg, trainer, **passthrough_args)
    last_info = next((c for c in rejected if os.path.abspath(c.path) == os.path.abspath(last)), None)
    last_updates = next((c.num_updates for c in candidates if os.path.abspath(c.path) == os.path.abspath(last)), None)
    why = (
        "is missing" if not last_exists
        else "is incomplete (cut short while it was written)" if not last_complete
        else f"is not a training checkpoint of this run ({last_info.problem})" if last_info is not None
        else f"is older than it (update {last_updates})"
    )
    logger.warning(
        f"resuming from {chosen.path} (update {chosen.num_updates}), the training checkpoint of this run with "
        f"the most updates in {cfg.save_dir}: {last} {why}; nothing saved is lost"
    )
    original = cfg.restore_file
    cfg.restore_file = chosen.path
    try:
        return _stock_load_checkpoint(cfg, trainer, **passthrough_args)
    finally:
        cfg.restore_file = original


def _truncated_message(path: str, fix: str) -> str:
    """What is wrong with the local checkpoint file ``path`` that is empty or cut short, and ``fix``, with the
    complete checkpoints beside it (newest first)."""
    size = os.path.getsize(path)
    others = [os.path.basename(p) for p in checkpoints_in(os.path.dirname(path) or ".")]
    hint = (f"complete checkpoints beside it, newest first: {', '.join(others)}" if others
            else "no complete checkpoint is beside it")
    state = "is empty (0 bytes" if size == 0 else f"is truncated ({size} bytes"
    return (f"checkpoint {path} {state}; cut short while it was written, e.g. by a kill during a save): "
            f"{fix} ({hint})")


def check_not_truncated(path: str, fix: str = "load another one") -> None:
    """Refuse a local checkpoint file that is empty or a zip archive cut short, before ``torch.load`` fails
    on it with a bare ``EOFError`` / ``PytorchStreamReader failed reading zip archive``.

    A file in torch's legacy (non-zip, before 1.6) format is not judged: only ``torch.load`` can tell.

    Raises:
        FileNotFoundError: no such file.
        TruncatedCheckpointError: the file is empty or truncated, naming it, its size, ``fix`` and the
            complete checkpoints beside it.
    """
    if not os.path.isfile(path):
        raise MissingFileError(f"checkpoint {path}: no such file")
    with open(path, "rb") as f:
        head = f.read(4)
    if not head or (head == b"PK\x03\x04" and not zipfile.is_zipfile(path)):
        raise TruncatedCheckpointError(_truncated_message(path, fix))


def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
    """fairseq's ``checkpoint_utils.load_checkpoint_to_cpu``, naming a truncated file as such; a misspelt
    ``--model-overrides`` key is refused where it applies them (:func:`overwrite_args_by_name`).

    Raises:
        TruncatedCheckpointError: ``path`` is a local file cut short (not a complete zip archive) and
            ``torch.load`` failed on it; the message lists the complete checkpoints beside it.
        NotACheckpointError: ``path`` is no fairseq checkpoint (:func:`_not_a_checkpoint`: text, JSON, a zip
            archive torch did not write, a bare ``state_dict``).
        SettingError: in fairseq's loading tools, a ``--model-overrides`` key that a checkpoint of this plugin's
            model would ignore, with the closest known key (:func:`overwrite_args_by_name`).
    """
    try:
        state = _stock_load_checkpoint_to_cpu(path, arg_overrides, load_on_all_ranks)
    except (EOFError, OSError, RuntimeError, ValueError, KeyError, pickle.UnpicklingError) as exc:
        if isinstance(exc, UserInputError) or PathManager.path_requires_pathmanager(path) or not os.path.isfile(path):
            raise
        why = _not_a_checkpoint(path)
        if why:
            raise NotACheckpointError(f"{path} is not a checkpoint: {why}; pass a checkpoint fairseq-train wrote") \
                from exc
        if isinstance(exc, KeyError) or is_complete_checkpoint(path):  # read whole: fairseq's own failure stands
            raise
        raise TruncatedCheckpointError(_truncated_message(path, "load another one")) from exc
    return state


def _not_a_checkpoint(path: str) -> Optional[str]:
    """Why the local file ``path``, which fairseq failed to load, is no fairseq checkpoint at all, or None (it may
    be one: cut short, or of a version fairseq cannot upgrade): not a file ``torch.save`` wrote (neither a zip
    archive nor a legacy pickle: text, JSON, HTML); a zip archive without torch's ``data.pkl``; a file
    ``torch.save`` wrote that holds no ``model`` entry (a bare ``state_dict``)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head and not head.startswith(b"PK") and not head.startswith(b"\x80"):  # neither zip nor legacy pickle
        return f"not a file torch.save wrote (it begins with {head!r})"
    if is_complete_checkpoint(path):
        with zipfile.ZipFile(path) as archive:
            if not any(name == "data.pkl" or name.endswith("/data.pkl") for name in archive.namelist()):
                return "a zip archive that torch.save did not write (no data.pkl in it)"
    elif not head.startswith(b"\x80"):  # a zip archive cut short: truncated, not another kind of file
        return None
    try:  # a complete zip, or a legacy pickle (torch before 1.6), which only a load can tell cut short
        state = read_checkpoint_structure(path)
    except Exception:  # noqa: BLE001 - unreadable for the safe loader: fairseq's own error stands
        return None
    if not isinstance(state, dict) or "model" not in state:
        keys = sorted(map(str, state)) if isinstance(state, dict) else []
        held = ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "") if keys else f"a {type(state).__name__}"
        return (f"a PyTorch file but not a fairseq checkpoint (no 'model' entry; it holds {held}: a bare "
                f"state_dict?)")
    return None


def typed_model_overrides(argv=None):
    """The dict typed after ``--model-overrides`` on this process's command line (``sys.argv``), or None when
    there is none or it is not a Python literal (fairseq then fails on it itself). fairseq-validate hands the
    loader every option of its command line as an override as well, so the loader's ``arg_overrides`` alone
    cannot tell what the user typed as a model override."""
    import ast
    import sys

    argv = sys.argv[1:] if argv is None else argv
    for i, arg in enumerate(argv):
        text = None
        if arg == "--model-overrides" and i + 1 < len(argv):
            text = argv[i + 1]
        elif arg.startswith("--model-overrides="):
            text = arg.split("=", 1)[1]
        if text is not None:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                return None
            return value if isinstance(value, dict) else None
    return None


def overwrite_args_by_name(cfg, overrides) -> None:
    """fairseq's ``overwrite_args_by_name`` (``fairseq/dataclass/utils.py``), as ``load_checkpoint_to_cpu`` calls
    it on a loaded checkpoint's configuration, after checking, in fairseq's loading tools and for a checkpoint of
    this plugin's model, the keys typed in ``--model-overrides`` against the configuration before they apply
    (:func:`fairseq_residual.config.check_override_keys`); other models' checkpoints, other callers and the
    options fairseq-validate adds to the overrides are left to fairseq.

    Raises:
        SettingError: a typed key nothing reads, with the closest known one.
    """
    from .config import check_override_keys
    from .model import ARCH_NAMES, ResidualTransformerModel
    from .user_errors import LOADING_TOOLS, running_tool

    model = cfg.get("model") if overrides else None
    arch = getattr(model, "arch", None) or getattr(model, "_name", None)
    typed = typed_model_overrides() if arch in ARCH_NAMES and running_tool() in LOADING_TOOLS else None
    if typed:
        check_override_keys({k: v for k, v in typed.items() if k in overrides}, cfg,
                            ResidualTransformerModel.known_model_keys())
    _stock_overwrite_args_by_name(cfg, overrides)


def _held(folder: str) -> str:
    found = [os.path.basename(p) for p in checkpoints_in(folder)]
    return (f"{folder} holds {', '.join(found[:6])}{', ...' if len(found) > 6 else ''} (newest first)" if found
            else f"{folder} holds no complete checkpoint")


_PATH_FIX = ("pass --path a checkpoint fairseq-train wrote (its --save-dir's checkpoint_best.pt or checkpoint_last.pt; "
             "several, separated by ':', form an ensemble)")


def _missing_message(path: str) -> str:
    """What to say of a ``--path`` that does not exist: the folder's complete checkpoints, or that the folder is
    missing or holds none."""
    folder = os.path.dirname(path) or "."
    where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
    held = _held(folder) if os.path.isdir(folder) else f"its folder {folder} does not exist either"
    return f"checkpoint {path}{where} does not exist: {held}; {_PATH_FIX}"


def folder_message(path: str, option: str = "--path") -> str:
    """What to say of a checkpoint ``option`` (``--path``, ``--checkpoint``) given a folder (a ``--save-dir``):
    the complete checkpoints it holds, and one of them as the path to pass (``checkpoint_best.pt`` if it is there,
    else the newest)."""
    found = [os.path.basename(p) for p in checkpoints_in(path)]
    if not found:
        return (f"{option} {path} is a folder, not a checkpoint, and it holds no complete checkpoint; pass {option} a "
                f"checkpoint fairseq-train wrote (its --save-dir's checkpoint_best.pt or checkpoint_last.pt)")
    pick = "checkpoint_best.pt" if "checkpoint_best.pt" in found else found[0]
    return (f"{option} {path} is a folder, not a checkpoint: {_held(path)}; pass {option} {os.path.join(path, pick)} "
            f"or another of them")


def load_model_ensemble_and_task(filenames, arg_overrides=None, task=None, strict=True, suffix="", num_shards=1,
                                 state=None):
    """fairseq's ``checkpoint_utils.load_model_ensemble_and_task``, through which fairseq-generate, -interactive
    and -validate load ``--path``, naming a missing local checkpoint with the checkpoints beside it (stock fairseq:
    ``OSError: Model file not found`` after a traceback). Sharded and remote checkpoints are left to fairseq.

    Raises:
        MissingFileError: a file of ``filenames`` does not exist.
        SettingError: a file of ``filenames`` is a folder (a ``--save-dir``); the message lists its checkpoints;
            or, in fairseq's loading tools, residual options typed on the command line, which fairseq ignores
            there (:func:`~fairseq_residual.config.typed_residual_options`).
    """
    _refuse_typed_model_options()
    if state is None and num_shards == 1 and not suffix:
        for path in filenames:
            if PathManager.path_requires_pathmanager(path):
                continue
            if os.path.isdir(path):
                raise SettingError(folder_message(path) + " (several, separated by ':', form an ensemble)")
            if not os.path.exists(path):
                raise MissingFileError(_missing_message(path))
    return _stock_load_model_ensemble_and_task(filenames, arg_overrides, task, strict, suffix, num_shards, state)


def _refuse_typed_model_options() -> None:
    """In fairseq's loading tools but fairseq-validate, refuse residual options typed on the command line: with
    ``--arch residual_transformer`` fairseq-generate parses them and then builds the model from the checkpoint's
    saved settings, so they would change nothing, without a word (fairseq-validate hands every option typed to
    the loader as an override, so there they apply, and are checked as ``--model-overrides`` are)."""
    from .user_errors import LOADING_TOOLS, running_tool

    if running_tool() not in LOADING_TOOLS or running_tool() == "fairseq-validate":
        return
    from .config import typed_residual_options

    typed = typed_residual_options()
    if typed:
        tool = running_tool()
        # the scheme and the norm are the checkpoint's weights' own: no override changes them
        keys = ", ".join(f"'{t[2:].replace('-', '_')}': ..." for t in typed
                         if t not in ("--residual-scheme", "--norm"))
        overrides = f", or change a setting at load with --model-overrides \"{{{keys}}}\"" if keys else ""
        raise SettingError(
            f"{' '.join(typed)}: {tool} builds the model from the checkpoint's saved settings and ignores model "
            f"options on its command line; drop {'it' if len(typed) == 1 else 'them'} (the checkpoint names its "
            f"scheme){overrides}")


def install():
    """Replace fairseq's checkpoint copy and loaders in ``fairseq.checkpoint_utils`` (idempotent; fairseq's
    ``load_model_ensemble`` and the CLIs look them up there when they call them)."""
    checkpoint_utils.PathManager = _AtomicCopyPathManager
    load_checkpoint.__wrapped_stock__ = _stock_load_checkpoint
    load_checkpoint_to_cpu.__wrapped_stock__ = _stock_load_checkpoint_to_cpu
    checkpoint_utils.load_checkpoint = load_checkpoint
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
    load_model_ensemble_and_task.__wrapped_stock__ = _stock_load_model_ensemble_and_task
    checkpoint_utils.load_model_ensemble_and_task = load_model_ensemble_and_task
    overwrite_args_by_name.__wrapped_stock__ = _stock_overwrite_args_by_name
    checkpoint_utils.overwrite_args_by_name = overwrite_args_by_name


install()

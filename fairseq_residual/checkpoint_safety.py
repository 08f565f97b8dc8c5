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
   the newest *complete* checkpoint of the save dir instead, if that is not ``checkpoint_last.pt``: a
   truncated ``checkpoint_last.pt`` (left by a kill under stock fairseq), a missing one (a kill before the
   first copy finished) or an older one (a kill between ``checkpointN.pt`` and its copy) would otherwise
   lose work or crash. A warning names the checkpoint used.
3. :func:`load_checkpoint_to_cpu`: a checkpoint that cannot be read because it was cut short raises
   :class:`TruncatedCheckpointError` naming the file, its size and the complete checkpoints beside it,
   instead of ``EOFError``.

Only the names inside ``fairseq.checkpoint_utils`` are replaced; nothing else of fairseq changes.
"""
import glob
import logging
import os
import pickle
import shutil
import zipfile

from fairseq import checkpoint_utils
from fairseq.file_io import PathManager

logger = logging.getLogger(__name__)

_stock_load_checkpoint = getattr(
    checkpoint_utils.load_checkpoint, "__wrapped_stock__", checkpoint_utils.load_checkpoint
)
_stock_load_checkpoint_to_cpu = getattr(
    checkpoint_utils.load_checkpoint_to_cpu, "__wrapped_stock__", checkpoint_utils.load_checkpoint_to_cpu
)


class TruncatedCheckpointError(RuntimeError):
    """A checkpoint file is incomplete (cut short while it was written), so it cannot be loaded."""


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


class _AtomicCopyPathManager(PathManager):
    """fairseq's ``PathManager`` with :func:`atomic_copy` as ``copy`` (used by ``checkpoint_utils`` only)."""

    copy = staticmethod(atomic_copy)


def newest_complete_checkpoint(save_dir: str, suffix: str = ""):
    """The checkpoint to resume from in ``save_dir``: the newest complete ``checkpoint*.pt``, or None."""
    found = checkpoints_in(save_dir, suffix)
    return found[0] if found else None


def load_checkpoint(cfg, trainer, **passthrough_args):
    """fairseq's ``checkpoint_utils.load_checkpoint``, resuming from the newest complete checkpoint.

    Only the default ``--restore-file checkpoint_last.pt`` is redirected; an explicit ``--restore-file``,
    ``--finetune-from-model`` on a first launch, and ``--continue-once`` are fairseq's. ``cfg.restore_file``
    is set back after loading, so the redirection is not saved into later checkpoints.
    """
    suffix = trainer.checkpoint_suffix or ""
    last = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
    if cfg.restore_file != "checkpoint_last.pt" or PathManager.path_requires_pathmanager(last):
        return _stock_load_checkpoint(cfg, trainer, **passthrough_args)
    newest = newest_complete_checkpoint(cfg.save_dir, suffix)
    if newest is None or os.path.abspath(newest) == os.path.abspath(last):
        if os.path.exists(last) and newest is None:
            raise TruncatedCheckpointError(
                f"{last} is incomplete ({os.path.getsize(last)} bytes; cut short while it was written) "
                f"and {cfg.save_dir} holds no complete checkpoint to resume from: move it away to train "
                f"from scratch, or point --save-dir elsewhere"
            )
        return _stock_load_checkpoint(cfg, trainer, **passthrough_args)
    if not os.path.exists(last) and getattr(cfg, "finetune_from_model", None):
        return _stock_load_checkpoint(cfg, trainer, **passthrough_args)
    why = (
        "is incomplete (cut short while it was written)" if os.path.exists(last) and not is_complete_checkpoint(last)
        else "is missing" if not os.path.exists(last)
        else "is older than it"
    )
    logger.warning(
        f"resuming from {newest}, the newest complete checkpoint in {cfg.save_dir}: {last} {why} "
        f"(a run killed while saving); nothing saved is lost"
    )
    original = cfg.restore_file
    cfg.restore_file = newest
    try:
        return _stock_load_checkpoint(cfg, trainer, **passthrough_args)
    finally:
        cfg.restore_file = original


def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
    """fairseq's ``checkpoint_utils.load_checkpoint_to_cpu``, naming a truncated file as such.

    Raises:
        TruncatedCheckpointError: ``path`` is a local file cut short (not a complete zip archive) and
            ``torch.load`` failed on it; the message lists the complete checkpoints beside it.
    """
    try:
        return _stock_load_checkpoint_to_cpu(path, arg_overrides, load_on_all_ranks)
    except (EOFError, OSError, RuntimeError, ValueError, pickle.UnpicklingError) as exc:
        if isinstance(exc, TruncatedCheckpointError) or PathManager.path_requires_pathmanager(path):
            raise
        if not os.path.isfile(path) or is_complete_checkpoint(path):
            raise
        others = [os.path.basename(p) for p in checkpoints_in(os.path.dirname(path) or ".")]
        hint = (f"complete checkpoints beside it, newest first: {', '.join(others)}" if others
                else "no complete checkpoint is beside it")
        raise TruncatedCheckpointError(
            f"checkpoint {path} is truncated ({os.path.getsize(path)} bytes; cut short while it was "
            f"written, e.g. by a kill during a save): load another one ({hint})"
        ) from exc


def install():
    """Replace fairseq's checkpoint copy and loaders in ``fairseq.checkpoint_utils`` (idempotent)."""
    checkpoint_utils.PathManager = _AtomicCopyPathManager
    load_checkpoint.__wrapped_stock__ = _stock_load_checkpoint
    load_checkpoint_to_cpu.__wrapped_stock__ = _stock_load_checkpoint_to_cpu
    checkpoint_utils.load_checkpoint = load_checkpoint
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


install()

"""A missing or wrong data directory named with its fix: the plugin's wrap of fairseq's
``TranslationTask.setup_task`` (``fairseq/tasks/translation.py``), which ``fairseq-train``, ``-hydra-train``,
``-generate``, ``-interactive`` and ``-validate`` call first, for ``--task translation`` and every task built on it
(this plugin's ``translation_with_grad_norms``).

Stock fairseq ends there on a bare ``FileNotFoundError`` (``os.listdir`` of the missing folder, while inferring the
language pair), on the missing dictionary's path, or on ``Could not infer language pair`` (dictionaries but no
binarized split), after a traceback of some 40 lines; and, from ``TranslationTask.load_dataset``, on ``Dataset not
found: valid`` (a split fairseq-preprocess was not given).
"""
import functools
import os

from fairseq import utils
from fairseq.tasks.translation import TranslationTask

from .user_errors import UserInputError

FIX = "pass the --destdir of fairseq-preprocess (task.data=<path> under fairseq-hydra-train)"


class DataDirectoryError(UserInputError, FileNotFoundError):
    """The data directory fairseq was given is missing, a file, or not what fairseq-preprocess writes."""


def check_data_dir(cfg) -> None:
    """Check the first folder of fairseq's ``cfg.data`` (``os.pathsep``-separated shards), the one
    ``setup_task`` reads the dictionaries from, before it does; the other shards are read when the training split
    loads (a machine that only translates may hold the first alone), and paths with a URL scheme (``s3://``, ...)
    are left to fairseq.

    Raises:
        DataDirectoryError (a ``FileNotFoundError``): no data directory given (None or empty: Hydra's required
            ``task.data`` not set); the first folder does not exist, is a file, or lacks the
            ``dict.<lang>.txt`` of ``--source-lang`` / ``--target-lang`` (or any dictionary, when they are not
            given), naming the folder, what it holds and the fix.
    """
    data = getattr(cfg, "data", None)
    if not data:  # Hydra's required task.data left at ??? arrives as None; stock fairseq: a TypeError in split_paths
        raise DataDirectoryError(f"no data directory given: {FIX}")
    first = utils.split_paths(data)[0]
    if "://" in first:
        return
    if not os.path.isdir(first):
        where = "" if os.path.isabs(first) else f" (relative to {os.getcwd()})"
        what = "is a file, not a folder" if os.path.exists(first) else "does not exist"
        raise DataDirectoryError(f"data directory {first}{where} {what}: {FIX}")
    held = sorted(os.listdir(first))
    dicts = [name for name in held if name.startswith("dict.") and name.endswith(".txt")]
    langs = [lang for lang in (getattr(cfg, "source_lang", None), getattr(cfg, "target_lang", None)) if lang]
    missing = [f"dict.{lang}.txt" for lang in langs if f"dict.{lang}.txt" not in held]
    if missing or not dicts:
        lacks = ", ".join(missing) if missing else "dictionary (dict.<lang>.txt)"
        raise DataDirectoryError(f"data directory {first} has no {lacks} (it holds: {_shown(held)}): it is not what "
                                f"fairseq-preprocess writes for this language pair; {FIX}, or give the "
                                f"--source-lang / --target-lang its dictionaries are named after")
    pair = [name for name in held if len(name.split(".")) >= 3 and len(name.split(".")[1].split("-")) == 2]
    if len(langs) < 2 and not pair:  # fairseq infers the pair from such a file: "Could not infer language pair"
        raise DataDirectoryError(f"data directory {first} holds no binarized split (<split>.<src>-<tgt>.<lang>.bin "
                                f"and .idx; it holds: {_shown(held)}) to infer the language pair from: give "
                                f"--source-lang / --target-lang (task.source_lang / task.target_lang; "
                                f"fairseq-interactive needs only the dictionaries), or, to train or score, binarize "
                                f"the text into it "
                                f"(fairseq-preprocess did not finish, or was given no --trainpref / --validpref / "
                                f"--testpref)")


def _shown(held) -> str:
    """The first eight names of a folder's listing, for a message."""
    return ", ".join(held[:8]) + (", ..." if len(held) > 8 else "") if held else "nothing"


def _wrap_load_dataset(load_dataset):
    """``TranslationTask.load_dataset``, naming a missing split (stock: ``FileNotFoundError: Dataset not found:
    valid (path)``) with the folder's contents and the fix."""
    @functools.wraps(load_dataset)
    def wrapped(self, split, *args, **kwargs):
        try:
            return load_dataset(self, split, *args, **kwargs)
        except FileNotFoundError as exc:
            if isinstance(exc, UserInputError) or not str(exc).startswith("Dataset not found:"):
                raise
            prefix = f"Dataset not found: {split} ("
            text = str(exc)
            folder = text[len(prefix):-1] if text.startswith(prefix) and text.endswith(")") else None
            held = sorted(os.listdir(folder)) if folder and os.path.isdir(folder) else []
            stock = {"train": "--trainpref", "valid": "--validpref", "test": "--testpref"}
            how = (f"fairseq-preprocess {stock[split]}" if split in stock
                   else "a second, comma-separated fairseq-preprocess --validpref (it writes valid1, valid2, ...)"
                   if split.rstrip("0123456789") == "valid" and split != "valid"
                   else "fairseq-preprocess, whose --trainpref / --validpref / --testpref write train, valid, test")
            raw = getattr(self.cfg, "dataset_impl", None) == "raw"
            files = "<split>.<src>-<tgt>.<lang>, text (--dataset-impl raw)" if raw else "<split>.<src>-<tgt>.<lang>.bin and .idx"
            how = how + ", with --dataset-impl raw" if raw else how
            raise DataDirectoryError(
                f"data directory {folder or self.cfg.data} has no '{split}' split ({files}; it holds: "
                f"{_shown(held)}): binarize it with {how}, or choose a split it has (--valid-subset, --gen-subset)"
            ) from None

    wrapped._residual_data_checks = True
    return wrapped


def _wrap(setup_task):
    @functools.wraps(setup_task)
    def wrapped(cls, cfg, **kwargs):
        check_data_dir(cfg)
        return setup_task.__func__(cls, cfg, **kwargs)

    wrapped._residual_data_checks = True
    return classmethod(wrapped)


if not getattr(TranslationTask.setup_task, "_residual_data_checks", False):
    TranslationTask.setup_task = _wrap(TranslationTask.setup_task)
if not getattr(TranslationTask.load_dataset, "_residual_data_checks", False):
    TranslationTask.load_dataset = _wrap_load_dataset(TranslationTask.load_dataset)

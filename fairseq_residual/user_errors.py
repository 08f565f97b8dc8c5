"""A wrong input reported as one message, not a traceback: the plugin's errors that name what the user gave and
its fix (a residual option out of range, a checkpoint of another scheme or ``--norm``, a save dir of another
model, a cut-short checkpoint, a missing data directory) end fairseq's command-line tools (``fairseq-train``,
``-generate``, ``-interactive``, ``-validate``) as ``fairseq-train: error: <message>`` on stderr and exit status 1,
where Python would print the message at the foot of a 30-50 line traceback through fairseq's code.

Hydra's convention: ``FAIRSEQ_RESIDUAL_FULL_ERROR=1`` prints the whole traceback again (Hydra's own
``HYDRA_FULL_ERROR``). Every other exception, and every program that is not one of those tools (a notebook, a
user's script importing the plugin), keeps Python's report unchanged. ``fairseq-hydra-train`` is left to Hydra,
which prints them briefly (and in full with ``HYDRA_FULL_ERROR=1``); ``--distributed-world-size`` > 1 on one
machine re-raises a worker's exception in the parent as torch's ``ProcessRaisedException``, which keeps its
traceback; fairseq-train's ``--restore-file`` wraps a checkpoint's errors in its own exception, also kept.
"""
import os
import sys

#: the environment variable that restores Python's full traceback
FULL_ERROR_VAR = "FAIRSEQ_RESIDUAL_FULL_ERROR"


class UserInputError(Exception):
    """Base of the plugin's errors about the user's input (an option, a checkpoint, a folder), each of whose
    messages names the input and its fix. Subclasses also derive from the builtin exception a caller would catch
    (``ValueError``, ``FileNotFoundError``, ``RuntimeError``)."""


class MissingFileError(UserInputError, FileNotFoundError):
    """A file an option names (a checkpoint, a profile) does not exist."""


class SettingError(UserInputError, ValueError):
    """An option or Hydra key the run cannot honour (out of range, in conflict with the residual scheme or with
    another option), or a file or checkpoint given by one that does not fit the model; the message names the
    option and the fix."""


def tool_name(argv0: str):
    """``fairseq-<tool>`` for fairseq's console scripts (``fairseq-train``, ...) and ``python -m
    fairseq_cli.<tool>``; None for any other program, and for ``fairseq-hydra-train``, whose errors Hydra reports
    (with ``HYDRA_FULL_ERROR=1``, the full traceback the user asked for)."""
    argv0 = argv0 or ""
    name = os.path.basename(argv0)
    if os.path.basename(os.path.dirname(argv0)) == "fairseq_cli" and name.endswith(".py"):
        name = "fairseq-" + name[:-3].replace("_", "-")
    if not name.startswith("fairseq-") or name.startswith("fairseq-hydra-train"):
        return None
    return name


def report(exc: BaseException, program: str, stream) -> bool:
    """Write one line, ``<program>: error: <message>`` and the way back to the traceback, to ``stream`` if ``exc``
    is a :class:`UserInputError` and ``FAIRSEQ_RESIDUAL_FULL_ERROR`` is not ``1``; returns whether it did. One
    line, so that what reads a log's last line (the studies' failure reasons, a SLURM log's tail) reads all of it."""
    if not isinstance(exc, UserInputError) or os.environ.get(FULL_ERROR_VAR) == "1":
        return False
    stream.write(f"{program}: error: {exc} ({FULL_ERROR_VAR}=1 shows the traceback)\n")
    stream.flush()
    return True


def install() -> None:
    """Put :func:`report` in front of ``sys.excepthook`` in fairseq's command-line tools (once per process)."""
    program = tool_name(sys.argv[0] if sys.argv else "")
    if program is None or getattr(sys.excepthook, "_residual_user_errors", False):
        return
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if not report(exc, program, sys.stderr):
            previous(exc_type, exc, tb)

    hook._residual_user_errors = True
    sys.excepthook = hook

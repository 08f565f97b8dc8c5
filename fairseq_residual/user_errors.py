"""A wrong input reported as one message, not a traceback: the plugin's errors that name what the user gave and
its fix (a residual option out of range, a checkpoint of another scheme or ``--norm``, a save dir of another
model, a cut-short checkpoint, a missing data directory) end fairseq's command-line tools (``fairseq-train``,
``-generate``, ``-interactive``, ``-validate``) as ``fairseq-train: error: <message>`` on stderr and exit status 1,
where Python would print the message at the foot of a 30-50 line traceback through fairseq's code.

Hydra's convention: ``FAIRSEQ_RESIDUAL_FULL_ERROR=1`` prints the whole traceback again (Hydra's own
``HYDRA_FULL_ERROR``). Every other exception, and every program that is not one of fairseq's tools (a notebook, a
user's script importing the plugin), keeps Python's report unchanged. ``fairseq-hydra-train`` reports exceptions
through Hydra, which already prints them briefly; ``--distributed-world-size`` > 1 on one machine re-raises a
worker's exception in the parent as torch's ``ProcessRaisedException``, which keeps its traceback.
"""
import os
import sys

#: the environment variable that restores Python's full traceback
FULL_ERROR_VAR = "FAIRSEQ_RESIDUAL_FULL_ERROR"


class UserInputError(Exception):
    """Base of the plugin's errors about the user's input (an option, a checkpoint, a folder), each of whose
    messages names the input and its fix. Subclasses also derive from the builtin exception a caller would catch
    (``ValueError``, ``FileNotFoundError``, ``RuntimeError``)."""


class SettingError(UserInputError, ValueError):
    """An option or Hydra key the run cannot honour (out of range, in conflict with the residual scheme or with
    another option), or a file or checkpoint given by one that does not fit the model; the message names the
    option and the fix."""


def is_fairseq_tool(argv0: str) -> bool:
    """True for fairseq's console scripts (``fairseq-train``, ...) and ``python -m fairseq_cli.<tool>``."""
    name = os.path.basename(argv0 or "")
    return name.startswith("fairseq-") or os.path.basename(os.path.dirname(argv0 or "")) == "fairseq_cli"


def report(exc: BaseException, program: str, stream) -> bool:
    """Write one line, ``<program>: error: <message>`` and the way back to the traceback, to ``stream`` if ``exc``
    is a :class:`UserInputError` and ``FAIRSEQ_RESIDUAL_FULL_ERROR`` is unset or ``0``; returns whether it did. One
    line, so that what reads a log's last line (the studies' failure reasons, a SLURM log's tail) reads all of it."""
    if not isinstance(exc, UserInputError) or os.environ.get(FULL_ERROR_VAR, "0") not in ("", "0"):
        return False
    stream.write(f"{program}: error: {exc} ({FULL_ERROR_VAR}=1 shows the traceback)\n")
    stream.flush()
    return True


def install() -> None:
    """Put :func:`report` in front of ``sys.excepthook`` in fairseq's command-line tools (once per process)."""
    if not is_fairseq_tool(sys.argv[0] if sys.argv else "") or getattr(sys.excepthook, "_residual_user_errors", False):
        return
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if not report(exc, os.path.basename(sys.argv[0]), sys.stderr):
            previous(exc_type, exc, tb)

    hook._residual_user_errors = True
    sys.excepthook = hook

"""A wrong input reported as one message, not a traceback: the plugin's errors that name what the user gave and
its fix (a residual option out of range, a checkpoint of another scheme or ``--norm``, a save dir of another
model, a cut-short checkpoint, a missing data directory, a ``--hc-compile`` this machine cannot honour) end
fairseq's command-line tools (``fairseq-train``, ``-generate``, ``-interactive``, ``-validate``) as
``fairseq-train: error: <message>`` on stderr and exit status 1, where Python would print the message at the foot
of a 30-50 line traceback through fairseq's code.

Two ways fairseq hands such an error on are read through: fairseq-train's ``--restore-file`` wraps a checkpoint's
errors in a bare ``Exception`` ("Cannot load model parameters from checkpoint ..."), reported as the plugin's
message with fairseq's after it; ``--distributed-world-size`` > 1 on one machine runs the workers under
``torch.multiprocessing.spawn``, which re-raises a worker's exception in the parent as ``ProcessRaisedException``
carrying only the worker's traceback as text, whose last exception line names the plugin's error class.

Hydra's convention: ``FAIRSEQ_RESIDUAL_FULL_ERROR=1`` prints the whole traceback again (Hydra's own
``HYDRA_FULL_ERROR``). Every other exception, and every program that is not one of those tools (a notebook, a
user's script importing the plugin), keeps Python's report unchanged. ``fairseq-hydra-train`` is left to Hydra,
which prints the message alone after its ``Error executing job with overrides: [...]`` line (the errors are
Hydra ``CompactHydraException``s; in full with ``HYDRA_FULL_ERROR=1``); fairseq's trainer's wrapping of a
checkpoint's error and a spawned worker's error reach Hydra as other exceptions and keep its traceback.
"""
import contextlib
import importlib
import io
import os
import re
import sys

#: the environment variable that restores Python's full traceback
FULL_ERROR_VAR = "FAIRSEQ_RESIDUAL_FULL_ERROR"
#: fairseq's tools that load a trained model (they read its settings from the checkpoint; ``--model-overrides``
#: changes them)
LOADING_TOOLS = ("fairseq-generate", "fairseq-interactive", "fairseq-validate", "fairseq-eval-lm", "fairseq-score")


try:  # fairseq depends on hydra-core; without it nothing reports through Hydra
    from hydra.errors import CompactHydraException as _BriefInHydra
except ImportError:  # pragma: no cover
    _BriefInHydra = Exception


class UserInputError(_BriefInHydra):
    """Base of the plugin's errors about the user's input (an option, a checkpoint, a folder), each of whose
    messages names the input and its fix. Subclasses also derive from the builtin exception a caller would catch
    (``ValueError``, ``FileNotFoundError``, ``RuntimeError``). A Hydra ``CompactHydraException`` too, Hydra's
    class for errors reported by their message alone: fairseq-hydra-train prints the message without a traceback
    (``hydra/_internal/utils.py``, ``run_and_report``; ``HYDRA_FULL_ERROR=1`` shows it)."""


class MissingFileError(UserInputError, FileNotFoundError):
    """A file an option names (a checkpoint, a profile) does not exist."""


class UnavailableHereError(UserInputError, RuntimeError):
    """An option this machine or installation cannot honour (``--hc-compile`` where ``torch.compile`` cannot run);
    the message names the option, why, and the fix."""


class SettingError(UserInputError, ValueError):
    """An option or Hydra key the run cannot honour (out of range, in conflict with the residual scheme or with
    another option), or a file or checkpoint given by one that does not fit the model; the message names the
    option and the fix."""


def _program(argv0: str) -> str:
    """The program's name, ``fairseq-<tool>`` for ``python -m fairseq_cli.<tool>`` as for fairseq's console
    scripts."""
    argv0 = argv0 or ""
    name = os.path.basename(argv0)
    if os.path.basename(os.path.dirname(argv0)) == "fairseq_cli" and name.endswith(".py"):
        name = "fairseq-" + name[:-3].replace("_", "-")
    return name


def tool_name(argv0: str):
    """``fairseq-<tool>`` for fairseq's console scripts (``fairseq-train``, ...) and ``python -m
    fairseq_cli.<tool>``; None for any other program, and for ``fairseq-hydra-train``, whose errors Hydra reports
    (with ``HYDRA_FULL_ERROR=1``, the full traceback the user asked for)."""
    name = _program(argv0)
    if not name.startswith("fairseq-") or name.startswith("fairseq-hydra-train"):
        return None
    return name


#: the exception line of a plugin error class in a worker's traceback text (``traceback.format_exc()``)
_TRACE_LINE = re.compile(r"^(fairseq_residual(?:\.\w+)*)\.(\w+): ")
#: where Python's traceback text goes on to a chained exception
_CHAINED = ("\n\nDuring handling of the above exception", "\n\nThe above exception was the direct cause")


def _user_error_class(module: str, name: str):
    try:
        cls = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return cls if isinstance(cls, type) and issubclass(cls, UserInputError) else None


def _from_worker_trace(trace: str):
    """The message of the plugin error a worker's traceback text (torch's ``ProcessRaisedException``) ends on, or
    None: its last exception line must name a :class:`UserInputError` class, or be a bare ``Exception`` (fairseq's
    wrapper) raised while handling one."""
    sections = trace.rstrip("\n")
    for marker in _CHAINED:
        sections = sections.replace(marker, "\0")
    sections = sections.split("\0")
    if len(re.findall(r"(?m)^Traceback \(most recent call last\):$", trace)) != len(sections):
        return None  # a header inside a message: the text's structure cannot be read safely
    found, wrapped = None, False
    for section in sections:  # each: a traceback (indented frames), then the exception's line(s)
        lines = section.split("\n")
        top = next((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")), None)
        if top is None:
            return None
        start = next((i for i in range(top + 1, len(lines)) if lines[i] and not lines[i][0].isspace()), None)
        if start is None:
            return None
        head, _, message = lines[start].partition(": ")
        message = "\n".join([message, *lines[start + 1:]]).strip("\n")
        match = _TRACE_LINE.match(head + ": ")
        if match and _user_error_class(match.group(1), match.group(2)):
            found, wrapped = message, False
        elif head == "Exception" and found is not None and not wrapped:
            found, wrapped = _wrapped(found, message), True
        else:
            found = None
    return found


def _wrapped(message: str, wrapper: str) -> str:
    return f"{message} (fairseq: {wrapper})" if wrapper else message


def _one_line(message: str) -> str:
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def _model_overrides_unreadable() -> bool:
    """Whether this command line has a ``--model-overrides`` whose text is no Python dict literal (so that a
    SyntaxError or NameError of other code, a ``--user-dir`` module's say, is not blamed on a valid one)."""
    from .checkpoint_safety import typed_model_overrides

    return any(a.startswith("--model-overrides") for a in sys.argv) and typed_model_overrides() is None


def _stock_message(exc: BaseException):
    """The one-line report for a stock fairseq failure whose own message is cryptic, or None: ``KeyError: None`` at
    ``TASK_REGISTRY[args.task]`` in ``fairseq/options.py`` (``fairseq-validate`` has no default ``--task``); a bare
    ``RuntimeError()`` there (no ``--arch``); a ``--model-overrides`` that is no Python dict literal (fairseq's
    tools evaluate it: ``ValueError: malformed node or string``, or fairseq-validate's ``eval``: ``NameError``);
    the ``AssertionError`` of fairseq-train or fairseq-validate without ``--max-tokens`` or ``--batch-size``;
    fairseq-train's non-finite gradients (:func:`_nan_gradients`), whose traceback ends on a ``StopIteration``;
    numpy's ``offset must be ... no greater than buffer length`` reading a binarized file cut short."""
    if _nan_gradients(exc):
        lr, warm, clip, save = (("optimization.lr=[...]", "lr_scheduler=inverse_sqrt "
                                 "lr_scheduler.warmup_updates=4000", "optimization.clip_norm=1.0",
                                 "checkpoint.save_dir") if in_hydra_train() else
                                ("--lr", "--lr-scheduler inverse_sqrt --warmup-updates 4000", "--clip-norm 1.0",
                                 "--save-dir"))
        return (f"the gradients became NaN or Inf: training diverged (fairseq's NaN detector names above the first "
                f"module whose output was not finite, and crash.pt in the save dir holds the model before that "
                f"step). Lower {lr}, add a warm-up ({warm}), clip gradients ({clip}), or use a scheme that trains at "
                f"this depth (see the README's \"Which scheme should I use?\"); the same command resumes from the "
                f"newest checkpoint in the save dir, if one was saved: give a fresh {save} to start over")
    frames, binarized = [], None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((os.path.basename(os.path.dirname(code.co_filename)), os.path.basename(code.co_filename),
                       code.co_name))
        if frames[-1][1] == "indexed_dataset.py" and binarized is None:  # the dataset reading a .bin file
            binarized = getattr(tb.tb_frame.f_locals.get("self"), "_path", None)
        tb = tb.tb_next
    if not frames:
        return None
    where = frames[-1]
    if type(exc) is ValueError and "no greater than buffer length" in str(exc) and binarized:
        return (f"the binarized file {binarized}.bin is shorter than its index ({binarized}.idx) says: cut short "
                f"(a kill, a full disk, an incomplete copy) after fairseq-preprocess wrote it; binarize the text "
                f"again with fairseq-preprocess")
    if type(exc) is KeyError and exc.args == (None,) and where == ("fairseq", "options.py", "parse_args_and_arch"):
        return ("no --task given, and this tool has no default task: add the task the model was trained with "
                "(--task translation for this plugin's translation models), with --max-tokens 4096 or --batch-size")
    if type(exc) is RuntimeError and not exc.args and where == ("fairseq", "options.py", "parse_args_and_arch"):
        return ("no --arch given (or one no model registers): add --arch residual_transformer, or one of its "
                "presets (fairseq-train --user-dir fairseq_residual --help lists them)")
    from_cli = any(d == "fairseq_cli" for d, _, _ in frames)
    if from_cli and type(exc) in (ValueError, SyntaxError, NameError) and _model_overrides_unreadable() and (
            type(exc) is not ValueError or str(exc).startswith("malformed node or string")):
        detail = "" if type(exc) is ValueError else f" ({type(exc).__name__}: {exc})"
        return (f"--model-overrides is not a Python dict literal{detail}: quote its keys and string values, the "
                f"whole in double quotes for the shell: --model-overrides \"{{'data': '/path/to/bin', 'dropout': "
                f"0.1}}\"")
    if type(exc) is AssertionError and str(exc).startswith("Must specify batch size") and from_cli:
        other = _model_option_refusal() if running_tool() == "fairseq-train" else None
        return (f"no batch size given: add --max-tokens 4096 (or --batch-size N), as "
                f"{running_tool() or 'this fairseq tool'} has no default"
                + (f"; the model options will be refused next: {other}" if other else ""))
    return None


def _nan_gradients(exc: BaseException) -> bool:
    """Whether fairseq's trainer stopped on non-finite gradients (``FloatingPointError: gradients are Nan/Inf``),
    as ``exc`` or what it was raised while handling: fairseq re-runs the step under its ``NanDetector`` to log
    where, and torch's backward hooks can fail there on a module whose output holds no tensor (``StopIteration``),
    which then ends the process instead."""
    seen = 0
    while exc is not None and seen < 8:
        if type(exc) is FloatingPointError and str(exc).startswith("gradients are Nan/Inf"):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _model_option_refusal():
    """What building this fairseq-train command line's ``residual_transformer`` model would refuse (an option of
    another scheme, an out-of-range value: :func:`~fairseq_residual.config.residual_options`' message), or None
    (nothing, another model, or a command line that does not parse). fairseq-train asserts its batch size before
    it builds the model, so without this a user meets the two errors one after the other."""
    try:
        from fairseq import options
        from fairseq.models import ARCH_MODEL_REGISTRY

        from .model import ResidualTransformerModel

        with contextlib.redirect_stderr(io.StringIO()):  # a parse error here is not this report's to print
            args = options.parse_args_and_arch(options.get_training_parser(), input_args=sys.argv[1:])
    except BaseException:  # noqa: BLE001 - argparse's SystemExit, anything else: the batch size is the news
        return None
    if not issubclass(ARCH_MODEL_REGISTRY.get(args.arch, object), ResidualTransformerModel):
        return None
    try:
        ResidualTransformerModel.checked_options(args)
    except UserInputError as refusal:  # OptionError, SettingError: the refusals, each naming its fix
        return _one_line(str(refusal))
    except Exception:  # noqa: BLE001 - not a refusal of the options: the batch size is the news
        return None
    return None


def user_message(exc: BaseException):
    """The one-line report for ``exc`` (a message's lines joined), or None when Python's traceback should stand:
    the message of a :class:`UserInputError`; of one that a bare ``Exception`` was raised from or while handling
    (fairseq's trainer wraps a checkpoint's errors so; not ``raise ... from None``), followed by the wrapper's
    message; of one that ended a worker of ``torch.multiprocessing.spawn`` (its ``ProcessRaisedException``
    carries the worker's traceback as text), alone or under one such wrapper; a stock fairseq failure that
    :func:`_stock_message` rewords."""
    if isinstance(exc, UserInputError):
        return _one_line(str(exc))
    if type(exc) is Exception:
        inner = exc.__cause__ if exc.__cause__ is not None or exc.__suppress_context__ else exc.__context__
        if isinstance(inner, UserInputError):
            return _one_line(_wrapped(str(inner), str(exc)))
        return None
    if type(exc).__name__ == "ProcessRaisedException" and exc.args:
        message = _from_worker_trace(str(exc.args[0]))
        return None if message is None else _one_line(message)
    return _stock_message(exc)


def closest(name: str, known, cutoff: float = 0.6):
    """The name of ``known`` closest to ``name`` (a misspelt option or key), or None (difflib's ratio below
    ``cutoff``); compared without case (``Pre_LN`` is ``pre_ln``, which difflib's ratio of 0.5 would miss).
    Among the names above the cutoff, the fewest typing edits win (:func:`edits`: ``adma`` is one swap from
    ``adam``, which difflib's ratio ranks below ``adamax``), then difflib's ratio."""
    import difflib

    known = list(known)
    by_lower = {}
    for k in known:
        by_lower.setdefault(k.lower(), k)
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=5, cutoff=cutoff)
    if not close:
        return None
    return by_lower[min(close, key=lambda k: (edits(name.lower(), k), close.index(k)))]


def edits(a: str, b: str) -> int:
    """The number of one-character insertions, deletions, substitutions and swaps of neighbours that turn ``a``
    into ``b`` (the optimal string alignment distance, Damerau's variant of Levenshtein's)."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def long_options(parser):
    """Every ``--option`` string an argparse parser accepts."""
    return [o for action in parser._actions for o in action.option_strings if o.startswith("--")]


def running_tool():
    """:func:`tool_name` of this process (None outside fairseq's command-line tools)."""
    return tool_name(sys.argv[0] if sys.argv else "")


def in_hydra_train() -> bool:
    """Whether this process is ``fairseq-hydra-train`` (or ``python -m fairseq_cli.hydra_train``)."""
    return _program(sys.argv[0] if sys.argv else "").startswith("fairseq-hydra-train")


def in_hydra_sweep() -> bool:
    """Whether this process runs a job of a Hydra multirun (``fairseq-hydra-train -m``): its jobs share every
    setting the sweep does not vary, a ``checkpoint.save_dir`` too unless it interpolates a swept key."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    except Exception:  # noqa: BLE001 - no Hydra, or a Hydra without run modes: not a sweep
        return False


def advice_for_this_tool(loading: str, training: str) -> str:
    """The fix a message gives: ``loading`` in fairseq's loading tools (:data:`LOADING_TOOLS`), ``training`` in
    fairseq-train (and fairseq-hydra-train, whose name Hydra keeps from :func:`tool_name`), both, each named,
    in any other program."""
    tool = running_tool()
    if tool in LOADING_TOOLS:
        return loading
    if tool == "fairseq-train" or in_hydra_train():
        return training
    return f"fairseq-generate, -interactive and -validate: {loading}; fairseq-train: {training}"


def report(exc: BaseException, program: str, stream) -> bool:
    """Write one line, ``<program>: error: <message>`` (:func:`user_message`) and the way back to the traceback,
    to ``stream`` unless ``FAIRSEQ_RESIDUAL_FULL_ERROR`` is ``1``; returns whether it did. One line, so that what
    reads a log's last line (the studies' failure reasons, a SLURM log's tail) reads all of it. A
    ``KeyboardInterrupt`` (Ctrl-C) is reported as an interruption, with fairseq-train's way to resume (Python
    still exits through SIGINT, status 130 in a shell)."""
    if os.environ.get(FULL_ERROR_VAR) == "1":
        return False
    if isinstance(exc, KeyboardInterrupt):  # Ctrl-C: not an error, and its traceback says nothing to the user
        resume = ("; the same command resumes from the newest complete checkpoint in its --save-dir (the updates "
                  "since that save are trained again)" if program == "fairseq-train" else "")
        stream.write(f"{program}: interrupted (Ctrl-C){resume}\n")
        stream.flush()
        return True
    message = user_message(exc)
    if message is None:
        return False
    stream.write(f"{program}: error: {message} ({FULL_ERROR_VAR}=1 shows the traceback)\n")
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

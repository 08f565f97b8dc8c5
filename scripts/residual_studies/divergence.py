"""The one rule, for the whole project, that says a training run diverged.

A run **diverged** when

1. its log shows a sign of numerical blow-up (:data:`SIGNS`): a NaN/inf loss, NaN/Inf gradients
   (fairseq's ``FloatingPointError``), fp16's "Minimum loss scale reached", a fatal gradient norm or
   limit "exceeded", or "NaN detected" (:func:`log_sign`); or
2. its validation loss is not a finite number, or its valid nll loss is above ``log2(|V|)`` bits, the
   loss of a uniform guess over the vocabulary, while its training loss did not fall, when the caller knows
   the vocabulary and the first and last training losses (:func:`loss_sign`): a model a few updates old
   starts above the uniform guess (its random logits are worse than uniform) and is merely untrained.

The reason names the sign and quotes the **last** log line showing it (the exception's message rather
than the source line that raised it). Both the depth study (one training process it ran, with its exit
status) and the benchmark tables (run directories on disk: :func:`run_dir_divergence`) apply this rule; a run
that failed without any of these signs failed for another reason (out of memory, a wrong option, a lost node,
...): :func:`run_dir_failure` names a crash that left no ``checkpoint_last.pt`` by its error line, and the tables
count it as failed, not diverged.
"""
import glob
import math
import os
import re

#: (reason, pattern) of the log lines that mark a diverged run, first match wins for a line
SIGNS = (
    ("nan/inf loss", re.compile(r"""\bloss["']?\s*[=:|]?\s*["']?[-+]?(nan|inf)\b""", re.I)),
    ("NaN/Inf gradients (FloatingPointError)", re.compile(r"FloatingPointError")),
    ("NaN/Inf gradients", re.compile(r"gradients are Nan/Inf")),
    ("fp16 minimum loss scale reached", re.compile(r"Minimum loss scale reached")),
    ("fatal: limit exceeded", re.compile(r"(fatal|norm|limit)\b.*\bexceeded", re.I)),
    ("NaN detected", re.compile(r"NaN detected")),
)
#: a crash (in a log that may also hold an earlier, finished training): Python's traceback, Hydra's and torchrun's
#: reports, or the one-line report of the plugin's errors about the user's input (fairseq_residual/user_errors.py)
CRASH = re.compile(r"^Traceback \(most recent call last\)|Error executing job|ChildFailedError|^fairseq-[\w-]+: error: ")
DONE = re.compile(r"done training in")
#: the line naming a crash's error: an exception's (``[module.]NameError: message``; ``...Exception``,
#: ``...Interrupt``) or the plugin's one-line report (``fairseq-train: error: ...``)
ERROR_LINE = re.compile(r"^(?:[\w.]*(?:Error|Exception|Interrupt)\b.*|fairseq-[\w-]+: error: .*)$")
#: Hydra's first line about a failed job; the next line is the error's message when Hydra reports it by its message
#: alone (the plugin's errors about the user's input), else ``Traceback ...``
HYDRA_JOB = re.compile(r"^Error executing job with overrides")
#: the logs of a run directory that training writes (not the evaluation's)
LOG_GLOBS = ("hydra_train.log", "train.log", "slurm-*.out", "*.log")


def line_sign(line):
    """The reason of the first sign in :data:`SIGNS` that ``line`` shows, or None."""
    for reason, pattern in SIGNS:
        if pattern.search(line):
            return reason
    return None


def log_sign(lines):
    """``(reason, line)`` for the last line of ``lines`` (an iterable or a text) showing a sign of
    divergence, or None."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    found = None
    for line in lines:
        reason = line_sign(line)
        if reason:
            found = (reason, line.strip())
    return found


def loss_sign(nll, vocab=None, train_losses=None):
    """Why the valid nll loss ``nll`` (bits per token) shows divergence, or None; ``vocab``: the
    dictionary size; ``train_losses``: the run's first and last logged training loss (no uniform-guess
    check without both, nor while the training loss is falling)."""
    if nll is None:
        return None
    if not math.isfinite(nll):
        return f"valid nll loss is {nll}"
    first, last = train_losses or (None, None)
    if vocab and first is not None and last is not None:
        uniform = math.log2(vocab)
        if nll > uniform and not last < first:
            return (f"loss exploded: valid nll loss {nll:.2f} bits > uniform guess "
                    f"log2({vocab}) = {uniform:.2f} bits, training loss {first:.2f} -> {last:.2f}")
    return None


def log_files(run_dir):
    """The run's training logs (not the evaluation's), per :data:`LOG_GLOBS`."""
    seen = []
    for pattern in LOG_GLOBS:
        for path in sorted(glob.glob(os.path.join(run_dir, pattern))):
            if path not in seen and os.path.isfile(path):
                seen.append(path)
    return seen


def run_dir_divergence(run_dir):
    """Why the run in ``run_dir`` diverged (a short reason: the sign and the log line), or None: the signs of
    :data:`SIGNS` anywhere in its training logs."""
    for path in log_files(run_dir):
        with open(path, encoding="utf-8", errors="replace") as f:
            sign = log_sign(f.read().splitlines())
        if sign:
            return f"{sign[0]} ({os.path.basename(path)}: {sign[1][:120]})"
    return None


def run_dir_failure(run_dir):
    """Why the run in ``run_dir`` stopped without diverging, or None: a crash (a traceback, Hydra's or torchrun's
    report, or the plugin's one-line error, after a log's last 'done training') that left no
    ``checkpoint_last.pt``, named by the last error line after it (:data:`ERROR_LINE`, or the message Hydra prints
    alone after :data:`HYDRA_JOB`; torchrun's
    ``ChildFailedError`` only when no worker's error is in the log). Check :func:`run_dir_divergence` first: a
    diverged run may crash too."""
    error = None
    for path in log_files(run_dir):
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        crashed_at = done_at = -1
        for position, line in enumerate(lines):
            if CRASH.search(line):
                crashed_at = position
            if DONE.search(line):
                done_at = position
        if crashed_at > done_at:
            found = []
            for position in range(crashed_at, len(lines)):
                line = lines[position].strip()
                if HYDRA_JOB.match(line):  # the message on the next line, or a traceback whose error comes later
                    message = next((later.strip() for later in lines[position + 1:] if later.strip()), "")
                    if message and not message.startswith("Traceback"):
                        found.append(message)
                elif ERROR_LINE.match(line):
                    found.append(line)
            named = [line for line in found if "ChildFailedError" not in line] or found
            error = error or (f"{named[-1][:200]} ({os.path.basename(path)})" if named
                              else f"see {os.path.basename(path)}")
    if error and not os.path.exists(os.path.join(run_dir, "checkpoint_last.pt")):
        return f"crashed without a final checkpoint: {error}"
    return None


def classify(rc, log_text, nll, vocab=None, train_losses=None):
    """``(status, reason)`` of one training process: ``ok``, ``diverged`` or ``failed``, from its exit
    status ``rc``, its output ``log_text``, its last valid nll loss ``nll`` (None: no validation) and its
    first and last training loss (:func:`loss_sign`)."""
    if rc != 0:
        sign = log_sign(log_text)
        if sign:
            return "diverged", f"{sign[0]}: {sign[1][-200:]}"
        last = [l.strip() for l in log_text.splitlines() if l.strip()][-1:] or ["(no output)"]
        return "failed", f"fairseq-train exit status {rc}: {last[0][-300:]}"
    if nll is None:
        return "failed", "no validation result in the log"
    reason = loss_sign(nll, vocab, train_losses)
    if reason:
        return "diverged", reason
    return "ok", ""

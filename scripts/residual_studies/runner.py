"""Running fairseq commands for the tools: find the console script, run it with its output in a log
file, supervise it (CPU time, Ctrl-C stops every child), run several side by side.

Errors meant for the user are :class:`ToolError`, the one root of the tools' user errors (the entry points
print them as ``ERROR: ...`` and exit with status 2).
"""
import concurrent.futures
import datetime
import os
import re
import shlex
import subprocess
import sys
import threading

from . import REPO


class ToolError(Exception):
    """A failure with a message meant for the user (printed as 'ERROR: ...', exit status 2). The root of every
    user error of the tools; its subclasses say where it comes from, and their entry points print them as
    before: :class:`.corpus_io.PrepError` (a corpus preparation step), :class:`.ding_input.CorpusInputError`
    (the Ding dictionary given to ``scripts/build_ding_corpus.py``: ``error: ...``, status 2) and
    :class:`.bleu_metrics.GenerateOutputError` (fairseq-generate output that cannot be scored) and
    :class:`.bleu_metrics.MissingReferenceError` (a newstest year without its reference), both
    ``score_bleu.py: error: ...``, status 1."""


_PRINT_LOCK = threading.Lock()
_CHILDREN = set()  # running subprocesses, stopped when the tool is interrupted
_CHILDREN_LOCK = threading.Lock()
#: fairseq output lines shown on the terminal by :func:`run` (everything goes to the log file)
SHOW_RE = re.compile(r"\| (train_inner|train|valid) \||num\. shared model params|Stopping training|"
                     r"done training|Translated \d|loaded checkpoint|Error|error:|Traceback|Wrote preprocessed")


def say(text):
    """Print one line, whole, even when several threads print."""
    with _PRINT_LOCK:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()


def logger(name):
    """A ``log(msg)`` function printing ``[name] msg``."""
    return lambda msg: say(f"[{name}] {msg}")


def rel(path):
    """``path`` relative to the current directory when it lies below it, else absolute."""
    path = os.path.abspath(path)
    r = os.path.relpath(path)
    return path if r.startswith("..") else r


def tool(name):
    """Absolute path of a console script: next to this Python first, then on PATH."""
    for folder in [os.path.dirname(sys.executable)] + os.environ.get("PATH", "").split(os.pathsep):
        cand = os.path.join(folder, name)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise ToolError(f"'{name}' not found next to {sys.executable} nor on PATH; install the project "
                    f"(make venv) and put .venv/bin first on PATH")


def require_cuda(option):
    """Stop unless torch sees a CUDA GPU: without one fairseq trains on the CPU, and a report would call the
    run a GPU run.

    Raises:
        ToolError: naming ``option`` and what to do instead.
    """
    import torch

    if not torch.cuda.is_available():
        raise ToolError(f"{option}: this machine has no CUDA GPU that torch can use (torch.cuda.is_available() is "
                        f"False, torch {torch.__version__}); without one fairseq would train on the CPU. Leave "
                        f"out {option} to run on the CPU, or run on a machine with a GPU and a CUDA build of torch")


def git_commit():
    """The checkout's commit (with ``+dirty`` when it has local changes), or None without git."""
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def loadavg():
    """The 1, 5 and 15 minute load averages (rounded), or None where the system has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


#: glibc malloc settings for fairseq's CPU runs. By default glibc hands freed memory back to the
#: kernel whenever the top of the heap holds more than 128 KiB free (and serves blocks above a
#: sliding threshold with mmap); a training step frees and re-allocates its activations, so every
#: step then faults the same pages in again. Measured on this project's 2-core machine (6+6 layers,
#: width 64, max_tokens 2048, one thread): system time 14-23% of a training run's CPU time, updates
#: per second +24% with these two settings. They change no number a run computes. A value already in
#: the environment wins.
MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": str(1 << 30), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}


def fairseq_env(threads=None):
    """The environment of a fairseq child process: this process's, with :data:`MALLOC_ENV` where not
    set, and ``threads`` OpenMP/MKL threads when given (0 or None: leave torch's choice)."""
    env = dict(os.environ)
    for key, value in MALLOC_ENV.items():
        env.setdefault(key, value)
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def quote(cmd):
    """``cmd`` as one shell-quoted line."""
    return " ".join(shlex.quote(c) for c in cmd)


def run(cmd, log_path=None, append=False, prefix="", show=SHOW_RE, stats=None, log=say):
    """Run ``cmd``: all of its stdout+stderr goes to ``log_path``, the lines matching ``show``
    (fairseq's progress and errors) also to the terminal, after ``prefix``.

    Returns:
        float: CPU seconds (user + system) the command used; also put in ``stats["cpu_s"]``,
        there even when the command fails or is interrupted.

    Raises:
        ToolError: the command exits non-zero (message names the command, its log and last lines).
    """
    printable = " ".join(shlex.quote(rel(c) if os.path.isabs(c) else c) for c in cmd)
    log(f"{prefix}$ {printable}")
    lf = open(log_path, "a" if append else "w", encoding="utf-8") if log_path else None
    tail = []
    try:
        if lf:
            lf.write(f"# {datetime.datetime.now().isoformat(timespec='seconds')} $ {printable}\n")
            lf.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                encoding="utf-8", errors="replace", bufsize=1, env=fairseq_env())
        with _CHILDREN_LOCK:
            _CHILDREN.add(proc)
        try:
            for line in proc.stdout:
                if lf:
                    lf.write(line)
                    lf.flush()
                if show is not None and show.search(line):
                    say(prefix + line)
                tail = (tail + [line.rstrip("\n")])[-15:]
        except BaseException:
            proc.terminate()
            raise
        finally:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = rc = os.waitstatus_to_exitcode(status)
            with _CHILDREN_LOCK:
                _CHILDREN.discard(proc)
            if stats is not None:
                stats["cpu_s"] = usage.ru_utime + usage.ru_stime
    finally:
        if lf:
            lf.close()
    if rc != 0:
        where = f"; full log: {rel(log_path)}" if log_path else ""
        raise ToolError(f"{os.path.basename(cmd[0])} failed with exit status {rc}{where}\n"
                        + "\n".join("    " + t for t in tail))
    return usage.ru_utime + usage.ru_stime


def run_logged(cmd, log_path, threads, append=False):
    """Run ``cmd`` with its output in ``log_path`` (nothing on the terminal, no error raised; ``append``:
    after what the file holds) and ``threads`` OpenMP/MKL threads (0: torch's choice); return (exit
    status, CPU seconds it used)."""
    env = fairseq_env(threads)
    with open(log_path, "a" if append else "w", encoding="utf-8") as lf:
        lf.write("$ " + quote(cmd) + "\n")
        lf.flush()
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env)
        try:
            _, status, usage = os.wait4(proc.pid, 0)  # the child's own CPU time (user + system)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, round(usage.ru_utime + usage.ru_stime, 1)


def parallel(fn, items, jobs):
    """``fn(item)`` for each item, ``jobs`` at a time (threads; the work is in subprocesses).

    Every item runs to its end even when another fails; then the first error is raised.
    """
    if jobs <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs)
    futures = [pool.submit(fn, item) for item in items]
    try:
        while concurrent.futures.wait(futures, timeout=0.5)[1]:  # short waits: Ctrl-C gets through
            pass
    except BaseException:  # interrupted: stop the running fairseq processes, then the threads
        with _CHILDREN_LOCK:
            running = list(_CHILDREN)
        for proc in running:
            proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]
    return [f.result() for f in futures]

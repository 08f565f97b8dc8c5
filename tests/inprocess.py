"""fairseq's command-line tools in the test's own process, as fairseq's own tests run them
(``fairseq/tests/utils.py`` calls ``train.main`` / ``generate.main``): the same ``cli_main`` the console
scripts call, with ``sys.argv`` set, without the ~4 s of a new interpreter importing torch and fairseq.

Use it wherever the process boundary is not what a test checks (exit statuses, messages on stderr, a kill,
``torchrun`` and the shell scripts still need :func:`conftest.run_cli`). :func:`run_logged` and :func:`run` stand
in for the tools' runners (``residual_studies.runner``) in a test that monkeypatches them: the command a study or
the demo builds, run through the function its console script calls."""
import contextlib
import importlib
import io
import logging
import os
import sys
import threading
import time
import traceback

#: the console scripts this module runs in-process: name -> fairseq_cli module
TOOLS = {"fairseq-train": "fairseq_cli.train", "fairseq-generate": "fairseq_cli.generate",
         "fairseq-preprocess": "fairseq_cli.preprocess", "fairseq-validate": "fairseq_cli.validate"}
#: the loggers whose INFO lines make the tools' output
LOGGERS = ("fairseq", "fairseq_cli", "fairseq_residual", "train", "train_inner", "valid")


def _run_tool(module_name, tool, args, stderr=False, function="cli_main"):
    """Run ``module_name``'s ``function`` as ``tool`` with ``args`` in this process (``stderr``: its standard
    error too, else only its standard output and logging).

    Returns:
        ``(status, output, exception)``: the exit status (0, the ``SystemExit`` code, or 1 when it raised),
        what it printed and logged (INFO and above, fairseq's log format) and the exception it raised, if any.
    """
    module = importlib.import_module(module_name)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s"))
    root = logging.getLogger()
    # INFO from every fairseq logger, whatever an earlier caller in this process set (the analysis tool quiets
    # "fairseq", the speed harness disables logging below WARNING)
    loggers = [root] + [logging.getLogger(name) for name in LOGGERS]
    levels, disabled = [lg.level for lg in loggers], logging.root.manager.disable
    logging.disable(logging.NOTSET)
    for lg in loggers:
        lg.setLevel(logging.INFO)
    root.addHandler(handler)
    argv = sys.argv
    sys.argv = [tool, *[str(a) for a in args]]
    status, raised = 0, None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out) if stderr else contextlib.nullcontext():
            getattr(module, function)()
    except SystemExit as e:
        status = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        if e.code not in (None, 0) and not isinstance(e.code, int):
            out.write(f"{e.code}\n")
    except Exception as e:  # noqa: BLE001 (the console script would print its traceback and exit with 1)
        status, raised = 1, e
        out.write(traceback.format_exc())
    finally:
        sys.argv = argv
        root.removeHandler(handler)
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        logging.disable(disabled)
    return status, out.getvalue(), raised


def fairseq_main(tool, *args):
    """Run ``tool`` (a key of :data:`TOOLS`) with ``args`` in this process.

    Returns:
        str: what the tool printed and logged (INFO and above, fairseq's log format), as the console
        script's output would read.

    Raises:
        AssertionError: the tool raised or exited with a non-zero status; the message holds its output.
    """
    status, output, raised = _run_tool(TOOLS[tool], tool, args)
    if raised is not None:  # the whole chain, as the traceback of the console script shows it
        chain, cause = [], raised
        while cause is not None and len(chain) < 8:
            chain.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__ or cause.__context__
        raise AssertionError(f"{tool} {' '.join(map(str, args))} raised {' <- '.join(chain)}\n"
                             f"{output[-6000:]}") from raised
    if status != 0:
        raise AssertionError(f"{tool} {' '.join(map(str, args))} exited with {status}:\n{output[-6000:]}")
    return output


_ONE_AT_A_TIME = threading.Lock()


def _console_script(path):
    """``(module, function)`` that the installed console script ``path`` (by its file name) calls: its entry
    point in the installed distributions' metadata (fairseq's, this project's setup.py)."""
    from importlib.metadata import entry_points

    name = os.path.basename(path)
    found = entry_points(group="console_scripts", name=name)
    if len(found) != 1:
        raise AssertionError(f"{name}: {len(found)} console-script entry points installed, expected one")
    (ep,) = found
    return ep.module, ep.attr


def run_logged(cmd, log_path, threads, append=False):
    """:func:`residual_studies.runner.run_logged` with the console script ``cmd[0]`` run in this process (the
    function its installed entry point names, :func:`_console_script`): the same log file (the command line,
    then what the tool printed and logged), its exit status (1 when it raised, its traceback in the log) and
    the CPU seconds it used (this thread's). fairseq's state is global: tools run one at a time, so a study's
    ``--jobs`` cells take turns; ``threads`` (0: torch's choice) sets torch's threads while the tool runs, as
    the runner sets the child's OpenMP threads."""
    import torch

    from residual_studies.runner import quote

    tool = os.path.basename(cmd[0])
    module, function = _console_script(cmd[0])
    with _ONE_AT_A_TIME, open(log_path, "a" if append else "w", encoding="utf-8") as lf:
        lf.write("$ " + quote(cmd) + "\n")
        before = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        t0 = time.thread_time()
        try:
            status, output, _ = _run_tool(module, tool, cmd[1:], stderr=True, function=function)
        finally:
            torch.set_num_threads(before)
        lf.write(output)
    return status, round(time.thread_time() - t0, 1)


def run(cmd, log_path=None, append=False, prefix="", show=None, stats=None, log=None):
    """:func:`residual_studies.runner.run` with the console script ``cmd[0]`` run in this process (the function
    its installed entry point names, :func:`_console_script`): the command line logged, the tool's output in
    ``log_path``, its lines matching ``show`` (default the runner's) printed after ``prefix``, the CPU seconds it
    used (this thread's) returned and put in ``stats["cpu_s"]``.

    Raises:
        ToolError: the tool exits non-zero or raises (the message names it and its last lines), as the
            runner's does.
    """
    from residual_studies import runner

    show = runner.SHOW_RE if show is None else show
    log = log or runner.say
    tool = os.path.basename(cmd[0])
    module, function = _console_script(cmd[0])
    log(f"{prefix}$ {runner.quote(cmd)}")
    with _ONE_AT_A_TIME:
        t0 = time.thread_time()
        status, output, _ = _run_tool(module, tool, cmd[1:], stderr=True, function=function)
        cpu = time.thread_time() - t0
    if log_path:
        with open(log_path, "a" if append else "w", encoding="utf-8") as lf:
            lf.write(f"# $ {runner.quote(cmd)}\n{output}")
    lines = output.splitlines()
    for line in lines:
        if show.search(line):
            runner.say(prefix + line)
    if stats is not None:
        stats["cpu_s"] = cpu
    if status != 0:
        where = f"; full log: {log_path}" if log_path else ""
        raise runner.ToolError(f"{tool} failed with exit status {status}{where}\n"
                               + "\n".join("    " + t for t in lines[-15:]))
    return cpu

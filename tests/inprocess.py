"""fairseq's command-line tools in the test's own process, as fairseq's own tests run them
(``fairseq/tests/utils.py`` calls ``train.main`` / ``generate.main``): the same ``cli_main`` the console
scripts call, with ``sys.argv`` set, without the ~4 s of a new interpreter importing torch and fairseq.

Use it wherever the process boundary is not what a test checks (exit statuses, messages on stderr, a kill,
``torchrun`` and the shell scripts still need :func:`conftest.run_cli`)."""
import contextlib
import importlib
import io
import logging
import sys

#: the console scripts this module runs in-process: name -> fairseq_cli module
TOOLS = {"fairseq-train": "fairseq_cli.train", "fairseq-generate": "fairseq_cli.generate",
         "fairseq-preprocess": "fairseq_cli.preprocess"}
#: the loggers whose INFO lines make the tools' output
LOGGERS = ("fairseq", "fairseq_cli", "fairseq_residual", "train", "train_inner", "valid")


def fairseq_main(tool, *args):
    """Run ``tool`` (a key of :data:`TOOLS`) with ``args`` in this process.

    Returns:
        str: what the tool printed and logged (INFO and above, fairseq's log format), as the console
        script's output would read.

    Raises:
        AssertionError: the tool raised or exited with a non-zero status; the message holds its output.
    """
    module = importlib.import_module(TOOLS[tool])
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
    try:
        with contextlib.redirect_stdout(out):
            module.cli_main()
    except SystemExit as e:
        if e.code not in (None, 0):
            raise AssertionError(f"{tool} {' '.join(sys.argv[1:])} exited with {e.code}:\n"
                                 f"{out.getvalue()[-6000:]}") from e
    except Exception as e:  # the whole chain, as the traceback of the console script shows it
        chain, cause = [], e
        while cause is not None and len(chain) < 8:
            chain.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__ or cause.__context__
        raise AssertionError(f"{tool} {' '.join(sys.argv[1:])} raised {' <- '.join(chain)}\n"
                             f"{out.getvalue()[-6000:]}") from e
    finally:
        sys.argv = argv
        root.removeHandler(handler)
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        logging.disable(disabled)
    return out.getvalue()

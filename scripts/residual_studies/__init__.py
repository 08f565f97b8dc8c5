"""The study tooling of fairseq-residual: the library and the applications behind ``scripts/``.

It runs from the checkout (``scripts/*.py`` and ``scripts/*.sh`` put ``scripts/`` on ``sys.path``) and is
not part of the plugin's install: ``pip install .`` ships ``fairseq_residual`` alone, and everything here
that reads ``configs/``, ``data/``, ``runs/`` or git finds them beside this folder (:data:`REPO`).

Library, one concern each:

* :mod:`.files` (JSON and text files written atomically, fingerprints), :mod:`.runner` (running and
  supervising fairseq commands, side by side; the user-facing error), :mod:`.steps` (resumable steps),
  :mod:`.options` (the argparse types of the numeric and list options), :mod:`.fairseq_cfg` (fairseq's
  training config reused across schemes);
* :mod:`.logs` (the one parser of fairseq train logs, the one reader of fairseq-generate output),
  :mod:`.divergence` (the one rule that says a run diverged), :mod:`.commands` (the one builder of
  fairseq-train, -generate and -interactive commands and home of their translation settings, the benchmark
  configs' values, the benchmark run names),
  :mod:`.report` (scheme labels, colours and order, tables, plots);
* :mod:`.data` (the study corpus: its splits, its check, sentencepiece, binarisation, the BLEU subset,
  scoring), :mod:`.ding_input` (reading the Ding dictionary the shipped corpus is built from),
  :mod:`.bleu_metrics` (the benchmarks' BLEU metrics and the newstest average);
* :mod:`.corpus_steps` (the benchmarks' corpus preparation steps and their command line, standard library
  only: :mod:`.corpus_io` text files, :mod:`.corpus_archive` archives and OPUS-100 pair folders,
  :mod:`.corpus_text` Moses-style text steps, :mod:`.corpus_sentencepiece`);
* :mod:`.cell` (one study cell: settings, folder, training segments, budgets, translation and scoring),
  :mod:`.grid` (the options of a grid of cells, its start, running it with N jobs);
* :mod:`.demo_report` (the demo's run history and results files);
* :mod:`.stats` (mean, sd, paired verdicts), :mod:`.claims` (the paper's claims, conditions, ablations, the
  claims study's options), :mod:`.claims_report`, :mod:`.lr_protocol` (per-scheme learning-rate selection),
  :mod:`.ranking` (many schemes at one condition);
* :mod:`.speed_harness`, :mod:`.speed_compare`, :mod:`.speed_report` (the speed benchmark's measurement,
  ratios and goals, tables).

Applications, each a thin layer on the library (none imports another): :mod:`.demo`, :mod:`.depth_study`,
:mod:`.claims_study`, :mod:`.learning_curve`, :mod:`.speed`, :mod:`.results` (benchmark tables),
:mod:`.bleu` (scoring), :mod:`.checkpoints` (averaging), :mod:`.measure_training` (training speed of one run),
:mod:`.readme_ranking` (README.md's ranking table);
:mod:`.shell` (the Python the shell scripts call) and :mod:`.ding_corpus` (building the shipped corpus).
"""
import importlib.util
import os
import sys

#: ``scripts/`` and the checkout holding it
SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(SCRIPTS)


def _plugin_dir():
    """The folder of the ``fairseq_residual`` that ``import fairseq_residual`` loads here (the installed
    package, editable or not), without importing it: what every tool passes as ``--user-dir``, so that a
    fairseq process never meets a second copy of the plugin. Without an install, the checkout's copy, put on
    ``sys.path`` so that the tools import that same one."""
    spec = importlib.util.find_spec("fairseq_residual")
    if spec is None:
        if not os.path.isfile(os.path.join(REPO, "fairseq_residual", "__init__.py")):
            raise ImportError("fairseq_residual is neither installed nor beside scripts/: install the "
                              "project (make venv, or pip install .)")
        sys.path.insert(0, REPO)
        return os.path.join(REPO, "fairseq_residual")
    return os.path.dirname(os.path.abspath(spec.origin))


#: the plugin folder every tool passes to fairseq as ``--user-dir`` (see :func:`_plugin_dir`)
PLUGIN_DIR = _plugin_dir()

#: where the demo and the studies write by default (``--out`` overrides it): ``$FAIRSEQ_RESIDUAL_RUNS``, else
#: ``~/fairseq-residual-runs``; outside the checkout, so that a new clone or ``git clean`` keeps the runs
RUNS = os.path.abspath(os.path.expanduser(os.environ.get("FAIRSEQ_RESIDUAL_RUNS") or "~/fairseq-residual-runs"))

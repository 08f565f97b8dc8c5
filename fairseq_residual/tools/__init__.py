"""The study tooling of fairseq-residual: the library behind ``scripts/``.

Not imported by the plugin (``--user-dir fairseq_residual`` stays as light as it is); every
``scripts/*.py`` is a thin entry point over one of these modules. Shared concerns, one module each:

* :mod:`.files` (JSON and text files written atomically, fingerprints), :mod:`.runner` (running and
  supervising fairseq commands, logging, the user-facing error), :mod:`.steps` (resumable steps);
* :mod:`.logs` (the one parser of fairseq train logs, the one reader of fairseq-generate output),
  :mod:`.divergence` (the one rule that says a run diverged), :mod:`.commands` (the one builder of
  fairseq-train commands, and the benchmark configs' values), :mod:`.corpus` (corpus checks and
  preparation steps), :mod:`.report` (scheme labels, colours and order, tables, plots).

Applications: :mod:`.demo`, :mod:`.depth_study`, :mod:`.results` (benchmark tables), :mod:`.bleu`
(scoring), :mod:`.checkpoints` (averaging), :mod:`.speed` (speed benchmark), :mod:`.measure` (training
speed of one run), :mod:`.ding_corpus` (building the shipped corpus).
"""
import os

#: the plugin folder (what ``--user-dir`` names) and the checkout holding it
PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(PLUGIN_DIR)

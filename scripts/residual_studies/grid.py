"""A grid of study cells: the options of a cell (model, recipe, data, scoring, parallelism), the start every
study shares (option checks, ``--out``, the data), running the cells with N jobs, and a study's main.

The depth study, the claims study and the learning curves are grids of :mod:`.cell` cells; they differ in
which cells they run and how they report them.
"""
import os
import sys

from . import PLUGIN_DIR, cell, data, options
from .options import fraction, nonnegative_float, nonnegative_int, positive_float, positive_int
from .report import ORDER
from .runner import ToolError, parallel, require_cuda

SCHEMES = ORDER


#: comma-separated scheme names, each once, or ``all`` for every registered scheme
scheme_list = options.name_list(SCHEMES, "scheme", everything="all")
int_list = options.int_list


def add_cell_arguments(p, out, study_options, updates=300, max_tokens=4096, warmup=60, bleu_sentences=300, lr=1e-3,
                       schemes=None, schemes_help=None):
    """The options of one cell (model, recipe, data, scoring, parallelism); ``study_options`` says which of
    the study's options sets each cell setting (:func:`.cell.check_extra_args`); the keyword arguments are the
    study's defaults (``schemes`` None: every registered scheme)."""
    p.set_defaults(study_options=study_options)
    p.add_argument("--schemes", type=scheme_list, default=list(schemes or SCHEMES),
                   help=schemes_help or "comma-separated residual schemes, or all (default: every registered "
                                        f"one, {','.join(SCHEMES)})")
    p.add_argument("--updates", type=positive_int, default=updates, help="updates per cell (default %(default)s)")
    p.add_argument("--width", type=positive_int, default=64, help="model width (default 64)")
    p.add_argument("--ffn-dim", type=positive_int, default=None, help="FFN width (default: 2 x width)")
    p.add_argument("--heads", type=positive_int, default=4, help="attention heads (default 4)")
    p.add_argument("--lr", type=positive_float, default=lr, help="peak learning rate (default %(default)s)")
    p.add_argument("--warmup", type=positive_int, default=warmup,
                   help="inverse_sqrt warm-up updates (default %(default)s)")
    p.add_argument("--clip-norm", type=nonnegative_float, default=0.0, help="gradient clipping (default 0: off)")
    p.add_argument("--dropout", type=fraction, default=0.1, help="dropout (default 0.1)")
    p.add_argument("--max-tokens", type=positive_int, default=max_tokens, help="tokens per batch (default %(default)s)")
    p.add_argument("--vocab-size", type=options.at_least(data.MIN_VOCAB), default=4000,
                   help="sentencepiece vocabulary (default 4000)")
    p.add_argument("--bleu-sentences", type=positive_int, default=bleu_sentences,
                   help="translate the first N test sentences for BLEU (default %(default)s)")
    p.add_argument("--beam", type=positive_int, default=4, help="beam size for BLEU (default 4)")
    p.add_argument("--log-interval", type=positive_int, default=25,
                   help="fairseq log and per-layer grad-norm interval, updates (default 25)")
    p.add_argument("--checkpoint-every", type=positive_int, default=cell.CHECKPOINT_EVERY,
                   help="save each cell's checkpoint (and validate) every N updates, so that a killed study "
                        "resumes losing at most N updates per running cell (default %(default)s; changes no "
                        "number: the cell is the same)")
    p.add_argument("--jobs", type=positive_int, default=2,
                   help="cells trained at the same time (default 2: one per core of a 2-core machine)")
    p.add_argument("--threads", type=nonnegative_int, default=1,
                   help="CPU threads per fairseq process (OMP_NUM_THREADS; default 1; 0: torch's "
                        "choice). Narrow models gain little from a second thread and lose much when "
                        "the cores are shared")
    p.add_argument("--data", default=data.DEFAULT_CORPUS, help="corpus folder (default: data/ding-de-en)")
    p.add_argument("--out", default=out, help="output folder (default: %(default)s)")
    p.add_argument("--user-dir", default=PLUGIN_DIR,
                   help="the fairseq_residual plugin folder (default: the one Python imports, %(default)s)")
    p.add_argument("--extra-train-args", default="", help="more fairseq-train options (one string)")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: rebuild the report and the plot from finished cells")
    p.add_argument("--dry-run", action="store_true",
                   help="print every cell's folder (the depth study: with its fairseq-train command) and train "
                        "nothing; the data the cells are named by is prepared first (seconds, under --out)")


def start(args, log):
    """Check the options that no argparse type can check alone, create ``--out`` (made absolute) and prepare
    the data: the start every study shares. Returns :func:`.data.prepare_study`'s data dict.

    The study's parser names its own options for the cells' settings (``study_options``, a default of the
    parser: ``{cell setting: the study's option}``), for :func:`.cell.check_extra_args`.

    Raises:
        ToolError, before anything is made: extra fairseq-train options that contradict the cells' settings;
            ``--device cuda`` without a GPU; a width the heads do not divide; a bad corpus.
    """
    cell.check_extra_args(args.extra_train_args, args.study_options)
    if getattr(args, "device", "cpu") == "cuda":
        require_cuda("--device cuda")
    if args.width % args.heads:
        raise ToolError(f"--width {args.width} is not divisible by --heads {args.heads}")
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    return data.prepare_study(args.out, args.data, args.vocab_size, args.bleu_sentences, log=log)


def run(fn, cells, jobs, first=None):
    """``fn(cell)`` for every cell, ``jobs`` at a time (:func:`.runner.parallel`); ``first`` (a key) orders
    the start, e.g. the longest cells first, which packs the jobs better. Returns the results in the order
    of ``cells``."""
    order = sorted(cells, key=first) if first else list(cells)
    done = dict(zip(order, parallel(fn, order, jobs)))
    return [done[c] for c in cells]


def main(body, log):
    """Run a study's ``body()`` (returning its exit status) with the user's errors as ``ERROR: ...`` (exit
    status 2) and Ctrl-C as a resumable stop (130)."""
    try:
        return body()
    except ToolError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("\nInterrupted; run the same command again to resume (finished cells are kept).", file=sys.stderr)
        return 130

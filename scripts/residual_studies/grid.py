"""A grid of study cells: the options of a cell (model, recipe, data, scoring, parallelism), the start every
study shares (option checks, ``--out``, the data), running the cells with N jobs, and a study's main.

The depth study, the claims study and the learning curves are grids of :mod:`.cell` cells; they differ in
which cells they run and how they report them.
"""
import argparse
import os
import sys

from . import PLUGIN_DIR, cell, data
from .report import ORDER
from .runner import ToolError, parallel

SCHEMES = ORDER


def int_list(text):
    """Comma-separated positive integers."""
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def scheme_list(text):
    """Comma-separated scheme names, or ``all`` for every registered scheme."""
    if text.strip() == "all":
        return list(SCHEMES)
    values = [v for v in text.replace(" ", "").split(",") if v]
    bad = [v for v in values if v not in SCHEMES]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"unknown scheme(s) {bad}: choose from {', '.join(SCHEMES)}")
    return values


def add_cell_arguments(p, out, updates=300, max_tokens=4096, warmup=60, bleu_sentences=300, lr=1e-3,
                       schemes=None, schemes_help=None):
    """The options of one cell (model, recipe, data, scoring, parallelism); the keyword arguments are the
    study's defaults (``schemes`` None: every registered scheme)."""
    p.add_argument("--schemes", type=scheme_list, default=list(schemes or SCHEMES),
                   help=schemes_help or "comma-separated residual schemes, or all (default: every registered "
                                        f"one, {','.join(SCHEMES)})")
    p.add_argument("--updates", type=int, default=updates, help="updates per cell (default %(default)s)")
    p.add_argument("--width", type=int, default=64, help="model width (default 64)")
    p.add_argument("--ffn-dim", type=int, default=None, help="FFN width (default: 2 x width)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--lr", type=float, default=lr, help="peak learning rate (default %(default)s)")
    p.add_argument("--warmup", type=int, default=warmup,
                   help="inverse_sqrt warm-up updates (default %(default)s)")
    p.add_argument("--clip-norm", type=float, default=0.0, help="gradient clipping (default 0: off)")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout (default 0.1)")
    p.add_argument("--max-tokens", type=int, default=max_tokens, help="tokens per batch (default %(default)s)")
    p.add_argument("--vocab-size", type=int, default=4000, help="sentencepiece vocabulary (default 4000)")
    p.add_argument("--bleu-sentences", type=int, default=bleu_sentences,
                   help="translate the first N test sentences for BLEU (default %(default)s)")
    p.add_argument("--beam", type=int, default=4, help="beam size for BLEU (default 4)")
    p.add_argument("--log-interval", type=int, default=25,
                   help="fairseq log and per-layer grad-norm interval, updates (default 25)")
    p.add_argument("--checkpoint-every", type=int, default=cell.CHECKPOINT_EVERY,
                   help="save each cell's checkpoint (and validate) every N updates, so that a killed study "
                        "resumes losing at most N updates per running cell (default %(default)s; changes no "
                        "number: the cell is the same)")
    p.add_argument("--jobs", type=int, default=2,
                   help="cells trained at the same time (default 2: one per core of a 2-core machine)")
    p.add_argument("--threads", type=int, default=1,
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
    p.add_argument("--dry-run", action="store_true", help="print the cells and their commands only")


def start(args, log):
    """Check the cell options, create ``--out`` (made absolute) and prepare the data: the start every study
    shares. Returns :func:`.data.prepare_study`'s data dict.

    Raises:
        ToolError: an option out of range, naming it; a bad corpus.
    """
    if args.updates < 1 or args.jobs < 1 or args.bleu_sentences < 1 or args.checkpoint_every < 1:
        raise ToolError("--updates, --jobs, --bleu-sentences and --checkpoint-every must be >= 1")
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

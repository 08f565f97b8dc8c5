"""The claims of the ResiDual paper that the claims study tests, the grid that tests them, and its options.

The paper (Xie et al. 2023, arXiv 2304.14802) reports, on IWSLT14 De-En, one run per cell (its numbers:
``fairseq_residual/paper_results.json``, read by :func:`claims`):

* **warm-up** (its no-warm-up ablation): without learning-rate warm-up Post-LN fails, Pre-LN loses about
  3 BLEU and ResiDual is unaffected;
* **depth**: at 12+12 layers Post-LN fails while ResiDual beats Pre-LN.

Rows of the grid: the schemes of ``--schemes`` (default :data:`CLAIM_SCHEMES`, the three the claims name;
``all``: every registered scheme, so schemes added later are picked up without edits), plus the ablation
rows of ``--ablations`` (:data:`ABLATIONS`). Conditions (``--conditions``): ``warm6`` (6+6 layers,
inverse_sqrt warm-up of ``--warmup`` updates), ``nowarm6`` (6+6 without warm-up: ``--warmup-updates 1``,
the peak learning rate from the second update on; fairseq's inverse_sqrt cannot take 0), ``warm12`` and
``nowarm12`` (12+12). Each (row, condition, seed) is one :mod:`.cell` (:func:`cell_args`).

Verdicts (:func:`.stats.verdict`): each claim is a paired difference per seed (same seed, same batches, two
conditions or two schemes). With n seeds, the claim **holds** when the 95% t-interval of the mean
difference lies wholly on the claimed side of zero, **does not hold** when it lies wholly on the other
side, and is **inconclusive** otherwise. "Fails" means the project's divergence rule (:mod:`.divergence`)
flagged the run, in at least half of the seeds.
"""
import argparse
import os
import sys

from fairseq_residual import paper_results

from . import RUNS, cell, grid, options
from .files import read_json
from .report import COLORS, LABELS, ORDER, unused_colors
from .stats import verdict

DEFAULT_OUT = os.path.join(RUNS, "claims_study")
#: the claims study's option behind each setting of a cell (:func:`.cell.check_extra_args`)
STUDY_OPTIONS = dict(scheme="--schemes (or --ablations)", depth="--conditions", width="--width",
                     ffn_dim="--ffn-dim", heads="--heads", seed="--seeds", lr="--lr",
                     warmup="--warmup (or --conditions nowarm6 / nowarm12 for none)", max_tokens="--max-tokens",
                     updates="--updates", dropout="--dropout", clip_norm="--clip-norm", out="--out",
                     user_dir="--user-dir", device="--device", log_interval="--log-interval")

#: condition name -> (layers per stack, warm-up on)
CONDITIONS = {
    "warm6": (6, True),
    "nowarm6": (6, False),
    "warm12": (12, True),
    "nowarm12": (12, False),
}
NO_WARMUP_UPDATES = 1  # fairseq's inverse_sqrt divides by warmup_updates: 1 is "no warm-up"
#: the schemes of the grid when ``--schemes`` is not given: the three the paper's claims name
CLAIM_SCHEMES = ("post_ln", "pre_ln", "resi_dual")
#: ablations the grid can add as rows of their own (``--ablations``): name -> the scheme it changes,
#: the model options that make it, a label, what it tests and why; each gets a colour no scheme has
#: (:func:`row_color`)
ABLATIONS = {
    "zeros": dict(
        scheme="resi_dual", args="--resi-dual-start-from zeros", label="ResiDual, x_d from 0",
        what="starting the dual stream from zeros instead of the embedding output",
        why="with shared embeddings, LN(x_d) of an embedding-dominated x_d adds a copy of the input token's "
            "embedding to the decoder output, i.e. a copy-the-previous-token term in the logits early in "
            "training (the authors' code has the zeros line commented out)"),
    "alpha_half": dict(
        scheme="resi_dual", args="--encoder-resi-dual-alpha 0.5 --decoder-resi-dual-alpha 0.5",
        label="ResiDual, alpha 0.5",
        what="weighting the Post-LN stream by alpha = 0.5 in the stack output",
        why="the output alpha*x_a + LN(x_d) has about twice the variance of Pre-LN's LN(x) at alpha = 1"),
}
_ABLATION_COLORS = dict(zip(ABLATIONS, unused_colors(len(ABLATIONS))))
# The default recipe, chosen from measured learning curves (docs/analysis.md, "The claims study", shows
# the curves and the arithmetic). lr 2e-3 is the largest peak learning rate probed (1e-3, 2e-3, 4e-3) at
# which Post-LN, Pre-LN and ResiDual all learn with warm-up: at 4e-3 Post-LN stalls near the unigram loss.
# BLEU on this corpus at width 64 still rises at 4000 updates, so the budget is not where BLEU stops
# moving: 1000 updates is what lets 3 schemes x 3 conditions x 3 seeds finish within 90 minutes on 2 cores
# (0.28 s per 6+6 update and 0.47 s per 12+12 update at one thread, two runs side by side, plus
# translating 500 sentences per cell). A larger --updates continues every cell; --learning-curve measures.
DEFAULT_UPDATES = 1000
DEFAULT_MAX_TOKENS = 2048
DEFAULT_WARMUP = 300
DEFAULT_LR = 2e-3
DEFAULT_BLEU_SENTENCES = 500
#: with --learning-curve: updates between the scored checkpoints
DEFAULT_CURVE_EVERY = 250

# ------------------------------------------------------------------------------------------------
# rows: the registered schemes and the ablations


def row_key(name):
    """The row of an ablation: ``<scheme>+<ablation>``."""
    return f"{ABLATIONS[name]['scheme']}+{name}"


def resolve(row):
    """``(scheme, extra fairseq-train options)`` of a row (a scheme name or an ablation's row key)."""
    if "+" in row:
        a = ABLATIONS[row.split("+", 1)[1]]
        return a["scheme"], a["args"]
    return row, ""


def row_label(row):
    return ABLATIONS[row.split("+", 1)[1]]["label"] if "+" in row else LABELS[row]


def row_color(row):
    """A row's colour: the scheme's own (the registry's palette), or for an ablation one no scheme uses, so
    that every row of a plot has a colour of its own."""
    return _ABLATION_COLORS[row.split("+", 1)[1]] if "+" in row else COLORS[row]


def grid_rows(args):
    """The grid's rows: the schemes in the registry's order, then the ablations asked for."""
    return [s for s in ORDER if s in args.schemes] + [row_key(a) for a in args.ablations]


# ------------------------------------------------------------------------------------------------
# cells


def cell_args(args, condition, seed, row=None, lr=None):
    """The options of one cell of this grid, for :func:`.cell.settings`, and its depth (``row``: a scheme or
    an ablation's row, whose model options are added to ``--extra-train-args``; ``lr``: the peak learning
    rate, default ``--lr``)."""
    depth, warm = CONDITIONS[condition]
    ns = argparse.Namespace(**vars(args))
    if lr is not None:
        ns.lr = lr
    ns.warmup = args.warmup if warm else NO_WARMUP_UPDATES
    ns.seed = seed
    ns.depths = [depth]
    if row is not None:
        extra = resolve(row)[1]
        ns.extra_train_args = " ".join(a for a in (args.extra_train_args, extra) if a)
    return ns, depth


def read_cell(args, data, row, condition, seed, updates=None, lr=None):
    """The result of one finished cell at ``updates`` (default ``--updates``) and ``lr`` (default ``--lr``),
    or None."""
    ns, depth = cell_args(args, condition, seed, row, lr)
    if updates is not None:
        ns.updates = updates
    r = read_json(cell.result_path(args.out, cell.settings(ns, resolve(row)[0], depth, data)))
    return dict(r, scheme=row, condition=condition, seed=seed) if r else None


def budgets_of_grid(args, data, cells):
    """The budgets (update counts) at which every cell of the grid has a result, increasing (``cells``:
    ``(row, condition, seed)`` or ``(row, condition, seed, lr)``)."""
    common = None
    for row, cond, seed, *lr in cells:
        ns, depth = cell_args(args, cond, seed, row, *lr)
        found = cell.budgets(cell.folder(args.out, cell.settings(ns, resolve(row)[0], depth, data)))
        common = found if common is None else common & found
    return sorted(common or ())


def cell_metrics(r):
    """The numbers of one finished cell (None where the cell has none)."""
    scores = r.get("scores") or {}
    diag = r.get("diagnostics") or {}
    ok = r["status"] == "ok"
    return dict(
        diverged=r["status"] == "diverged",
        failed=r["status"] == "failed",
        valid_nll=r["stats"].get("valid_nll_loss") if ok else None,
        bleu=scores.get("bleu") if ok else None,
        chrf=scores.get("chrf") if ok else None,
        grad_enc=diag.get("grad_low_top_enc"), grad_dec=diag.get("grad_low_top_dec"),
        cos_enc=diag.get("cos_top_enc"), cos_dec=diag.get("cos_top_dec"),
        train_cpu_s=r.get("train_cpu_s"), updates=r["settings"]["updates"],
    )


# ------------------------------------------------------------------------------------------------
# claims


def _paired(by, a, b, metric):
    """Per seed: metric(a) - metric(b), where a and b are (scheme, condition); a diverged run counts as
    missing (its loss and BLEU are not comparable)."""
    seeds = sorted({k[2] for k in by})
    out = []
    for s in seeds:
        ra, rb = by.get((*a, s)), by.get((*b, s))
        if ra is None or rb is None:
            continue
        va, vb = cell_metrics(ra)[metric], cell_metrics(rb)[metric]
        out.append(None if va is None or vb is None else va - vb)
    return out


def _fails(by, scheme, condition):
    runs = [r for k, r in by.items() if k[0] == scheme and k[1] == condition]
    n_div = sum(cell_metrics(r)["diverged"] for r in runs)
    return n_div, len(runs)


def _paper(scheme, depth, warmup=True):
    """The paper's IWSLT14 BLEU of ``scheme`` at ``depth`` + ``depth`` layers (``paper_results.json``)."""
    return paper_results.paper_bleu("iwslt14", scheme, depth, warmup=warmup)


def _paper_pair(a, b, sep):
    """``"<a> <sep> <b> BLEU"`` of two of the paper's numbers, ``-`` when it lacks either."""
    return f"{a} {sep} {b} BLEU" if a is not None and b is not None else "-"


def _paper_loss(scheme, depth):
    """The paper's BLEU lost without warm-up (with minus without), or None."""
    w, n = _paper(scheme, depth), _paper(scheme, depth, warmup=False)
    return w - n if isinstance(w, float) and isinstance(n, float) else None


def claims(by, conditions):
    """Each claim of the paper that this grid can test: its statement, the measured effect, the verdict,
    and the paper's numbers behind the claim (from ``paper_results.json``; ``-`` where it has none)."""
    out = []
    have = lambda s, c: any(k[0] == s and k[1] == c for k in by)  # noqa: E731
    for depth in (6, 12):
        warm, nowarm = f"warm{depth}", f"nowarm{depth}"
        if warm not in conditions or nowarm not in conditions:
            continue
        if have("post_ln", nowarm):
            n_div, n = _fails(by, "post_ln", nowarm)
            out.append(dict(claim=f"without warm-up, Post-LN fails ({depth}+{depth})",
                            paper=str(_paper("post_ln", depth, warmup=False) or "-"),
                            measured=f"{n_div}/{n} seeds diverged",
                            verdict="holds" if n and 2 * n_div >= n else "does not hold"))
        for scheme, sign in (("pre_ln", -1), ("resi_dual", None)):
            if not (have(scheme, warm) and have(scheme, nowarm)):
                continue
            paper_txt = _paper_pair(_paper(scheme, depth), _paper(scheme, depth, warmup=False), "->")
            for metric, better in (("valid_nll", -1), ("bleu", +1)):
                d = _paired(by, (scheme, nowarm), (scheme, warm), metric)
                if sign is not None:  # Pre-LN loses: worse without warm-up
                    v = verdict(d, claimed_sign=sign * better)
                    text = f"without warm-up, {LABELS[scheme]} is worse ({metric}, {depth}+{depth})"
                else:  # ResiDual unaffected: a clear loss either way refutes it
                    v = verdict(d, claimed_sign=-better)
                    v["verdict"] = {"holds": "does not hold", "does not hold": "holds (it improves)",
                                    "inconclusive": "no effect resolved"}[v["verdict"]]
                    text = f"without warm-up, {LABELS[scheme]} is unaffected ({metric}, {depth}+{depth})"
                out.append(dict(claim=text, paper=paper_txt, effect=v, metric=metric))
        if have("resi_dual", nowarm) and have("pre_ln", nowarm):
            lost = _paper_loss("resi_dual", depth), _paper_loss("pre_ln", depth)
            paper_txt = _paper_pair(*(None if x is None else f"{x:.2f}" for x in lost), "vs")
            for metric, better in (("valid_nll", -1), ("bleu", +1)):
                d_res = _paired(by, ("resi_dual", nowarm), ("resi_dual", warm), metric)
                d_pre = _paired(by, ("pre_ln", nowarm), ("pre_ln", warm), metric)
                diff = [None if a is None or b is None else a - b for a, b in zip(d_res, d_pre)]
                out.append(dict(claim=f"without warm-up, ResiDual loses less than Pre-LN ({metric}, "
                                f"{depth}+{depth})", paper=paper_txt,
                                effect=verdict(diff, claimed_sign=better), metric=metric))
    for name, a in ABLATIONS.items():
        row = row_key(name)
        for cond in conditions:
            if not (have(row, cond) and have(a["scheme"], cond)):
                continue
            for metric, better in (("valid_nll", -1), ("bleu", +1)):
                d = _paired(by, (row, cond), (a["scheme"], cond), metric)
                out.append(dict(claim=f"ablation: {a['what']} improves {LABELS[a['scheme']]} ({metric}, {cond})",
                                paper="-", effect=verdict(d, claimed_sign=better), metric=metric, ablation=name))
            if have("pre_ln", cond):
                d = _paired(by, (row, cond), ("pre_ln", cond), "valid_nll")
                out.append(dict(claim=f"ablation: {a['label']} beats Pre-LN (valid_nll, {cond})", paper="-",
                                effect=verdict(d, claimed_sign=-1), metric="valid_nll", ablation=name))
    if "warm12" in conditions:
        if have("post_ln", "warm12"):
            n_div, n = _fails(by, "post_ln", "warm12")
            out.append(dict(claim="at 12+12 layers, Post-LN fails", paper=str(_paper("post_ln", 12) or "-"),
                            measured=f"{n_div}/{n} seeds diverged",
                            verdict="holds" if n and 2 * n_div >= n else "does not hold"))
        if have("resi_dual", "warm12") and have("pre_ln", "warm12"):
            for metric, better in (("valid_nll", -1), ("bleu", +1)):
                d = _paired(by, ("resi_dual", "warm12"), ("pre_ln", "warm12"), metric)
                out.append(dict(claim=f"at 12+12 layers, ResiDual beats Pre-LN ({metric})",
                                paper=_paper_pair(_paper("resi_dual", 12), _paper("pre_ln", 12), "vs"),
                                effect=verdict(d, claimed_sign=better),
                                metric=metric))
    return out


# ------------------------------------------------------------------------------------------------
# command line


def build_parser():
    """The claims study's options (the grid's and the learning curves')."""
    p = argparse.ArgumentParser(
        prog="claims_study.sh", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The ResiDual paper's warm-up and depth claims tested in training: schemes x conditions x "
                    "seeds on a corpus (default the shipped Ding de->en), mean and standard deviation per cell, one verdict "
                    "per claim. Finished cells are skipped when run again; a larger --updates continues every "
                    "cell from its last checkpoint, and the report gives the claims and the valid nll at every "
                    "budget reached, with a plateau column. --lr-grid adds the per-row learning-rate protocol "
                    "(the claims under both protocols side by side); --rank ranks every row at one condition; "
                    "--learning-curve measures where BLEU stops moving, the measurement the default budget "
                    "comes from.",
        epilog="Cost: see docs/analysis.md (claims study) for the learning curves, the measured CPU-seconds per "
               "update and the arithmetic of the default grid. GPU: --device cuda --width 256 --jobs 8 runs the "
               "cells side by side on one GPU.")
    p.add_argument("--conditions", type=options.name_list(list(CONDITIONS), "condition"),
                   default=["warm6", "nowarm6", "warm12"],
                   help=f"conditions to run, from {', '.join(CONDITIONS)} (default warm6,nowarm6,warm12)")
    p.add_argument("--seeds", type=grid.int_list, default=[1, 2, 3],
                   help="seeds per cell (default 1,2,3; at least 3 for a verdict worth reading)")
    p.add_argument("--ablations", type=options.name_list(list(ABLATIONS), "ablation", empty=True), default=[],
                   help="ablation rows to add, comma-separated, from " + "; ".join(
                       f"{k}: {a['what']} ({a['args']})" for k, a in ABLATIONS.items()) + " (default none)")
    p.add_argument("--device", type=options.device, default="cpu",
                   help="cpu (default; one thread per run) or cuda (every run on one GPU, side by side)")
    p.add_argument("--analyze-batches", type=options.positive_int, default=2,
                   help="valid batches for the end-of-training diagnostics (default 2)")
    p.add_argument("--learning-curve", action="store_true",
                   help="measure where BLEU stops moving instead of running the grid: one long run per scheme "
                        "of --schemes (the first of --conditions and of --seeds) with a checkpoint every "
                        "--curve-every updates, each translated and scored (learning_curve.md/json/png)")
    p.add_argument("--curve-every", type=options.positive_int, default=DEFAULT_CURVE_EVERY,
                   help=f"with --learning-curve: updates between checkpoints (default {DEFAULT_CURVE_EVERY})")
    p.add_argument("--lr-grid", type=options.float_list, default=None, metavar="LRS",
                   help="the per-row learning-rate protocol: peak learning rates to choose from, fixed in advance "
                        "(e.g. 5e-4,1e-3,2e-3,4e-3). Each row is trained at every one on --select-seed for "
                        "--select-updates updates at the warm-up condition of each depth; the lowest valid nll "
                        "wins (a diverged run never wins; equal nll: the smaller rate), then --tune-seeds train at "
                        "the chosen rate for --updates. The grid at --lr is trained too, and the report puts the "
                        "claims of both protocols side by side (default: --lr for every row only)")
    p.add_argument("--select-seed", type=options.nonnegative_int, default=1,
                   help="with --lr-grid: the seed the learning rate is chosen on (default 1)")
    p.add_argument("--select-updates", type=options.positive_int, default=DEFAULT_UPDATES,
                   help=f"with --lr-grid: the budget the learning rate is chosen at (default {DEFAULT_UPDATES})")
    p.add_argument("--tune-seeds", type=grid.int_list, default=[2, 3, 4],
                   help="with --lr-grid: the fresh seeds trained at each row's chosen rate (default 2,3,4; "
                        "not --select-seed)")
    p.add_argument("--rank", choices=list(CONDITIONS), default=None, metavar="CONDITION",
                   help="rank the rows of --schemes (all: every registered scheme) at one condition instead "
                        "of testing the claims: mean ± sd of valid nll, BLEU and chrF, diverged seeds, gradient "
                        "ratio, top-layer cosine and the paper's IWSLT14 BLEU per row, best first "
                        "(ranking.md/json/png); with --lr-grid each row at its own chosen rate and --tune-seeds, "
                        "else at --lr and --seeds. E.g. --rank warm12 --schemes all --lr-grid 5e-4,1e-3,2e-3,4e-3")
    p.add_argument("--lr-from", default=None, metavar="RANKING_JSON[,RANKING_JSON...]",
                   help="with --rank, instead of --lr-grid: each row at the learning rate a finished ranking chose "
                        "for it (that study's ranking.json, e.g. docs/results/2026-12-04-ranking/ranking.json; "
                        "several, comma-separated, add up their rows, and must agree on a row they share), to "
                        "train the same rates at another --width or on a GPU (--schemes defaults to every row "
                        "they chose a rate for; one they chose none for is refused)")
    p.add_argument("--archive", default=None, metavar="DIR",
                   help="with --rank: after the report, copy every finished cell's small files (settings, "
                        "training state, results, analysis, validation curve; never checkpoints or logs) and "
                        "ranking.md/json/png into DIR, e.g. a folder of the repository; copying DIR/cells into "
                        "a new --out's cells lets the study resume there, skipping every archived cell")
    p.add_argument("--idle-costs", default=None, metavar="JSON",
                   help="with --rank: the speed benchmark's --out of the cells' shape measured on an idle machine "
                        "(e.g. scripts/speed_benchmark.py --shapes study12 --batch-tokens 1600 --no-generate "
                        "--no-memory, with transformer_pre_ln and the rows in --models); the equal-compute column is "
                        "read a second time at those costs, free of the load the cells ran under")
    grid.add_cell_arguments(
        p, out=DEFAULT_OUT, study_options=STUDY_OPTIONS, updates=DEFAULT_UPDATES, max_tokens=DEFAULT_MAX_TOKENS,
        warmup=DEFAULT_WARMUP,
        bleu_sentences=DEFAULT_BLEU_SENTENCES, lr=DEFAULT_LR, schemes=CLAIM_SCHEMES,
        schemes_help="comma-separated residual schemes, or all for every registered one (default "
                     f"{','.join(CLAIM_SCHEMES)}, the schemes the claims name)")
    return p


def chosen_rates(path):
    """``(condition, {row: learning rate or None})`` of a ranking (its ``ranking.json``): the condition it ranked
    at and the rates it chose (``chosen_lr``: every row with a finished selection; a ranking written before that
    field existed: its ranked rows' ``lr``).

    Raises:
        OSError, ValueError (not JSON or not a ranking), KeyError, TypeError: the file is not a ranking's.
    """
    saved = read_json(path)
    if saved is None:
        raise FileNotFoundError("no such file")
    if not isinstance(saved, dict) or "rows" not in saved or "condition" not in saved:
        raise ValueError("it has no 'rows' or no 'condition'")
    chosen = saved.get("chosen_lr") or {r["row"]: r["lr"] for r in saved["rows"]}
    return saved["condition"], {row: None if lr is None else float(lr) for row, lr in chosen.items()}


def _rates_from(parser, args, given):
    """``--lr-from``: ``{row: rate}`` of the source ranking, checked against this study's options; with
    ``--schemes`` / ``--ablations`` left at their defaults, the rows are those the source chose a rate for."""
    source = args.lr_from
    if not args.rank or args.lr_grid or "--lr" in given:
        parser.error("--lr-from gives each row of a ranking the rate another ranking chose: add --rank "
                     "CONDITION and drop --lr-grid and --lr (which would set the rates otherwise)")
    rates, chosen_by, clashes = {}, {}, {}
    for path in source.split(","):
        try:
            condition, chosen = chosen_rates(path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            parser.error(f"--lr-from {path}: not a ranking's ranking.json ({type(e).__name__}: {e})")
        if condition != args.rank:
            parser.error(f"--lr-from {path} chose its rates at {condition}, not at --rank {args.rank}: a rate "
                         f"chosen at one depth or warm-up does not carry to another; rank at {condition} or use a "
                         f"ranking of {args.rank}")
        for row, lr in chosen.items():
            if lr is None:
                rates.setdefault(row, None)
            elif rates.get(row) not in (None, lr):
                clashes.setdefault(row, f"{chosen_by[row]} chose {rates[row]:g} for {row}, {path} chose {lr:g}")
            else:
                rates[row], chosen_by[row] = lr, path
    rated = [row for row, lr in rates.items() if lr is not None]
    # argparse leaves an option's default object in place when the option is not given (also abbreviated)
    if args.schemes is parser.get_default("schemes"):
        args.schemes = [s for s in ORDER if s in rated]
    if args.ablations is parser.get_default("ablations"):
        args.ablations = [a for a in ABLATIONS if row_key(a) in rated]
    clashing = [clashes[r] for r in grid_rows(args) if r in clashes]
    if clashing:
        parser.error(f"--lr-from: {'; '.join(clashing)}: drop one of the rankings, or those rows from --schemes / "
                     "--ablations")
    missing = [r for r in grid_rows(args) if rates.get(r) is None]
    if missing:
        parser.error(f"--lr-from {source} chose no rate for {', '.join(missing)} (it has one for "
                     f"{', '.join(sorted(rated)) or 'no row'}): drop them from --schemes / --ablations")
    return {r: rates[r] for r in grid_rows(args)}


def parse_args(argv=None):
    """The parsed options, with ``argv`` (the command line as given, for the reports) and ``device_args``
    (fairseq's device options) added."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    protocol_only = sorted(given & {"--select-seed", "--select-updates", "--tune-seeds"})
    if protocol_only and not args.lr_grid:
        parser.error(f"{', '.join(protocol_only)} belong(s) to the learning-rate protocol and would be ignored "
                     "without --lr-grid: add --lr-grid (e.g. --lr-grid 1e-3,2e-3,4e-3) or drop them")
    if args.lr_grid and args.select_seed in args.tune_seeds:
        parser.error(f"--tune-seeds {','.join(map(str, args.tune_seeds))} holds --select-seed {args.select_seed}: "
                     "the seeds at the chosen rate must be fresh (the choice was made on that seed)")
    args.lr_by_row = _rates_from(parser, args, given) if args.lr_from else None
    if args.idle_costs and not args.rank:
        parser.error("--idle-costs reads the equal-compute column of a ranking: add --rank CONDITION or drop it")
    args.idle = None
    if args.idle_costs:
        from .speed_compare import training_time_ratios

        try:
            args.idle = training_time_ratios(args.idle_costs)
        except (OSError, ValueError, KeyError) as e:
            parser.error(f"--idle-costs {args.idle_costs}: {e}")
    if args.rank:
        args.conditions = [args.rank]
    args.argv = argv
    args.device_args = () if args.device == "cuda" else ("--cpu",)
    return args


__all__ = ["ABLATIONS", "CLAIM_SCHEMES", "CONDITIONS", "build_parser", "cell_args", "cell_metrics", "claims",
           "grid_rows", "parse_args", "read_cell", "resolve", "row_color", "row_key", "row_label"]

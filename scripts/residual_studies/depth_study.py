"""Depth-scaling study: every registered scheme at several depths, same update budget, CPU.

Entry point: ``scripts/depth_study.sh`` (run with ``--help`` for the options). For every residual
scheme and every depth L (layers per stack, default 6, 12, 24, 48) it trains a narrow
``residual_transformer`` (default width 64, FFN 128, 4 heads) on the shipped Ding German->English
corpus for the same number of updates with the same recipe, then records

* the valid loss and nll loss (fairseq's end-of-training validation on the whole valid split,
  bits per target token),
* sacreBLEU (and chrF) of ``fairseq-generate`` translations of the first ``--bleu-sentences`` test
  sentences, detokenized with the sentencepiece model and scored against the raw references,
* the per-layer gradient-norm ratio (encoder layer 1 / top layer, ``--task
  translation_with_grad_norms``) at the last logged update, and the wall time.

A run that breaks is reported, not dropped: ``diverged`` when fairseq stops on NaN/Inf gradients
(``FloatingPointError``), a loss-scale or other "exceeded" fatal error, or ends with a NaN valid loss
or a valid nll loss above the uniform guess log2(|V|) while the training loss did not fall (the loss
exploded); ``failed`` for any other
error (its message is kept).

Output (default ``~/fairseq-residual-runs/depth_study/``, :data:`residual_studies.RUNS`)::

    data/                       sentencepiece model + binarized corpus (:mod:`.data`, the demo's
                                preparation) and data/bleu-test-N/ (BLEU subset)
    cells/<scheme>-L<depth>-w<width>-<hash>/
                                train-u<updates>.log (one per training segment), checkpoint_last.pt,
                                train_state.json, budgets/u<updates>/ (result.json, checkpoint.pt,
                                generate-test.txt)
    results.md, results.json, quality_vs_depth.png

The hash covers every setting but the number of updates. Finished cells (the budget's
``result.json`` present) are skipped, so an interrupted study resumes where it stopped, ``--depths`` /
``--schemes`` can be extended later without redoing anything, and a larger ``--updates`` continues
every cell from its last checkpoint instead of training it again (:func:`.cell.run`).
``--report-only`` rebuilds the tables and the plot.
Errors meant for the user are printed as ``ERROR: ...`` with exit status 2.
"""

import argparse
import datetime
import math
import os
import shlex
import sys
import time

from . import RUNS, cell, grid, options
from .data import corpus_label
from .files import read_json, write_json
from .report import LABELS, fmt, fmtg, plot_against_depth, scoring_text
from .runner import ToolError, loadavg, logger

DEFAULT_OUT = os.path.join(RUNS, "depth_study")
#: the depth study's option behind each setting of a cell (:func:`.cell.check_extra_args`)
STUDY_OPTIONS = dict(scheme="--schemes", depth="--depths", width="--width", ffn_dim="--ffn-dim", heads="--heads",
                     seed="--seed", lr="--lr", warmup="--warmup", max_tokens="--max-tokens", updates="--updates",
                     dropout="--dropout", clip_norm="--clip-norm", out="--out", user_dir="--user-dir",
                     log_interval="--log-interval")
log = logger("depth-study")


# ------------------------------------------------------------------------------------------------
# report


def write_report(args, data, results, wall_s):
    by = {(r["settings"]["scheme"], r["settings"]["depth"]): r for r in results}
    schemes = [s for s in args.schemes if any(k[0] == s for k in by)]
    depths = sorted({k[1] for k in by})
    any_s = results[0]["settings"]
    sig = next((r["scores"].get("bleu_signature") for r in results if r.get("scores")
                and r["scores"].get("bleu_signature")), None)

    def cell_text(r):
        if r is None:
            return "not run"
        bleu = r["scores"].get("bleu") if r.get("scores") else None
        nll = r["stats"].get("valid_nll_loss")
        if r["status"] == "ok":
            return f"{fmt(bleu)} / {fmt(nll)}"
        return f"**{r['status']}**" + (f" ({fmt(bleu)} / {fmt(nll)})" if bleu is not None else "")

    head = "| layers per stack | " + " | ".join(LABELS[s] for s in schemes) + " |\n"
    head += "|---:|" + "---|" * len(schemes) + "\n"
    pivot = head + "".join(
        f"| {d} | " + " | ".join(cell_text(by.get((s, d))) for s in schemes) + " |\n" for d in depths)

    detail = ("| scheme | layers | status | updates | valid loss | valid nll | BLEU | chrF | enc grad L1/top | "
              "dec grad L1/top | train s (CPU s) | translate s (CPU s) | note |\n"
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
    for d in depths:
        for s in schemes:
            r = by.get((s, d))
            if r is None:
                continue
            st, sc = r["stats"], r.get("scores") or {}
            detail += (f"| {LABELS[s]} | {d} | {r['status']} | {r.get('reached', r['settings']['updates'])} | "
                       f"{fmt(st.get('valid_loss'))} | "
                       f"{fmt(st.get('valid_nll_loss'))} | {fmt(sc.get('bleu'))} | {fmt(sc.get('chrf'))} | "
                       f"{fmtg(st.get('grad_norm_low_top_enc'))} | {fmtg(st.get('grad_norm_low_top_dec'))} | "
                       f"{r['train_s']:.0f} ({fmt(r.get('train_cpu_s'), 0)}) | "
                       f"{fmt(sc.get('translate_s'), 0)} ({fmt(sc.get('translate_cpu_s'), 0)}) | "
                       f"{(r['reason'] or '').replace('|', '/')} |\n")
    command = "scripts/depth_study.sh " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    cell_wall = sum(r.get("train_s") or 0 for r in results)
    cpus = [r.get("train_cpu_s") for r in results]
    cell_cpu = None if None in cpus else sum(cpus)  # cells of older versions did not record it
    short = cell.shortfall(results)
    budget_note = (f" ({len(short)} of {len(results)} cells stopped before {any_s['updates']} updates: the "
                   f"updates column)" if short else "")
    text = (
        f"# Depth-scaling study: {' vs '.join(LABELS[s] for s in schemes)}\n\n"
        f"Command: `{command}`  \n"
        f"Date: {datetime.datetime.now():%Y-%m-%d %H:%M}; {os.cpu_count()} CPU cores, {args.jobs} job(s) "
        f"of {args.threads or 'default'} thread(s); load average at the end {loadavg()}; this "
        f"invocation {wall_s / 60:.1f} min; the cells' training took {cell_wall / 60:.1f} min wall"
        + (f", {cell_cpu / 60:.1f} CPU-min" if cell_cpu is not None else "")
        + " (translation not included).\n\n"
        f"Setup: {corpus_label(args.data)}, joint sentencepiece vocabulary "
        f"{args.vocab_size}; residual_transformer L+L layers, width {any_s['width']}, FFN "
        f"{any_s['ffn_dim']}, {any_s['heads']} heads, dropout {any_s['dropout']}, shared embeddings; Adam "
        f"(0.9, 0.98), lr {any_s['lr']} (inverse_sqrt, {any_s['warmup']} warm-up updates from 1e-7), "
        f"clip-norm {any_s['clip_norm']}, weight decay 1e-4, label smoothing 0.1, max_tokens "
        f"{any_s['max_tokens']}, **{any_s['updates']} updates for every cell**{budget_note}, seed {any_s['seed']}, "
        f"CPU, fp32.\n\n"
        f"BLEU: {scoring_text(results)} Valid loss / nll: fairseq's "
        f"validation on all 1000 valid pairs after the last update, bits per target token. Grad "
        f"L1/top: gradient norm of layer 1's parameters / the top layer's at the last logged update "
        f"(`--task translation_with_grad_norms`). Times: wall-clock seconds on a possibly shared "
        f"machine, and the CPU seconds the process used (user + system; comparable across loads).\n\n"
        f"A cell is **diverged** (the project's one rule, scripts/residual_studies/divergence.py) when "
        f"training stopped on a NaN/inf loss, NaN/Inf gradients, the fp16 minimum loss scale or a fatal "
        f"'exceeded' error, or ended with a NaN valid loss or a valid nll above log2(|V|) = "
        f"{math.log2(data['vocab']):.2f} bits (worse than a uniform guess) while the training loss did not "
        f"fall; **failed** for other errors.\n\n"
        f"## BLEU / valid nll loss by depth\n\n{pivot}\n"
        f"## All numbers\n\n{detail}\n"
        f"Plot: `quality_vs_depth.png`\n")
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    write_json(os.path.join(args.out, "results.json"), dict(
        command=command, date=datetime.datetime.now().isoformat(timespec="seconds"),
        wall_s=round(wall_s, 1), vocab=data["vocab"], bleu_sentences=data["bleu_sentences"],
        bleu_signature=sig, cells=results))
    plot(schemes, depths, by, os.path.join(args.out, "quality_vs_depth.png"), any_s)
    return pivot


def plot(schemes, depths, by, path, s):
    panels = [("BLEU (sacreBLEU, test subset)", lambda r: (r.get("scores") or {}).get("bleu")),
              ("valid nll loss (bits / token)", lambda r: r["stats"].get("valid_nll_loss"))]
    plot_against_depth(schemes, depths, by, path, panels,
                       f"Quality against depth: width {s['width']}, FFN {s['ffn_dim']}, {s['updates']} updates "
                       f"of {s['max_tokens']} tokens, lr {s['lr']}, warm-up {s['warmup']}\n"
                       "(x below the dotted line: the run diverged or failed, see results.md)")


# ------------------------------------------------------------------------------------------------


#: measured cost of the default grid per cell (CPU-minutes, averaged over the depths 6, 12, 24 and 48 at 300
#: updates; 115 CPU-minutes for the 12 cells of three schemes, docs/analysis.md "Timing and the full run")
CPU_MIN_PER_DEFAULT_CELL = 115 / 12
DEFAULT_DEPTHS = [6, 12, 24, 48]


def build_parser():
    n_cells = len(grid.SCHEMES) * len(DEFAULT_DEPTHS)
    p = argparse.ArgumentParser(
        prog="depth_study.sh", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train residual_transformer models of every registered scheme at several depths "
                    "for the same number of updates on the Ding de->en corpus (CPU); report valid loss, "
                    "sacreBLEU and divergence as a Markdown table, JSON and a plot. Finished cells are "
                    "skipped when run again.",
        epilog=f"Default grid: every registered scheme ({len(grid.SCHEMES)}) x {len(DEFAULT_DEPTHS)} depths x 300 "
               f"updates = {n_cells} cells, about {CPU_MIN_PER_DEFAULT_CELL * n_cells:.0f} CPU-minutes (about "
               f"{CPU_MIN_PER_DEFAULT_CELL:.1f} per cell, measured), half that in wall time on 2 idle cores with the "
               "default --jobs 2 --threads 1. Larger grid, e.g.: depth_study.sh --depths 6,12,24,48,96 --updates "
               "2000 --warmup 400 --width 128 --jobs 8 on a bigger machine")
    p.add_argument("--depths", type=grid.int_list, default=list(DEFAULT_DEPTHS),
                   help="layers per stack, comma-separated (default: 6,12,24,48)")
    p.add_argument("--seed", type=options.nonnegative_int, default=1,
                   help="the seed of every cell (fairseq's --seed; one seed: the claims study runs several)")
    grid.add_cell_arguments(p, out=DEFAULT_OUT, study_options=STUDY_OPTIONS)
    return p


def study(args):
    """The study of the parsed options ``args`` (see the module docstring); returns the exit status."""
    t0 = time.time()
    data = grid.start(args, log)
    cells = [(s, d) for d in args.depths for s in args.schemes]
    if args.dry_run:
        print(f"{len(cells)} cells of {args.updates} updates, deepest first")
        for s, d in sorted(cells, key=lambda c: -c[1]):  # the order grid.run trains them in
            st = cell.settings(args, s, d, data)
            run_dir = cell.folder(args.out, st)
            print(f"{run_dir}\n  " + " ".join(shlex.quote(c) for c in cell.train_command(args, st, data["bin"], run_dir)))
        return 0
    if args.report_only:
        results = [read_json(cell.result_path(args.out, cell.settings(args, s, d, data))) for s, d in cells]
        results = [r for r in results if r]
        if not results:
            raise ToolError(f"no finished cell with these settings under {args.out}/cells")
    else:
        log(f"{len(cells)} cells: schemes {','.join(args.schemes)} x depths "
            f"{','.join(map(str, args.depths))}, {args.updates} updates each, {args.jobs} job(s)")
        results = grid.run(lambda c: cell.run(args, data, *c), cells, args.jobs, first=lambda c: -c[1])
    pivot = write_report(args, data, results, time.time() - t0)
    print("\n" + pivot)
    log(f"wrote {os.path.join(args.out, 'results.md')}, results.json and quality_vs_depth.png "
        f"({(time.time() - t0) / 60:.1f} min)")
    return 0


def main(argv=None):
    args = build_parser().parse_args(argv)
    return grid.main(lambda: study(args), log)


if __name__ == "__main__":
    sys.exit(main())

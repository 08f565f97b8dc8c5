"""Turn a grid of benchmark runs into Markdown tables shaped like the paper's.

Reads the run directories that ``scripts/train.sh`` makes (``SAVE_ROOT/<benchmark>/<scheme>-<N>L-
seed<K>/``) and the result JSON that ``scripts/evaluate.sh`` writes in them
(``eval/<subset>.json``), and prints, per benchmark and per metric, a table with one row per
residual scheme and one column per depth (N encoder + N decoder layers); a cell is the mean ± sample
standard deviation (n-1) of the metric over the seeds.

Runs that diverged are kept, not dropped: a run counts as diverged by the project's one rule
(:mod:`.divergence`): its training logs (``hydra_train.log``, ``train.log``,
``slurm-*.out``) show a NaN/inf loss, fairseq's ``Minimum loss scale reached`` (fp16), NaN/Inf
gradients, a fatal ``exceeded`` error or ``NaN detected``. A run whose training crashed without such a sign
(a traceback or error after the last ``done training``: out of memory, a wrong option, a lost node) and left no
final checkpoint (``checkpoint_last.pt``) counts as **failed**, named by its error line: a failure of the
machine or the command, not of the scheme. A cell then reads e.g. ``35.10 ± 0.12 (n=2; 1/3 diverged)``, or
``diverged (3/3)`` / ``failed (1/3); diverged (2/3)`` when no seed finished; runs without results and without
either are ``incomplete`` (still training, or not evaluated yet), and ``–`` marks a grid point without any run.

Beside each depth's column, the tables of the metric the paper's numbers are comparable with
(:data:`PAPER_METRICS`: IWSLT14's tokenized BLEU, WMT14's sacreBLEU averaged over newstest2010-2016, OPUS-100's
per-direction averages) show the number the ResiDual paper reports for the same scheme and depth
(``fairseq_residual/paper_results.json``: as reported in arXiv 2304.14802, transcribed) and the difference
``Δ`` = your mean − paper, with both BLEU types labelled above the table; the other metrics' tables have no paper
columns.

Usage::

    python scripts/collect_results.py runs/iwslt14 [runs/wmt14 ...] [--metric tokenized_bleu]
        [--schemes post_ln,pre_ln,resi_dual --depths 6,12 --seeds 1,2,3] [--out table.md]
        [--json runs.json] [--paper-table no_warmup]
"""
import argparse
import json
import math
import os
import statistics
import sys

from fairseq_residual.paper_results import FAIL, describe, paper_bleu
from fairseq_residual.paper_results import load as paper_data

from .commands import parse_run_name
from .divergence import run_dir_divergence, run_dir_failure
from .report import LABELS, ORDER

SCHEME_ORDER = ORDER
SCHEME_LABEL = LABELS
#: per benchmark, the metrics (``eval/<subset>.json``'s names, :mod:`.bleu`) the paper's numbers are comparable
#: with, each with the direction of the paper's table it is read against (None: its main table)
PAPER_METRICS = {
    "iwslt14": {"tokenized_bleu": None},
    "wmt14": {"sacrebleu_newstest2010_2016_avg": None},
    "opus100": {"sacrebleu_en_xx_avg": "en-xx", "sacrebleu_xx_en_avg": "xx-en"},
}


def read_run(run_dir, subset="test"):
    """One run: identity from the directory name, status, and its metrics.

    Returns:
        dict with scheme, layers, seed, run_dir, status ('ok', 'diverged', 'failed', 'incomplete'),
        reason (diverged, failed) and metrics ({name: {"score", "signature", "description"}}).
    """
    run = dict(parse_run_name(os.path.basename(os.path.normpath(run_dir))), run_dir=run_dir, metrics={},
               reason=None)
    reason = run_dir_divergence(run_dir)
    failure = None if reason else run_dir_failure(run_dir)
    result = os.path.join(run_dir, "eval", f"{subset}.json")
    if os.path.exists(result):
        with open(result, encoding="utf-8") as f:
            data = json.load(f)
        run["metrics"] = {k: v for k, v in data.get("metrics", {}).items()
                          if isinstance(v, dict) and "score" in v}
        run["primary_metric"] = data.get("primary_metric")
        run["evaluated"] = evaluation_settings(data)
        run["evaluated_newstest"] = evaluation_settings(data, newstest=True)
    if reason:
        run["status"], run["reason"] = "diverged", reason
    elif failure:
        run["status"], run["reason"] = "failed", failure
    elif run["metrics"]:
        run["status"] = "ok"
    else:
        run["status"] = "incomplete"
    return run


def evaluation_settings(result, newstest=False):
    """How an evaluation (scripts/evaluate.sh's result JSON) decoded: ``"beam B, lenpen L, max length aX+b,
    <checkpoint>"`` with the checkpoint's file name, or the number of checkpoints averaged; ``newstest``: the
    newstest2010-2016 average's decoding (its beam, a length penalty per year); None when the result does not say
    (or, with ``newstest``, has no such average)."""
    generation, checkpoint = result.get("generation"), result.get("checkpoint")
    if not generation or not checkpoint or not isinstance(generation, dict) or not isinstance(checkpoint, dict):
        return None
    averaged = checkpoint.get("averaged")
    which = (f"the average of {len(averaged)} checkpoints" if averaged else
             os.path.basename(checkpoint.get("path") or "") or "checkpoint unknown")
    if newstest:
        years = result.get("newstest_average_generation")
        return f"beam {years.get('beam')}, lenpen per year, {which}" if isinstance(years, dict) else None
    return (f"beam {generation.get('beam')}, lenpen {generation.get('lenpen')}, max length "
            f"{generation.get('max_len_a')}x+{generation.get('max_len_b')}, {which}")


def find_runs(roots, subset="test"):
    """Runs under each root, grouped by benchmark (the name of the directory holding the runs).

    A root may be a benchmark directory (SAVE_ROOT/iwslt14) or a save root holding several.
    """
    by_bench = {}
    for root in roots:
        if not os.path.isdir(root):
            raise FileNotFoundError(f"{root} is not a directory")
        candidates = [root] + sorted(
            os.path.join(root, d) for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))
        )
        for parent in candidates:
            for name in sorted(os.listdir(parent)):
                path = os.path.join(parent, name)
                if os.path.isdir(path) and parse_run_name(name):
                    bench = os.path.basename(os.path.normpath(parent))
                    runs = by_bench.setdefault(bench, [])
                    if any(os.path.basename(r["run_dir"]) == name for r in runs):
                        print(f"collect_results.py: WARNING: {bench}/{name} appears twice "
                              f"(also {path}); both are counted", file=sys.stderr)
                    runs.append(read_run(path, subset))
    return by_bench


def _fmt(values):
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def ok_scores(runs, metric):
    """The finite scores of ``metric`` of the runs that finished without diverging."""
    return [r["metrics"][metric]["score"] for r in runs
            if r["status"] == "ok" and metric in r["metrics"]
            and math.isfinite(r["metrics"][metric]["score"])]


def paper_cells(bench, scheme, layers, scores, direction=None, warmup=True):
    """The paper's number for (bench, scheme, layers[, direction]; ``warmup`` False: its no-warm-up table) and the
    difference of the mean of ``scores``."""
    paper = paper_bleu(bench, scheme, layers, warmup=warmup, direction=direction)
    if paper is None:
        return "–", "–"
    if paper == FAIL:
        return "fail", "–"
    delta = f"{statistics.mean(scores) - paper:+.2f}" if scores else "–"
    return f"{paper:.2f}", delta


def cell(runs, metric, expected_seeds=None):
    """Markdown cell for one (scheme, depth): mean ± std over seeds, with failed and diverged ones counted.

    Args:
        runs: the runs of this cell (any status).
        metric: metric name.
        expected_seeds: seeds of the grid; seeds without a run directory count as incomplete
            (a cell without any run reads '–').
    """
    if not runs:  # not run: part of the grid when its seeds are given
        return f"incomplete (0/{len(set(expected_seeds))})" if expected_seeds else "–"
    seeds = {r["seed"] for r in runs}
    total = max(len(runs), len(seeds | set(expected_seeds or ())))
    ok = ok_scores(runs, metric)
    diverged = sum(r["status"] == "diverged" for r in runs)
    failed = sum(r["status"] == "failed" for r in runs)
    incomplete = sum(r["status"] == "incomplete" for r in runs) + len(set(expected_seeds or ()) - seeds)
    if not ok:
        stopped = [f"{what} ({n}/{total})" for what, n in (("failed", failed), ("diverged", diverged)) if n]
        if stopped:
            return "; ".join(stopped)
        return "incomplete" if incomplete else "–"
    notes = []
    if failed:
        notes.append(f"{failed}/{total} failed")
    if diverged:
        notes.append(f"{diverged}/{total} diverged")
    if incomplete:
        notes.append(f"{incomplete}/{total} incomplete")
    text = _fmt(ok)
    if len(ok) != total or notes:
        notes.insert(0, f"n={len(ok)}")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def metric_names(runs):
    """Metrics found in the runs' results, primary metric first."""
    names = []
    for r in runs:
        if r.get("primary_metric") and r["primary_metric"] not in names:
            names.append(r["primary_metric"])
    for r in runs:
        for k in r["metrics"]:
            if k not in names:
                names.append(k)
    return names


def table(bench, runs, metric, schemes=None, depths=None, seeds=None, warmup=True):
    """Markdown table for one benchmark and metric: rows schemes, columns depths; ``warmup`` False: beside the
    paper's warm-up ablation (IWSLT14 without warm-up) instead of its main table."""
    schemes = schemes or sorted({r["scheme"] for r in runs},
                                key=lambda s: (SCHEME_ORDER.index(s) if s in SCHEME_ORDER else 99, s))
    depths = depths or sorted({r["layers"] for r in runs})
    described = [r["metrics"][metric] for r in runs if metric in r["metrics"]]
    desc = described[0].get("description", "") if described else ""
    signatures = sorted({m.get("signature", "") for m in described} - {""})
    lines = [f"### {bench}: {metric}", ""]
    if desc:
        lines.append(f"{desc}.")
    if signatures:
        lines.append("Signature: " + "; ".join(f"`{s}`" for s in signatures) + ".")
    lines.append("Mean ± sample standard deviation over seeds; failed and diverged runs are counted, not dropped.")
    settings = {}  # how the runs of this table were decoded
    key = "evaluated_newstest" if metric.startswith("sacrebleu_newstest") else "evaluated"
    for r in runs:
        if metric in r["metrics"] and r["scheme"] in schemes and r["layers"] in depths and (
                not seeds or r["seed"] in seeds):
            settings.setdefault(r.get(key) or "settings not recorded", []).append(os.path.basename(r["run_dir"]))
    if len(settings) == 1:
        lines.append(f"Decoded with {next(iter(settings))}.")
    elif settings:  # runs decoded differently: their cells are not like for like
        lines.append("**Decoded with different settings, so these cells do not compare like for like:** " + "; ".join(
            f"{how} ({', '.join(f'`{n}`' for n in sorted(names))})" for how, names in sorted(settings.items()))
            + ". Evaluate every run the same way (scripts/evaluate.sh with the same options).")
    comparable = PAPER_METRICS.get(bench, {})
    paper = describe(bench) if metric in comparable else None
    direction = comparable.get(metric)
    if paper and not warmup and not paper_data()["benchmarks"].get(bench, {}).get("no_warmup"):
        paper = None
        lines.append(f"No paper column: the paper has no table without warm-up for {bench}.")
    if paper:
        lines.append(paper + (f" Read against its {direction} column." if direction else "")
                     + (" Its table without warm-up (the warm-up ablation)." if not warmup else "")
                     + " Δ = the mean of your runs − the paper's number.")
    elif comparable:
        lines.append(f"No paper column: the paper's numbers are comparable with {', '.join(comparable)} only.")
    lines.append("")
    header = [f"{n}+{n} layers" + (f" | paper {n}+{n} | Δ" if paper else "") for n in depths]
    lines.append("| scheme | " + " | ".join(header) + " |")
    lines.append("|---|" + "---|" * (len(depths) * (3 if paper else 1)))
    for s in schemes:
        row = []
        for n in depths:
            here = [r for r in runs if r["scheme"] == s and r["layers"] == n]
            row.append(cell(here, metric, seeds))
            if paper:
                row.extend(paper_cells(bench, s, n, ok_scores(here, metric), direction, warmup))
        lines.append(f"| {SCHEME_LABEL.get(s, s)} | " + " | ".join(row) + " |")
    lines.append("")
    return "\n".join(lines)


def report(by_bench, metrics=None, schemes=None, depths=None, seeds=None, warmup=True):
    """All tables, then the list of failed, diverged and incomplete runs."""
    parts = []
    for bench in sorted(by_bench):
        runs = by_bench[bench]
        for metric in metrics or metric_names(runs) or ["(no results)"]:
            parts.append(table(bench, runs, metric, schemes, depths, seeds, warmup))
        bad = [r for r in runs if r["status"] != "ok" and (not schemes or r["scheme"] in schemes)
               and (not depths or r["layers"] in depths) and (not seeds or r["seed"] in seeds)]
        if bad:
            parts.append(f"Runs of {bench} not in the means:\n")
            for r in sorted(bad, key=lambda r: (r["scheme"], r["layers"], r["seed"])):
                why = r["reason"] or "no eval result yet (still training, or not evaluated)"
                parts.append(f"- `{os.path.basename(r['run_dir'])}`: {r['status']}: {why}")
            parts.append("")
    return "\n".join(parts)


def _csv(value, cast=str):
    return [cast(v) for v in value.split(",") if v] if value else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", help="SAVE_ROOT/<benchmark> directories (or SAVE_ROOT)")
    parser.add_argument("--metric", action="append",
                        help="metric to tabulate (repeatable; default: every metric found, primary first)")
    parser.add_argument("--subset", default="test", help="which eval/<subset>.json (default: test)")
    parser.add_argument("--schemes", help="rows, comma separated (default: those found)")
    parser.add_argument("--depths", help="columns, comma separated (default: those found)")
    parser.add_argument("--seeds", help="the grid's seeds: missing ones count as incomplete")
    parser.add_argument("--paper-table", choices=["main", "no_warmup"], default="main",
                        help="the paper's numbers to show: its main tables, or its IWSLT14 warm-up ablation "
                             "(runs trained with --extra lr_scheduler.warmup_updates=1)")
    parser.add_argument("--out", help="write the Markdown here (default: stdout)")
    parser.add_argument("--json", help="also write every run's status and metrics here")
    args = parser.parse_args(argv)

    try:
        by_bench = find_runs(args.roots, args.subset)
    except FileNotFoundError as e:
        sys.exit(f"collect_results.py: error: {e}: give SAVE_ROOT/<benchmark> folders (or SAVE_ROOT)")
    if not by_bench:
        sys.exit(f"collect_results.py: error: no run directories (<scheme>-<N>L-seed<K>) under {args.roots}")
    text = report(by_bench, args.metric, _csv(args.schemes), _csv(args.depths, int),
                  _csv(args.seeds, int), warmup=args.paper_table == "main")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(by_bench, f, indent=2)
            f.write("\n")
    return by_bench


if __name__ == "__main__":
    main()

"""The claims study: the ResiDual paper's two largest effects, tested in training with seeds.

Entry point: ``scripts/claims_study.sh`` (``--help`` for the options; :mod:`.claims` holds the claims, the
conditions, the ablations and the options). It trains every (row, condition, seed) of the grid as a
:mod:`.cell` (the depth study's cells: same data preparation, recipe, divergence rule and scoring), adds
the diagnostics of ``fairseq-residual-analyze`` on each final checkpoint (per-layer gradient ratio,
last-layer cosine), and reports mean ± sd per (row, condition) and one verdict per claim
(:mod:`.claims_report`).

Output (default ``runs/claims_study/``): ``data/``, ``cells/`` (one folder per scheme x condition x seed,
with the cell's files plus ``analysis/analysis.json`` per budget), and ``results.md``, ``results.json``,
``claims.png``. Finished cells are skipped: an interrupted study resumes where it stopped; a larger
``--updates`` continues every cell, and the report then lists the claims at every budget the grid reached;
``--report-only`` rebuilds the report.
"""
import os
import time

from . import cell, grid
from .claims import CONDITIONS, budgets_of_grid, cell_args, grid_rows, read_cell, resolve
from .claims_report import write_report
from .files import write_json
from .runner import ToolError, logger

log = logger("claims-study")


def run_one(args, data, row, condition, seed):
    """One cell of the grid, trained (or reused) and analysed: its result with ``scheme`` (the row),
    ``condition`` and ``seed``."""
    ns, depth = cell_args(args, condition, seed, row)
    result = cell.run(ns, data, resolve(row)[0], depth, label=f"{row} {condition} seed {seed}")
    bdir = cell.budget_dir(os.path.join(args.out, "cells", result["cell"]), result["budget"])
    if "diagnostics" not in result:
        result["diagnostics"] = cell.analyze(args, data, bdir)
        write_json(os.path.join(bdir, "result.json"), result)
    return dict(result, scheme=row, condition=condition, seed=seed)


def study(args):
    """The grid of the parsed options ``args`` (:func:`.claims.parse_args`); returns the exit status."""
    t0 = time.time()
    data = grid.start(args, log)
    rows = grid_rows(args)
    cells = [(r, c, k) for c in args.conditions for r in rows for k in args.seeds]
    if args.dry_run:
        for r, c, k in cells:
            ns, depth = cell_args(args, c, k, r)
            print(f"{r} {c} seed {k}: {cell.folder(args.out, cell.settings(ns, resolve(r)[0], depth, data))}")
        return 0
    if args.report_only:
        results = [r for r in (read_cell(args, data, *c) for c in cells) if r]
        if not results:
            raise ToolError(f"no finished cell with these settings under {args.out}/cells")
    else:
        log(f"{len(cells)} cells: {', '.join(rows)} x conditions {','.join(args.conditions)} x seeds "
            f"{','.join(map(str, args.seeds))}, {args.updates} updates each, {args.jobs} job(s)")
        # deepest first packs the jobs better
        results = grid.run(lambda c: run_one(args, data, *c), cells, args.jobs,
                           first=lambda c: -CONDITIONS[c[1]][0])
    by_budget = {}
    for b in budgets_of_grid(args, data, cells):
        found = [read_cell(args, data, *c, updates=b) for c in cells]
        by_budget[b] = {(r["scheme"], r["condition"], r["seed"]): r for r in found if r}
    text = write_report(args, results, time.time() - t0, by_budget)
    print("\n" + text)
    log(f"wrote {os.path.join(args.out, 'results.md')}, results.json and claims.png "
        f"({(time.time() - t0) / 60:.1f} min)")
    return 0


def main(args):
    """:func:`study` with the user's errors and Ctrl-C handled (:func:`.grid.main`)."""
    return grid.main(lambda: study(args), log)

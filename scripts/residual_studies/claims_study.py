"""The claims study: the ResiDual paper's two largest effects, tested in training with seeds.

Entry point: ``scripts/claims_study.sh`` (``--help`` for the options; :mod:`.claims` holds the claims, the
conditions, the ablations and the options). It trains every (row, condition, seed) of the grid as a
:mod:`.cell` (the depth study's cells: same data preparation, recipe, divergence rule and scoring), adds
the diagnostics of ``fairseq-residual-analyze`` on each final checkpoint (per-layer gradient ratio,
last-layer cosine), and reports mean ± sd per (row, condition) and one verdict per claim
(:mod:`.claims_report`).

Output (default ``~/fairseq-residual-runs/claims_study/``, :data:`residual_studies.RUNS`): ``data/``, ``cells/`` (one folder per scheme x condition x seed,
with the cell's files plus ``analysis/analysis.json`` per budget), and ``results.md``, ``results.json``,
``claims.png``. Finished cells are skipped: an interrupted study resumes where it stopped; a larger
``--updates`` continues every cell, and the report then lists the claims and the valid nll (with the plateau
rule, :func:`.claims_report.plateau`) at every budget the grid reached; ``--report-only`` rebuilds the report.
``--lr-grid`` adds the per-row learning-rate protocol (:mod:`.lr_protocol`: selection, then fresh seeds at each
row's chosen rate; the report puts the claims of both protocols side by side); ``--rank CONDITION`` ranks the
rows at one condition instead (:mod:`.ranking`: ``ranking.md``, ``ranking.json``, ``ranking.png``).
"""
import os
import time

from . import cell, grid, lr_protocol, ranking
from .claims import CONDITIONS, budgets_of_grid, cell_args, grid_rows, read_cell, resolve
from .claims_report import write_report
from .files import write_json
from .runner import ToolError, logger

log = logger("claims-study")


def run_one(args, data, row, condition, seed, lr=None, updates=None):
    """One cell of the grid, trained (or reused) and analysed: its result with ``scheme`` (the row),
    ``condition`` and ``seed`` (``lr``: the peak learning rate, default ``--lr``; ``updates``: the budget,
    default ``--updates``)."""
    ns, depth = cell_args(args, condition, seed, row, lr)
    if updates is not None:
        ns.updates = updates
    label = f"{row} {condition} seed {seed}" + ("" if lr in (None, args.lr) else f" lr {lr:g}")
    result = cell.run(ns, data, resolve(row)[0], depth, label=label)
    bdir = cell.budget_dir(os.path.join(args.out, "cells", result["cell"]), result["budget"])
    if "diagnostics" not in result:
        result["diagnostics"] = cell.analyze(args, data, bdir)
        write_json(os.path.join(bdir, "result.json"), result)
    return dict(result, scheme=row, condition=condition, seed=seed)


def _cells(args, data, cells, updates=None):
    """The results of ``cells`` (``(row, condition, seed, lr)``, lr None: ``--lr``): read back with
    ``--report-only`` (missing ones left out), else trained with ``--jobs`` jobs, deepest first. A cell
    listed twice (the fixed protocol's cell at the chosen rate) is trained once."""
    if args.report_only:
        found = [read_cell(args, data, *c[:3], updates=updates, lr=c[3]) for c in cells]
        return [r for r in found if r]
    unique = list(dict.fromkeys((r, c, k, args.lr if lr is None else lr) for r, c, k, lr in cells))
    done = dict(zip(unique, grid.run(lambda c: run_one(args, data, *c, updates=updates), unique, args.jobs,
                                     first=lambda c: -CONDITIONS[c[1]][0])))
    return [done[r, c, k, args.lr if lr is None else lr] for r, c, k, lr in cells]


def _by_budget(args, data, cells):
    """``{budget: {(row, condition, seed): result}}`` at every budget all ``cells`` reached."""
    out = {}
    for b in budgets_of_grid(args, data, cells):
        found = [read_cell(args, data, *c[:3], updates=b, lr=c[3] if len(c) > 3 else None) for c in cells]
        out[b] = {(r["scheme"], r["condition"], r["seed"]): r for r in found if r}
    return out


def select(args, data, rows):
    """The learning-rate protocol's selection (:mod:`.lr_protocol`): every row at every rate of ``--lr-grid`` on
    ``--select-seed`` for ``--select-updates`` at the warm-up condition of each depth. Returns ``(the
    selection table, {(row, selection condition): (lr, reason)}, the finished selection cells)``."""
    sel = [(r, c, args.select_seed, lr) for c in lr_protocol.selection_conditions(args.conditions)
           for r in rows for lr in args.lr_grid]
    log(f"learning-rate selection: {len(sel)} cells ({', '.join(rows)} x lr {','.join(f'{g:g}' for g in args.lr_grid)}"
        f" at {','.join(lr_protocol.selection_conditions(args.conditions))}, seed {args.select_seed}, "
        f"{args.select_updates} updates)")
    found = _cells(args, data, sel, updates=args.select_updates)
    by = {(r["scheme"], r["condition"], r["settings"]["lr"]): r for r in found}
    return (*lr_protocol.selection_table(rows, args.conditions, args.lr_grid, by), found,
            {folder_name(args, data, *c) for c in sel})


def cell_folder(args, data, row, condition, seed, lr=None):
    """The folder of one cell of this grid (named by its settings' hash, not by its updates; :func:`.cell.folder`)."""
    ns, depth = cell_args(args, condition, seed, row, lr)
    return cell.folder(args.out, cell.settings(ns, resolve(row)[0], depth, data))


def folder_name(args, data, row, condition, seed, lr=None):
    """The name of :func:`cell_folder`."""
    return os.path.basename(cell_folder(args, data, row, condition, seed, lr))


def tuned_cells(args, rows, choices):
    """The protocol's cells: ``(row, condition, seed, chosen lr)`` for every condition and ``--tune-seeds``,
    for the rows whose selection chose a rate."""
    return [(r, c, k, choices[r, lr_protocol.SELECTION_CONDITION[c]][0]) for c in args.conditions for r in rows
            for k in args.tune_seeds if choices[r, lr_protocol.SELECTION_CONDITION[c]][0] is not None]


def study(args):
    """The grid of the parsed options ``args`` (:func:`.claims.parse_args`); returns the exit status."""
    t0 = time.time()
    data = grid.start(args, log)
    rows = grid_rows(args)
    rate = args.lr_by_row or {}  # --lr-from: each row's rate; else --lr (None)
    cells = [(r, c, k) for c in args.conditions for r in rows for k in args.seeds]
    if args.dry_run:
        fixed = [] if args.lr_grid and args.rank else cells  # --rank --lr-grid trains the chosen rates' cells only
        for r, c, k in fixed:
            print(f"{r} {c} seed {k}" + (f" lr {rate[r]:g}" if r in rate else "") +
                  f": {cell_folder(args, data, r, c, k, rate.get(r))}")
        summary = f"{len(fixed)} cells of {args.updates} updates"
        if args.lr_grid:
            selection = [(c, r, lr) for c in lr_protocol.selection_conditions(args.conditions) for r in rows
                         for lr in args.lr_grid]
            for c, r, lr in selection:
                print(f"{r} {c} seed {args.select_seed} lr {lr:g} (selection, {args.select_updates} "
                      f"updates): {cell_folder(args, data, r, c, args.select_seed, lr)}")
            tuned = len(rows) * len(args.conditions) * len(args.tune_seeds)
            print(f"then seeds {','.join(map(str, args.tune_seeds))} of every row and condition at the row's "
                  "chosen learning rate")
            summary = (f"{len(fixed)} cells at lr {args.lr:g}, " if fixed else "") + (
                f"{len(selection)} selection cells of {args.select_updates} updates, then {tuned} at the chosen "
                f"rates of {args.updates} updates")
        print(f"{summary} (a cell already finished under --out is skipped)")
        return 0
    if args.lr_grid:
        return study_protocols(args, data, rows, cells, t0)
    if not args.report_only:
        log(f"{len(cells)} cells: {', '.join(rows)} x conditions {','.join(args.conditions)} x seeds "
            f"{','.join(map(str, args.seeds))}, {args.updates} updates each, {args.jobs} job(s)")
    results = _cells(args, data, [(*c, rate.get(c[0])) for c in cells])
    if not results:
        raise ToolError(f"no finished cell with these settings under {args.out}/cells")
    if args.rank:
        return _write_ranking(args, results, None, t0,
                              {folder_name(args, data, *c, rate.get(c[0])) for c in cells})
    text = write_report(args, results, time.time() - t0, _by_budget(args, data, cells))
    print("\n" + text)
    log(f"wrote {os.path.join(args.out, 'results.md')}, results.json and claims.png "
        f"({(time.time() - t0) / 60:.1f} min)")
    return 0


def study_protocols(args, data, rows, cells, t0):
    """``--lr-grid``: the selection, then the fixed protocol's cells and the chosen rates' cells (only the
    latter with ``--rank``), and the report of both."""
    table, choices, selected, selection_folders = select(args, data, rows)
    print("\n" + table + "\n")
    tuned = tuned_cells(args, rows, choices)
    fixed = [] if args.rank else [(*c, None) for c in cells]
    if not args.report_only:
        log(f"{len(fixed)} cells at lr {args.lr:g} and {len(tuned)} at each row's chosen rate, {args.updates} "
            f"updates each, {args.jobs} job(s)")
    found = _cells(args, data, fixed + tuned)
    results, tuned_results = found[:len(fixed)], found[len(fixed):]
    if not (selected if args.rank else results):
        raise ToolError(f"no finished cell with these settings under {args.out}/cells")
    lr_by_row = {r: choices[r, lr_protocol.SELECTION_CONDITION[c]][0] for r in rows
                 for c in lr_protocol.selection_conditions(args.conditions)}
    if args.rank:
        planned = len(rows) * len(lr_protocol.selection_conditions(args.conditions)) * len(args.lr_grid)
        # the folders of this study's cells, finished or not: its archive copies these, and no other study's
        folders = selection_folders | {folder_name(args, data, *c) for c in tuned}
        return _write_ranking(args, tuned_results, dict(table=table, lr_by_row=lr_by_row, selected=selected,
                                                         planned=planned, rows=rows, tuned=len(tuned)), t0,
                              folders)
    section = dict(table=table, choices={f"{r} {c}": v for (r, c), v in choices.items()}, results=tuned_results,
                   by_budget=_by_budget(args, data, tuned), seeds=args.tune_seeds)
    text = write_report(args, results, time.time() - t0, _by_budget(args, data, cells), protocol=section)
    print("\n" + text)
    log(f"wrote {os.path.join(args.out, 'results.md')}, results.json and claims.png "
        f"({(time.time() - t0) / 60:.1f} min)")
    return 0


def _write_ranking(args, results, tuned, t0, folders):
    """``--rank``: :func:`.ranking.write` of ``results`` (``tuned``: the selection's ``table`` and ``lr_by_row``,
    or None for the fixed rate) and, with ``--archive``, :func:`.ranking.archive` of the cell ``folders`` this
    study plans (a study folder may hold another study's cells too); returns the exit status."""
    note = (f"Each row at its own learning rate, chosen from {','.join(f'{g:g}' for g in args.lr_grid)} on seed "
            f"{args.select_seed} at {args.select_updates} updates (selection below); seeds "
            f"{','.join(map(str, args.tune_seeds))}." if tuned else
            f"Each row at the learning rate the ranking{'s' if ',' in args.lr_from else ''} in "
            f"{' and '.join(args.lr_from.split(','))} chose for it; seeds "
            f"{','.join(map(str, args.seeds))}." if args.lr_by_row else
            f"Every row at lr {args.lr:g}; seeds {','.join(map(str, args.seeds))}.")
    note += f" {args.updates} updates per cell; command: `scripts/claims_study.sh {' '.join(args.argv)}`."
    progress = tuned and _progress(args, tuned, results)
    threads = f"{args.threads} thread{'s' if args.threads != 1 else ''}" if args.threads else "torch's threads"
    cost_basis = f"{threads} per run, {args.jobs} run{'s' if args.jobs != 1 else ''} side by side" + (
        " on one GPU: a process's CPU time stands for its share of the GPU, measured under the others' load"
        if args.device == "cuda" else "")
    text = ranking.write(args.out, results, args.rank, tuned["lr_by_row"] if tuned else args.lr_by_row, note,
                         selection=tuned and tuned["table"], progress=progress, idle=getattr(args, "idle", None),
                         selected=tuned and tuned["selected"], cost_basis=cost_basis)
    print("\n" + text)
    log(f"wrote {os.path.join(args.out, 'ranking.md')}, ranking.json and ranking.png "
        f"({(time.time() - t0) / 60:.1f} min)")
    if args.archive:
        n = ranking.archive(args.out, args.archive, cells=folders)
        log(f"archived {n} finished cells' small files and the ranking in {args.archive}")
    return 0


def _progress(args, tuned, results):
    """The ranking's progress section: cells finished and left, CPU-hours spent, the measured cost per
    update of every row and the projected cost of the final cells (:func:`.ranking.cost_table`)."""
    rows = tuned["rows"]
    table, cost = ranking.cost_table(tuned["selected"], rows, args.updates, len(args.tune_seeds), args.out)
    chosen = sum(lr is not None for lr in tuned["lr_by_row"].values())
    return "\n".join([
        f"Selection cells finished: {len(tuned['selected'])} of {tuned['planned']}; rows with a chosen rate: "
        f"{chosen} of {len(rows)}; final cells finished: {len(results)} of {tuned['tuned']} that can start now "
        f"({len(args.tune_seeds)} per row with a chosen rate; {len(args.tune_seeds) * len(rows)} in all). "
        f"CPU-hours spent on finished cells (training and translation): "
        f"{cost['spent_cpu_h'] + ranking.cpu_hours(results):.2f}; "
        f"the final cells of the rows measured so far, projected from each row's measured cost per update: "
        f"{cost['projected_final_cpu_h']:.1f} CPU-hours.", "", table])


def main(args):
    """:func:`study` with the user's errors and Ctrl-C handled (:func:`.grid.main`)."""
    return grid.main(lambda: study(args), log)

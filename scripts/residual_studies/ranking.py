"""Many schemes at one condition, ranked: the claims study's ``--rank CONDITION`` (``ranking.md``, ``ranking.json``,
``ranking.png``).

One line per row (scheme or ablation) of the grid at the condition: mean ± sample sd over seeds of valid nll
(bits per token), sacreBLEU and chrF, the diverged (or failed) seeds, the layer-1 / top-layer gradient ratio
and the cosine of the last two layer outputs (encoder / decoder, ``fairseq-residual-analyze`` on the final
checkpoint), the learning rate the row trained at, and the paper's IWSLT14 BLEU for the scheme at the
condition's depth where the paper has one (``fairseq_residual/paper_results.json``).

Order (:func:`rank`): rows whose seeds diverged or failed in the majority last; the others by mean valid nll,
lowest first (the metric the cells measure most precisely at this scale), equal means by mean BLEU.
"""
import glob
import math
import os
import shutil

from fairseq_residual import paper_results

from .claims import CONDITIONS, cell_metrics, row_color, row_label
from .files import write_json
from .logs import valid_nll_by_update
from .report import _pyplot, markdown_table
from .stats import mean_sd, ms_text


def rank(results, condition, lr_by_row=None):
    """The ranked rows of ``results`` (claims-study cells) at ``condition``.

    Args:
        lr_by_row: ``{row: learning rate}`` the rows trained at (None: each cell's own setting).

    Returns:
        list of dicts, best first: ``row``, ``label``, ``lr``, ``seeds``, ``diverged``, ``failed``, the
        ``(mean, sd, n)`` of ``valid_nll``, ``bleu``, ``chrf``, ``grad_enc``, ``grad_dec``, ``cos_enc``,
        ``cos_dec``, their texts under ``text``, ``paper`` (the paper's BLEU, ``"fail"`` or None) and ``rank``.
    """
    depth, warm = CONDITIONS[condition]
    rows = []
    for row in dict.fromkeys(r["scheme"] for r in results if r["condition"] == condition):
        cells = [r for r in results if r["scheme"] == row and r["condition"] == condition]
        m = [cell_metrics(r) for r in cells]
        keys = ("valid_nll", "bleu", "chrf", "grad_enc", "grad_dec", "cos_enc", "cos_dec")
        entry = dict(row=row, label=row_label(row), seeds=len(cells),
                     diverged=sum(x["diverged"] for x in m), failed=sum(x["failed"] for x in m),
                     lr=(lr_by_row or {}).get(row, cells[0]["settings"]["lr"]),
                     paper=None if "+" in row else paper_results.paper_bleu("iwslt14", row, depth, warmup=warm),
                     **{k: mean_sd([x[k] for x in m]) for k in keys},
                     text={k: ms_text([x[k] for x in m], 3 if k.startswith("cos") else 2) for k in keys})
        rows.append(entry)

    def order(e):
        broken = 2 * (e["diverged"] + e["failed"]) > e["seeds"]
        nll, bleu = e["valid_nll"][0], e["bleu"][0]
        return (broken or nll is None, nll if nll is not None else math.inf, -(bleu or 0.0))

    rows.sort(key=order)
    for i, e in enumerate(rows, 1):
        e["rank"] = i
    return rows


def table(rows):
    """The ranked rows as a Markdown table."""
    return markdown_table(
        ["rank", "scheme", "lr", "seeds", "diverged", "valid nll", "BLEU", "chrF", "grad L1/top enc / dec",
         "cos top enc / dec", "paper BLEU (IWSLT14)"],
        [[e["rank"], e["label"], f"{e['lr']:g}", e["seeds"],
          f"{e['diverged']}" + (f" (+{e['failed']} failed)" if e["failed"] else ""),
          e["text"]["valid_nll"], e["text"]["bleu"], e["text"]["chrf"],
          f"{e['text']['grad_enc']} / {e['text']['grad_dec']}", f"{e['text']['cos_enc']} / {e['text']['cos_dec']}",
          "-" if e["paper"] is None else str(e["paper"])] for e in rows])


def plot(rows, path, title):
    """Valid nll and BLEU per row in rank order: bars (mean, sd error bars, the scheme's colour), the seeds
    as dots, x for each diverged seed; the paper's BLEU as a hollow diamond on its own axis."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(4 + 0.9 * len(rows), 4.2))
    xs = range(len(rows))
    for ax, key, label in ((axes[0], "valid_nll", "valid nll (bits / token), lower is better"),
                           (axes[1], "bleu", "sacreBLEU, higher is better")):
        for x, e in zip(xs, rows):
            mean, sd, _ = e[key]
            if mean is not None:
                ax.bar(x, mean, 0.7, yerr=sd or 0, color=row_color(e["row"]), capsize=2)
            if e["diverged"]:
                ax.text(x, 0, "×" * e["diverged"], ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([e["label"] for e in rows], rotation=45, ha="right", fontsize=8)
        ax.set_title(label, fontsize=9)
    papers = [(x, e["paper"]) for x, e in zip(xs, rows) if isinstance(e["paper"], float)]
    if papers:
        twin = axes[1].twinx()
        twin.plot(*zip(*papers), "D", mfc="none", color="black", label="paper (IWSLT14, right axis)")
        twin.set_ylabel("paper's BLEU", fontsize=8)
        twin.legend(fontsize=7, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cpu_hours(cells):
    """The CPU-hours the finished ``cells`` (claims-study results) spent training and translating."""
    return sum((r.get("train_cpu_s") or 0) + ((r.get("scores") or {}).get("translate_cpu_s") or 0)
               for r in cells) / 3600


def cost_table(selection_cells, rows, final_updates, seeds):
    """What the ranking costs, from the finished cells: per row its measured training CPU-seconds per update
    (mean over its finished selection cells) and the projected CPU-hours of its final cells.

    Args:
        selection_cells: the finished selection cells (claims-study results).
        rows: the rows in report order.
        final_updates, seeds: the final cells' budget and how many seeds each row trains.

    Returns:
        ``(Markdown table, {"spent_cpu_h", "projected_final_cpu_h", "per_update": {row: CPU-s or None}})``;
        spent: the training and translation CPU-seconds of every finished cell given.
    """
    lines, per_update = [], {}
    for row in rows:
        mine = [r for r in selection_cells if r["scheme"] == row and r.get("train_cpu_s")]
        costs = [r["train_cpu_s"] / r["reached"] for r in mine if r.get("reached")]
        per_update[row] = sum(costs) / len(costs) if costs else None
        projected = None if per_update[row] is None else per_update[row] * final_updates * seeds / 3600
        lines.append([row_label(row), len(mine), "-" if not costs else f"{per_update[row]:.3f}",
                      "-" if projected is None else f"{projected:.2f}"])
    spent = cpu_hours(selection_cells)
    projected = sum(v * final_updates * seeds for v in per_update.values() if v) / 3600
    text = markdown_table(["row", "selection cells finished", "training CPU-s per update",
                           f"final cells, projected CPU-h ({seeds} x {final_updates} updates)"], lines)
    return text, dict(spent_cpu_h=round(spent, 2), projected_final_cpu_h=round(projected, 2),
                      per_update=per_update)


def valid_curve(run_dir):
    """A cell's validation curve from its fairseq logs (``train-u*.log``): ``[[updates, valid nll in bits],
    ...]`` in update order, one point per validation (the cells validate at every checkpoint)."""
    points = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "train-u*.log"))):
        points.update(valid_nll_by_update(path))
    return [[u, points[u]] for u in sorted(points)]


#: a finished cell's small files that the archive keeps (never checkpoints or logs)
ARCHIVED = ("settings.json", "train_state.json", "budgets/u*/result.json", "budgets/u*/analysis/analysis.json")


def archive(out, dest):
    """Copy every finished cell's small files from the study folder ``out`` into ``dest/cells`` (the same
    layout, plus ``curve.json``, its validation curve, :func:`valid_curve`), so that the report can be
    rebuilt, and the study resumed on another machine, from what a repository holds: copy ``dest/cells``
    into a new study folder's ``cells`` and the same command skips every archived cell. Returns the number
    of cells archived."""
    import json

    n = 0
    for run_dir in sorted(glob.glob(os.path.join(out, "cells", "*"))):
        if not glob.glob(os.path.join(run_dir, "budgets", "u*", "result.json")):
            continue
        target = os.path.join(dest, "cells", os.path.basename(run_dir))
        for pattern in ARCHIVED:
            for src in glob.glob(os.path.join(run_dir, pattern)):
                dst = os.path.join(target, os.path.relpath(src, run_dir))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(src, dst)
        with open(os.path.join(target, "curve.json"), "w", encoding="utf-8") as f:
            json.dump(valid_curve(run_dir), f)
        n += 1
    for name in ("ranking.md", "ranking.json", "ranking.png"):
        if os.path.exists(os.path.join(out, name)):
            shutil.copyfile(os.path.join(out, name), os.path.join(dest, name))
    return n


def write(out, results, condition, lr_by_row=None, note="", selection=None, progress=None):
    """``ranking.md``, ``ranking.json`` and ``ranking.png`` in ``out``; returns the Markdown text.

    Args:
        results: the claims-study cells of ``condition`` (one per row and seed).
        lr_by_row: ``{row: learning rate}`` the rows trained at (None: each cell's own setting).
        note: a sentence on the protocol and the command, after the table's legend.
        selection: the learning-rate selection's Markdown table (:func:`.lr_protocol.selection_table`), or None.
        progress: a Markdown section on what has finished and what it costs (:func:`cost_table`), or None.
    """
    rows = rank(results, condition, lr_by_row)
    depth = CONDITIONS[condition][0]
    title = f"Every row at {condition} ({depth}+{depth} layers), ranked"
    ranked = [table(rows), "", paper_results.describe("iwslt14") or "", "", "![ranking](ranking.png)", ""] if rows \
        else ["No row has a finished final cell yet: the ranking appears when the first do.", ""]
    text = "\n".join([
        f"# {title}", "",
        "Mean ± sample sd over seeds; rows diverged in most seeds last, the others by valid nll (bits per "
        "token, lowest first). grad: layer-1 / top-layer gradient norm, cos: cosine of the last two layer "
        "outputs, encoder / decoder. " + note, "",
        *(["## Progress", "", progress, ""] if progress else []),
        *ranked,
        *(["## How each row's learning rate was chosen", "", selection, ""] if selection else [])])
    with open(os.path.join(out, "ranking.md"), "w", encoding="utf-8") as f:
        f.write(text)
    write_json(os.path.join(out, "ranking.json"), dict(condition=condition, rows=rows, cells=results))
    if rows:
        plot(rows, os.path.join(out, "ranking.png"), title)
    return text

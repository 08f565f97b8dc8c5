"""The per-scheme learning-rate protocol of the claims study: every row trains at its own best peak learning
rate, chosen on one seed from a grid fixed in advance, then fresh seeds at that rate.

Rule (fixed before any run; ``--lr-grid``, ``--select-seed``, ``--select-updates``):

1. Selection. For each row (scheme or ablation) and each depth of ``--conditions``, the selection cells are
   the row at the warm-up condition of that depth (``warm6`` for the 6-layer conditions, ``warm12`` for the
   12-layer ones), seed ``--select-seed``, every learning rate of ``--lr-grid``, ``--select-updates``
   updates. A no-warm-up condition uses its depth's warm-up choice: the no-warm-up claims compare one recipe
   with and without warm-up, so the recipe must not change with the condition.
2. Choice (:func:`choose`): the learning rate whose cell has the lowest valid nll (bits per token, as fairseq
   logs it: 3 decimals). A cell that diverged or failed never wins. Equal valid nll: the smaller learning
   rate (the more conservative). When every cell of the grid diverged or failed there is no choice, and the
   row's protocol cells are not run (the report says so).
3. The protocol's cells: every condition of that depth, every seed of ``--seeds`` (fresh seeds: the selection
   seed is meant to be outside them), the chosen learning rate, ``--updates`` updates.

The protocol's cells are the study's ordinary cells (:mod:`.cell`: same folders, same hashes), so a cell of
learning rate 2e-3 and seed 2 is the default protocol's cell, trained once for both. The fixed protocol
(``--lr`` for every row, the same seeds) runs beside it, and the report puts the two side by side.
"""
import math

from .claims import CONDITIONS, row_label
from .report import markdown_table

#: a no-warm-up condition takes the learning rate chosen at the warm-up condition of its depth
SELECTION_CONDITION = {name: f"warm{depth}" for name, (depth, _) in CONDITIONS.items()}


def selection_conditions(conditions):
    """The warm-up conditions at which the learning rate is chosen for ``conditions``, in their order."""
    return list(dict.fromkeys(SELECTION_CONDITION[c] for c in conditions))


def choose(nll_by_lr):
    """The learning rate with the lowest valid nll (see the module docstring).

    Args:
        nll_by_lr: ``{lr: (status, valid nll or None)}`` of the selection cells of one row and depth.

    Returns:
        ``(lr, reason)``: the chosen learning rate (None when no cell trained) and one line saying why.
    """
    ok = sorted((nll, lr) for lr, (status, nll) in nll_by_lr.items()
                if status == "ok" and nll is not None and math.isfinite(nll))
    bad = sorted(set(nll_by_lr) - {lr for _, lr in ok})
    if not ok:
        return None, f"no learning rate of the grid trained ({len(bad)} diverged or failed)"
    best = ok[0][0]
    tied = [lr for nll, lr in ok if nll == best]
    why = f"lowest valid nll {best:.3f}"
    if len(tied) > 1:
        why += f", tied with {', '.join(f'{lr:g}' for lr in tied[1:])}: the smaller wins"
    if bad:
        why += f"; {', '.join(f'{lr:g}' for lr in bad)} diverged or failed"
    return tied[0], why


def selection_table(rows, conditions, grid, cells):
    """The selection as Markdown: one line per (row, selection condition), the valid nll at each learning
    rate of ``grid`` (``diverged`` / ``failed`` / ``-``), the chosen one in bold.

    Args:
        cells: ``{(row, condition, lr): result}`` of the selection cells.

    Returns:
        ``(table text, {(row, condition): (lr, reason)})``; a row whose selection cells are not all finished
        (a report read while the study runs) has no choice yet (lr None, reason ``pending: ...``).
    """
    choices, lines = {}, []
    for cond in selection_conditions(conditions):
        for row in rows:
            found = {lr: cells.get((row, cond, lr)) for lr in grid}
            status = {lr: (r["status"], r["stats"].get("valid_nll_loss")) for lr, r in found.items() if r}
            if len(status) < len(grid):  # a report read while the selection runs: no choice on part of the grid
                lr, why = None, f"pending: {len(status)} of {len(grid)} selection cells finished"
            else:
                lr, why = choose(status)
            choices[row, cond] = (lr, why)
            entries = []
            for g in grid:
                if g not in status:
                    entries.append("-")
                elif status[g][0] != "ok":
                    entries.append(status[g][0])
                else:
                    text = f"{status[g][1]:.3f}"
                    entries.append(f"**{text}**" if g == lr else text)
            lines.append([row_label(row), cond, *entries, "-" if lr is None else f"{lr:g}", why])
    header = ["row", "selected at", *(f"lr {g:g}" for g in grid), "chosen lr", "why"]
    return markdown_table(header, lines, ["l", "l"] + ["r"] * (len(grid) + 1) + ["l"]), choices

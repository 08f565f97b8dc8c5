"""The claims study's report: the cells' mean ± sd over seeds, one line per claim, the claims at every budget
the grid reached, and the figure (``results.md``, ``results.json``, ``claims.png``)."""
import os
import time

from fairseq_residual import paper_results

from .cell import shortfall
from .claims import ABLATIONS, CONDITIONS, cell_metrics, claims, row_color, row_label
from .data import corpus_label
from .files import write_json
from .report import ORDER, _pyplot, fmt, markdown_table, scoring_text
from .runner import loadavg
from .stats import mean_sd, ms_text


def summary(results, schemes, conditions):
    """Rows per (scheme, condition): mean ± sd over seeds of each metric, and divergences."""
    rows = []
    for cond in conditions:
        for scheme in schemes:
            cells = [r for r in results if r["scheme"] == scheme and r["condition"] == cond]
            if not cells:
                continue
            m = [cell_metrics(r) for r in cells]
            n_div = sum(x["diverged"] for x in m)
            n_fail = sum(x["failed"] for x in m)
            depth, warm = CONDITIONS[cond]
            paper = None if "+" in scheme else paper_results.paper_bleu("iwslt14", scheme, depth, warmup=warm)
            rows.append(dict(
                condition=cond, scheme=scheme, seeds=len(cells), diverged=n_div, failed=n_fail,
                valid_nll=ms_text([x["valid_nll"] for x in m]), bleu=ms_text([x["bleu"] for x in m]),
                chrf=ms_text([x["chrf"] for x in m], 1),
                grad=f"{ms_text([x['grad_enc'] for x in m])} / {ms_text([x['grad_dec'] for x in m])}",
                cos=f"{ms_text([x['cos_enc'] for x in m], 3)} / {ms_text([x['cos_dec'] for x in m], 3)}",
                paper="-" if paper is None else str(paper),
            ))
    return rows


def effect_text(c):
    """One claim's measured effect: ``+0.123 ± 0.045 (95% CI, sd 0.018, n=3)``, or its count."""
    if "effect" not in c:
        return c["measured"]
    e = c["effect"]
    if e["mean"] is None:
        return "-"
    if e["ci"] is None:
        return f"{e['mean']:+.3f} (n={e['n']})"
    return f"{e['mean']:+.3f} ± {e['ci']:.3f} (95% CI, sd {e['sd']:.3f}, n={e['n']})"


def claims_by_budget(by_budget, conditions):
    """A Markdown table: one row per claim, one column per budget, each cell the verdict and the mean
    difference with its 95% half-width (``by_budget``: ``{updates: {(row, condition, seed): result}}``)."""
    budgets = sorted(by_budget)
    found = {b: claims(by_budget[b], conditions) for b in budgets}
    order = [c["claim"] for c in found[budgets[-1]]]
    rows = []
    for claim in order:
        row = [claim]
        for b in budgets:
            c = next((x for x in found[b] if x["claim"] == claim), None)
            row.append("-" if c is None else _verdict_text(c))
        rows.append(row)
    return markdown_table(["claim"] + [f"{b} updates" for b in budgets], rows, ["l"] + ["l"] * len(budgets))


#: the grid's plateau rule, fixed before the runs to convergence were looked at: a (row, condition) has
#: stopped moving at budget B >= PLATEAU_FROM when its seed-mean valid nll at B is less than PLATEAU_BITS
#: below its seed-mean valid nll at B - PLATEAU_STEP (or above it)
PLATEAU_FROM, PLATEAU_STEP, PLATEAU_BITS = 4000, 1000, 0.03


def plateau(mean_by_budget, start=PLATEAU_FROM):
    """Where the grid's plateau rule says a (row, condition) stopped moving.

    Args:
        mean_by_budget: ``{updates: seed-mean valid nll in bits per token, or None}``.
        start: the first budget the rule may name (the ranking reads its curves from 2,000 updates).

    Returns:
        the first budget B >= ``start`` whose mean is less than :data:`PLATEAU_BITS` below the mean
        at B - :data:`PLATEAU_STEP` (both measured), else None.
    """
    for b in sorted(mean_by_budget):
        cur, prev = mean_by_budget[b], mean_by_budget.get(b - PLATEAU_STEP)
        if b >= start and cur is not None and prev is not None and prev - cur < PLATEAU_BITS:
            return b
    return None


def nll_by_budget(by_budget, rows, conditions):
    """The seed-mean valid nll of every (row, condition) at every budget, and the plateau rule's verdict.

    Args:
        by_budget: ``{updates: {(row, condition, seed): result}}``.
        rows, conditions: the order of the lines.

    Returns:
        ``(Markdown table, {"row condition": {"mean": {updates: nll}, "diverged": [k, n], "plateau": B or
        None}})``; a (row, condition) diverged in most seeds at the last budget says so instead of a plateau.
    """
    budgets = sorted(by_budget)
    lines, out = [], {}
    for cond in conditions:
        for row in rows:
            cells = {b: [r for (s, c, _), r in by_budget[b].items() if s == row and c == cond] for b in budgets}
            if not cells[budgets[-1]]:
                continue
            means = {b: mean_sd([cell_metrics(r)["valid_nll"] for r in cells[b]])[0] for b in budgets}
            last = [cell_metrics(r) for r in cells[budgets[-1]]]
            n_div = sum(m["diverged"] or m["failed"] for m in last)
            at = plateau(means)
            if 2 * n_div > len(last):
                verdict_text = f"diverged ({n_div}/{len(last)} seeds)"
            elif at is not None:
                verdict_text = f"stopped at {at}"
            else:
                verdict_text = "moving" if budgets[-1] >= PLATEAU_FROM else f"not before {PLATEAU_FROM}"
            out[f"{row} {cond}"] = dict(mean={str(b): means[b] for b in budgets}, diverged=[n_div, len(last)],
                                        plateau=at)
            lines.append([row_label(row), cond, *(fmt(means[b], 3) for b in budgets), verdict_text])
    table = markdown_table(["row", "condition", *(f"{b} updates" for b in budgets), "plateau"], lines,
                           ["l", "l"] + ["r"] * len(budgets) + ["l"])
    return table, out


def protocol_lines(args, fixed_found, section, schemes, conditions):
    """The per-row learning-rate protocol's part of the report: the rule, the selection, the cells at the
    chosen rates, and the claims of both protocols side by side (at the last budget, then at every budget
    the chosen rates' grid reached).

    Args:
        fixed_found: :func:`.claims.claims` of the fixed protocol's cells.
        section: ``table`` (the selection), ``results`` (the chosen rates' cells), ``by_budget`` (the same
            at every budget they reached) and ``seeds``.
    """
    tuned = section["results"]
    tuned_by = {(r["scheme"], r["condition"], r["seed"]): r for r in tuned}
    tuned_found = claims(tuned_by, conditions)
    rows = summary(tuned, schemes, conditions)
    lr_of = {(c["scheme"], c["condition"]): c["settings"]["lr"] for c in tuned}
    lines = [
        "", "## Each row at its own learning rate", "",
        "Rule, fixed before the runs: every row at every peak learning rate of "
        f"{', '.join(f'{g:g}' for g in args.lr_grid)} on seed {args.select_seed}, {args.select_updates} updates, "
        "at the warm-up condition of each depth (a "
        "no-warm-up condition takes its depth's choice: the recipe must not change with the condition); the "
        "lowest valid nll wins, a diverged or failed run never does, equal nll: the smaller rate. Then seeds "
        f"{', '.join(map(str, section['seeds']))} at the chosen rate, {args.updates} updates.", "",
        section["table"], "",
        markdown_table(["condition", "row", "lr", "seeds", "diverged", "valid nll", "BLEU", "chrF",
                        "grad L1/top enc / dec", "cos top enc / dec"],
                       [[r["condition"], row_label(r["scheme"]),
                         f"{lr_of[r['scheme'], r['condition']]:g}",
                         r["seeds"], f"{r['diverged']}" + (f" (+{r['failed']} failed)" if r["failed"] else ""),
                         r["valid_nll"], r["bleu"], r["chrf"], r["grad"], r["cos"]] for r in rows]),
        "", "## The claims under both protocols", "",
        f"Left: every row at lr {args.lr:g}, seeds {', '.join(map(str, args.seeds))}; right: each row at its "
        f"chosen rate, seeds {', '.join(map(str, section['seeds']))}. Verdict and mean paired difference ± the "
        "half-width of its 95% interval; \"differs\" marks a verdict that depends on the protocol.", "",
    ]
    by_claim = {c["claim"]: c for c in tuned_found}
    table = []
    for c in fixed_found:
        t = by_claim.get(c["claim"])
        a, b = _verdict_text(c), _verdict_text(t) if t else "-"
        same = "-" if t is None else ("same" if _verdict(c) == _verdict(t) else "**differs**")
        table.append([c["claim"], a, b, same])
    lines.append(markdown_table(["claim", f"lr {args.lr:g}", "own lr", "verdict"], table, ["l", "l", "l", "l"])
                 if table else "No claim of the paper can be tested with these conditions.")
    if len(section["by_budget"]) > 1 and claims(section["by_budget"][max(section["by_budget"])], conditions):
        lines += ["", "At every budget the chosen rates' grid reached:", "",
                  claims_by_budget(section["by_budget"], conditions)]
    return lines


def _verdict(c):
    return c["effect"]["verdict"] if "effect" in c else c["verdict"]


def _verdict_text(c):
    """One claim as ``verdict: +0.12 ± 0.05`` (or its count)."""
    if "effect" in c and c["effect"]["mean"] is not None:
        e = c["effect"]
        return f"{e['verdict']}: {e['mean']:+.2f}" + (f" ± {e['ci']:.2f}" if e["ci"] else "")
    return f"{_verdict(c)}" + (f" ({c['measured']})" if "measured" in c else "")


def write_report(args, results, wall_s, by_budget=None, protocol=None):
    """``results.md`` / ``results.json`` / ``claims.png`` under ``args.out`` (``by_budget``: the same grid's
    results at every budget it reached, for the claims-by-budget table and the plateau rule; ``protocol``:
    the per-row learning-rate protocol's part, :func:`protocol_lines`). Returns the Markdown text."""
    schemes = [s for s in ORDER if any(r["scheme"] == s for r in results)]
    schemes += sorted({r["scheme"] for r in results if "+" in r["scheme"]})
    conditions = [c for c in args.conditions if any(r["condition"] == c for r in results)]
    by = {(r["scheme"], r["condition"], r["seed"]): r for r in results}
    rows = summary(results, schemes, conditions)
    found = claims(by, conditions)
    s0 = results[0]["settings"]
    cpu = [cell_metrics(r)["train_cpu_s"] for r in results if cell_metrics(r)["train_cpu_s"]]
    short = shortfall(results)
    budget_note = (f" ({len(short)} of {len(results)} cells stopped before {s0['updates']} updates: listed below)"
                   if short else "")
    lines = [
        "# Claims study", "",
        f"Command: `scripts/claims_study.sh {' '.join(args.argv)}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M')}; {len(results)} cells; wall {wall_s / 60:.1f} min this "
        f"invocation; training CPU time {sum(cpu) / 60:.1f} min in all; load average at the end {loadavg()}.",
        "",
        f"Setup: {corpus_label(args.data)}; residual_transformer width {s0['width']}, FFN {s0['ffn_dim']}, "
        f"{s0['heads']} heads, dropout {s0['dropout']}; Adam (0.9, 0.98), lr {s0['lr']} inverse_sqrt "
        f"(warm-up {args.warmup} updates, or none), max_tokens {s0['max_tokens']}, {s0['updates']} updates per "
        f"cell{budget_note}, seeds {', '.join(map(str, args.seeds))}, device {args.device}. Valid nll: bits per target "
        f"token on the whole valid split; BLEU/chrF: {scoring_text(results)} grad: layer-1 / top-layer gradient "
        f"norm, cos: cosine of the "
        f"last two layer outputs, encoder / decoder, from fairseq-residual-analyze on the final checkpoint. "
        f"Mean ± sample standard deviation over seeds; diverged runs are counted, not averaged.",
        "", "## Cells", "",
        markdown_table(
            ["condition", "scheme", "seeds", "diverged", "valid nll", "BLEU", "chrF", "grad L1/top enc / dec",
             "cos top enc / dec", "paper BLEU (IWSLT14)"],
            [[r["condition"], row_label(r["scheme"]), r["seeds"],
              f"{r['diverged']}" + (f" (+{r['failed']} failed)" if r["failed"] else ""), r["valid_nll"],
              r["bleu"], r["chrf"], r["grad"], r["cos"], r["paper"]] for r in rows]),
        "", paper_results.describe("iwslt14") or "", "",
    ]
    if short:
        lines += [f"Cells that did not reach {s0['updates']} updates (a run stopped by NaN/Inf or an error is not "
                  "trained further; its numbers are those of where it stopped):", "",
                  markdown_table(["cell", "status", "updates reached", "reason"],
                                 [[f"{r['scheme']} {r['condition']} seed {r['seed']}", r["status"], r["reached"],
                                   (r.get("reason") or "").replace("|", "/")] for r in short],
                                 ["l", "l", "r", "l"]), ""]
    lines += [
        "## The paper's claims, one line each", "",
        "Paired by seed; verdict from the 95% t-interval of the mean difference (holds: wholly on the "
        "claimed side of zero; does not hold: wholly on the other; inconclusive: it spans zero).", "",
    ]
    for c in found:
        if "effect" in c:
            lines.append(f"- **{c['claim']}**: {c['effect']['verdict']}; measured difference {effect_text(c)}; "
                         f"paper {c['paper']}.")
        else:
            lines.append(f"- **{c['claim']}**: {c['verdict']}; {c['measured']}; paper {c['paper']}.")
    for name in args.ablations:
        a = ABLATIONS[name]
        lines.append(f"\nAblation `{name}` ({a['label']}, `{a['args']}`): {a['what']}; why: {a['why']}.")
    if by_budget and len(by_budget) > 1 and claims(by_budget[max(by_budget)], conditions):
        lines += ["", "## The claims at every budget the grid reached", "",
                  "The same cells, measured after each budget (a larger `--updates` continues every cell from "
                  "its last checkpoint). Each entry: verdict, mean paired difference ± half-width of its 95% "
                  "interval (valid nll in bits, BLEU in points).", "",
                  claims_by_budget(by_budget, conditions)]
    extra = {}
    if by_budget and len(by_budget) > 1:
        table, extra["plateau"] = nll_by_budget(by_budget, schemes, conditions)
        lines += ["", "## Valid nll at every budget, and where it stopped moving", "",
                  f"Seed-mean valid nll (bits per token; diverged seeds left out). Plateau rule, fixed before the "
                  f"runs: a row has stopped moving at budget B >= {PLATEAU_FROM} when its mean at B is less than "
                  f"{PLATEAU_BITS} bits below its mean at B - {PLATEAU_STEP} (or above it).", "", table]
    if protocol is not None:
        lines += protocol_lines(args, found, protocol, schemes, conditions)
        extra["protocol"] = dict(lr_grid=args.lr_grid, select_seed=args.select_seed,
                                 select_updates=args.select_updates, seeds=protocol["seeds"],
                                 choices=protocol["choices"], cells=protocol["results"],
                                 claims=claims({(r["scheme"], r["condition"], r["seed"]): r
                                                for r in protocol["results"]}, conditions))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    write_json(os.path.join(args.out, "results.json"),
               dict(summary=rows, claims=found, cells=results, conditions=conditions, schemes=schemes,
                    claims_by_budget={str(b): claims(by_budget[b], conditions) for b in (by_budget or {})},
                    **extra))
    plot(results, schemes, conditions, os.path.join(args.out, "claims.png"))
    return text


def plot(results, schemes, conditions, path):
    """Valid nll and BLEU per condition: one bar per scheme (mean, sd error bar, seeds as dots)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(5 + 1.6 * len(conditions), 4))
    width = 0.8 / max(1, len(schemes))
    for ax, metric, title in ((axes[0], "valid_nll", "valid nll (bits/token), lower is better"),
                              (axes[1], "bleu", "sacreBLEU, higher is better")):
        for i, scheme in enumerate(schemes):
            for j, cond in enumerate(conditions):
                vals = [cell_metrics(r)[metric] for r in results
                        if r["scheme"] == scheme and r["condition"] == cond]
                m, sd, n = mean_sd(vals)
                x = j + (i - (len(schemes) - 1) / 2) * width
                n_div = sum(cell_metrics(r)["diverged"] for r in results
                            if r["scheme"] == scheme and r["condition"] == cond)
                if m is not None:
                    ax.bar(x, m, width, yerr=sd or 0, color=row_color(scheme), capsize=2,
                           label=row_label(scheme) if j == 0 else None)
                    ax.plot([x] * n, [v for v in vals if v is not None], "k.", markersize=3)
                if n_div:
                    ax.text(x, 0, "×" * n_div, ha="center", va="bottom", color="black", fontsize=8)
        ax.set_xticks(range(len(conditions)))
        ax.set_xticklabels(conditions)
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("Claims study: mean ± sd over seeds (× = a diverged seed)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

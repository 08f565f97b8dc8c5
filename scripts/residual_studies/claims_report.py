"""The claims study's report: the cells' mean ± sd over seeds, one line per claim, the claims at every budget
the grid reached, and the figure (``results.md``, ``results.json``, ``claims.png``)."""
import os
import time

from fairseq_residual import paper_results

from .cell import shortfall
from .claims import ABLATIONS, CONDITIONS, cell_metrics, claims, row_color, row_label
from .files import write_json
from .report import ORDER, _pyplot, markdown_table
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
            if c is None:
                row.append("-")
            elif "effect" in c and c["effect"]["mean"] is not None:
                e = c["effect"]
                row.append(f"{c['effect']['verdict']}: {e['mean']:+.2f}" + (f" ± {e['ci']:.2f}" if e["ci"] else ""))
            else:
                row.append(f"{c.get('verdict', c['effect']['verdict'] if 'effect' in c else '-')}"
                           + (f" ({c['measured']})" if "measured" in c else ""))
        rows.append(row)
    return markdown_table(["claim"] + [f"{b} updates" for b in budgets], rows, ["l"] + ["l"] * len(budgets))


def write_report(args, results, wall_s, by_budget=None):
    """``results.md`` / ``results.json`` / ``claims.png`` under ``args.out`` (``by_budget``: the same grid's
    results at every budget it reached, for the claims-by-budget table). Returns the Markdown text."""
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
        f"Setup: shipped Ding de->en corpus; residual_transformer width {s0['width']}, FFN {s0['ffn_dim']}, "
        f"{s0['heads']} heads, dropout {s0['dropout']}; Adam (0.9, 0.98), lr {s0['lr']} inverse_sqrt "
        f"(warm-up {args.warmup} updates, or none), max_tokens {s0['max_tokens']}, {s0['updates']} updates per "
        f"cell{budget_note}, seeds {', '.join(map(str, args.seeds))}, device {args.device}. Valid nll: bits per target "
        f"token on the whole valid split; BLEU/chrF: sacreBLEU of beam-{s0['beam']} translations of the first "
        f"{s0['bleu_sentences']} test sentences. grad: layer-1 / top-layer gradient norm, cos: cosine of the "
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
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    write_json(os.path.join(args.out, "results.json"),
               dict(summary=rows, claims=found, cells=results, conditions=conditions, schemes=schemes,
                    claims_by_budget={str(b): claims(by_budget[b], conditions) for b in (by_budget or {})}))
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

"""The claims study: the ResiDual paper's two largest effects, tested in training with seeds.

Entry point: ``scripts/claims_study.sh`` (``--help`` for the options). The paper (Xie et al. 2023, arXiv
2304.14802) reports, on IWSLT14 De-En, one run per cell:

* **warm-up** (its no-warm-up ablation): without learning-rate warm-up Post-LN fails, Pre-LN loses about
  3 BLEU (6+6: 35.12 -> 32.28) and ResiDual is unaffected (35.63 -> 35.76);
* **depth**: at 12+12 layers Post-LN fails while ResiDual beats Pre-LN (36.09 vs 35.18).

This study trains the schemes of ``--schemes`` (default :data:`CLAIM_SCHEMES`, the three the claims name;
``all``: every registered scheme, :data:`fairseq_residual.schemes.SCHEME_NAMES`, so schemes added later are
picked up without edits), plus the ablation rows of ``--ablations`` (:data:`ABLATIONS`), in the conditions
those claims compare, each with several seeds, on the
shipped Ding German-English corpus, with the depth study's cells (:mod:`.depth_study`: same data
preparation, recipe, divergence rule and scoring), and adds the diagnostics of
``fairseq-residual-analyze`` on each final checkpoint (per-layer gradient ratio, last-layer cosine).

Conditions (``--conditions``): ``warm6`` (6+6 layers, inverse_sqrt warm-up of ``--warmup`` updates),
``nowarm6`` (6+6 without warm-up: ``--warmup-updates 1``, the peak learning rate from the second update on;
fairseq's inverse_sqrt cannot take 0), ``warm12`` and ``nowarm12`` (12+12).

Verdicts (:func:`verdict`): each claim is a paired difference per seed (same seed, same batches, two
conditions or two schemes). With n seeds, the claim **holds** when the 95% t-interval of the mean
difference lies wholly on the claimed side of zero, **does not hold** when it lies wholly on the other
side, and is **inconclusive** otherwise. "Fails" means the project's divergence rule
(:mod:`.divergence`) flagged the run, in at least half of the seeds.

Output (default ``runs/claims_study/``): ``data/`` (shared with nothing else), ``cells/`` (one folder per
scheme x condition x seed, with the depth study's files plus ``analysis/analysis.json``), and
``results.md``, ``results.json``, ``claims.png``. Finished cells are skipped: an interrupted study resumes
where it stopped; a larger ``--updates`` continues every cell; ``--report-only`` rebuilds the report;
``--learning-curve`` measures where BLEU stops moving instead (:mod:`.learning_curve`).
"""
import argparse
import concurrent.futures
import glob
import math
import os
import statistics
import sys
import time

from .. import paper_results
from . import depth_study, learning_curve
from .files import read_json, write_json
from .report import COLORS, LABELS, ORDER, markdown_table
from .runner import ToolError, loadavg, logger, run_logged, tool

DEFAULT_OUT = os.path.join(depth_study.REPO, "runs", "claims_study")
log = logger("claims-study")

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
#: the model options that make it, a label, a colour, and what it tests
ABLATIONS = {
    "zeros": dict(
        scheme="resi_dual", args="--resi-dual-start-from zeros", label="ResiDual, x_d from 0", color="tab:olive",
        what="starting the dual stream from zeros instead of the embedding output",
        why="with shared embeddings, LN(x_d) of an embedding-dominated x_d adds a copy of the input token's "
            "embedding to the decoder output, i.e. a copy-the-previous-token term in the logits early in "
            "training (the authors' code has the zeros line commented out)"),
    "alpha_half": dict(
        scheme="resi_dual", args="--encoder-resi-dual-alpha 0.5 --decoder-resi-dual-alpha 0.5",
        label="ResiDual, alpha 0.5", color="tab:cyan",
        what="weighting the Post-LN stream by alpha = 0.5 in the stack output",
        why="the output alpha*x_a + LN(x_d) has about twice the variance of Pre-LN's LN(x) at alpha = 1"),
}
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

#: two-sided 95% Student-t quantiles by degrees of freedom
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


# ------------------------------------------------------------------------------------------------
# statistics


def mean_sd(values):
    """``(mean, sample standard deviation, n)`` of the non-None values (sd None when n < 2)."""
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None, None, 0
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None), len(vals)


def verdict(diffs, claimed_sign):
    """Verdict on a paired difference.

    Args:
        diffs: one difference per seed (None entries are dropped).
        claimed_sign: +1 if the claim says the difference is positive, -1 if negative.

    Returns:
        dict with ``mean``, ``sd``, ``n``, ``ci`` (half-width of the 95% t-interval) and ``verdict``:
        ``holds`` / ``does not hold`` / ``inconclusive`` (also when fewer than 2 differences).
    """
    mean, sd, n = mean_sd(diffs)
    if n < 2 or sd is None:
        return dict(mean=mean, sd=sd, n=n, ci=None, verdict="inconclusive")
    half = T95.get(n - 1, 1.96) * sd / math.sqrt(n)
    lo, hi = mean - half, mean + half
    if claimed_sign * lo > 0 and claimed_sign * hi > 0:
        word = "holds"
    elif claimed_sign * lo < 0 and claimed_sign * hi < 0:
        word = "does not hold"
    else:
        word = "inconclusive"
    return dict(mean=mean, sd=sd, n=n, ci=half, verdict=word)


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
    return ABLATIONS[row.split("+", 1)[1]]["color"] if "+" in row else COLORS[row]


def grid_rows(args):
    """The grid's rows: the schemes in the registry's order, then the ablations asked for."""
    return [s for s in ORDER if s in args.schemes] + [row_key(a) for a in args.ablations]


# ------------------------------------------------------------------------------------------------
# cells


def cell_args(args, condition, seed, row=None):
    """The depth study's arguments for one cell of this study (``row``: a scheme or an ablation's row,
    whose model options are added to ``--extra-train-args``)."""
    depth, warm = CONDITIONS[condition]
    ns = argparse.Namespace(**vars(args))
    ns.warmup = args.warmup if warm else NO_WARMUP_UPDATES
    ns.seed = seed
    ns.depths = [depth]
    if row is not None:
        extra = resolve(row)[1]
        ns.extra_train_args = " ".join(a for a in (args.extra_train_args, extra) if a)
    return ns, depth


def analyze_cell(args, data, bdir):
    """``fairseq-residual-analyze`` on the checkpoint of a cell's budget (cached in ``analysis/`` of the
    budget's folder): the per-layer gradient ratio (layer 1 / top) and the cosine of the last two layer
    outputs, per stack."""
    out = os.path.join(bdir, "analysis")
    path = os.path.join(out, "analysis.json")
    report = read_json(path)
    ckpt = os.path.join(bdir, "checkpoint.pt")
    if report is None and os.path.exists(ckpt):
        cmd = [tool("fairseq-residual-analyze"), data["bin"], "--checkpoint", ckpt, "--subset", "valid",
               "--batches", str(args.analyze_batches), "--max-tokens", "2048", "--no-plots",
               "--output-dir", out, "--device", args.device]
        rc, _ = run_logged(cmd, os.path.join(bdir, "analyze.log"), args.threads)
        report = read_json(path) if rc == 0 else None
    if not report:
        return None
    model = report["models"][0]
    cos = model["cosine_consecutive"]
    return dict(grad_low_top_enc=model["grad_norm_low_top"]["encoder"],
                grad_low_top_dec=model["grad_norm_low_top"]["decoder"],
                cos_top_enc=cos["encoder"][-1] if cos["encoder"] else None,
                cos_top_dec=cos["decoder"][-1] if cos["decoder"] else None)


def run_one(args, demo, data, row, condition, seed):
    ns, depth = cell_args(args, condition, seed, row)
    scheme = resolve(row)[0]
    result = depth_study.run_cell(ns, demo, data, scheme, depth, label=f"{row} {condition} seed {seed}")
    bdir = depth_study.budget_dir(os.path.join(args.out, "cells", result["cell"]), result["budget"])
    if "diagnostics" not in result:
        result["diagnostics"] = analyze_cell(args, data, bdir)
        write_json(os.path.join(bdir, "result.json"), result)
    return dict(result, scheme=row, condition=condition, seed=seed)


def read_cell(args, data, row, condition, seed, updates=None):
    """The result of one finished cell at ``updates`` (default ``--updates``), or None."""
    ns, depth = cell_args(args, condition, seed, row)
    if updates is not None:
        ns.updates = updates
    r = read_json(depth_study.result_path(ns, depth_study.cell_settings(ns, resolve(row)[0], depth, data)))
    return dict(r, scheme=row, condition=condition, seed=seed) if r else None


def budgets_of_grid(args, data, cells):
    """The budgets (update counts) at which every cell of the grid has a result, increasing."""
    common = None
    for row, cond, seed in cells:
        ns, depth = cell_args(args, cond, seed, row)
        run_dir = depth_study.cell_dir(ns, depth_study.cell_settings(ns, resolve(row)[0], depth, data))
        found = set()
        for path in glob.glob(os.path.join(run_dir, "budgets", "u*", "result.json")):
            try:
                found.add(int(os.path.basename(os.path.dirname(path))[1:]))
            except ValueError:
                continue
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


def claims(by, conditions):
    """Each claim of the paper that this grid can test: its statement, the measured effect, the verdict."""
    out = []
    have = lambda s, c: any(k[0] == s and k[1] == c for k in by)  # noqa: E731
    for depth in (6, 12):
        warm, nowarm = f"warm{depth}", f"nowarm{depth}"
        if warm not in conditions or nowarm not in conditions:
            continue
        if have("post_ln", nowarm):
            n_div, n = _fails(by, "post_ln", nowarm)
            out.append(dict(claim=f"without warm-up, Post-LN fails ({depth}+{depth})", paper="fail",
                            measured=f"{n_div}/{n} seeds diverged",
                            verdict="holds" if n and 2 * n_div >= n else "does not hold"))
        for scheme, sign, paper in (("pre_ln", -1, "pre_ln"), ("resi_dual", None, "resi_dual")):
            if not (have(scheme, warm) and have(scheme, nowarm)):
                continue
            p_w = paper_results.paper_bleu("iwslt14", paper, depth, warmup=True)
            p_n = paper_results.paper_bleu("iwslt14", paper, depth, warmup=False)
            paper_txt = f"{p_w} -> {p_n} BLEU" if p_w is not None and p_n is not None else "-"
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
            for metric, better in (("valid_nll", -1), ("bleu", +1)):
                d_res = _paired(by, ("resi_dual", nowarm), ("resi_dual", warm), metric)
                d_pre = _paired(by, ("pre_ln", nowarm), ("pre_ln", warm), metric)
                diff = [None if a is None or b is None else a - b for a, b in zip(d_res, d_pre)]
                out.append(dict(claim=f"without warm-up, ResiDual loses less than Pre-LN ({metric}, "
                                f"{depth}+{depth})", paper="-0.13 vs 2.84 BLEU" if depth == 6 else "-",
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
            out.append(dict(claim="at 12+12 layers, Post-LN fails", paper="fail",
                            measured=f"{n_div}/{n} seeds diverged",
                            verdict="holds" if n and 2 * n_div >= n else "does not hold"))
        if have("resi_dual", "warm12") and have("pre_ln", "warm12"):
            for metric, better in (("valid_nll", -1), ("bleu", +1)):
                d = _paired(by, ("resi_dual", "warm12"), ("pre_ln", "warm12"), metric)
                out.append(dict(claim=f"at 12+12 layers, ResiDual beats Pre-LN ({metric})",
                                paper="36.09 vs 35.18 BLEU", effect=verdict(d, claimed_sign=better),
                                metric=metric))
    return out


# ------------------------------------------------------------------------------------------------
# report


def _ms(values, digits=2):
    m, sd, n = mean_sd(values)
    if m is None:
        return "-"
    return f"{m:.{digits}f} ± {sd:.{digits}f}" if sd is not None else f"{m:.{digits}f}"


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
                valid_nll=_ms([x["valid_nll"] for x in m]), bleu=_ms([x["bleu"] for x in m]),
                chrf=_ms([x["chrf"] for x in m], 1),
                grad=f"{_ms([x['grad_enc'] for x in m])} / {_ms([x['grad_dec'] for x in m])}",
                cos=f"{_ms([x['cos_enc'] for x in m], 3)} / {_ms([x['cos_dec'] for x in m], 3)}",
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
    lines = [
        "# Claims study", "",
        f"Command: `scripts/claims_study.sh {' '.join(args.argv)}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M')}; {len(results)} cells; wall {wall_s / 60:.1f} min this "
        f"invocation; training CPU time {sum(cpu) / 60:.1f} min in all; load average at the end {loadavg()}.",
        "",
        f"Setup: shipped Ding de->en corpus; residual_transformer width {s0['width']}, FFN {s0['ffn_dim']}, "
        f"{s0['heads']} heads, dropout {s0['dropout']}; Adam (0.9, 0.98), lr {s0['lr']} inverse_sqrt "
        f"(warm-up {args.warmup} updates, or none), max_tokens {s0['max_tokens']}, {s0['updates']} updates per "
        f"cell, seeds {', '.join(map(str, args.seeds))}, device {args.device}. Valid nll: bits per target "
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
    from .report import _pyplot

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


# ------------------------------------------------------------------------------------------------
# command line


def build_parser():
    p = argparse.ArgumentParser(
        prog="claims_study.sh", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The ResiDual paper's warm-up and depth claims tested in training: schemes x conditions x "
                    "seeds on the shipped Ding de->en corpus, mean and standard deviation per cell, one verdict "
                    "per claim. Finished cells are skipped when run again; a larger --updates continues every "
                    "cell from its last checkpoint. --learning-curve measures where BLEU stops moving, the "
                    "measurement the default budget comes from.",
        epilog="Cost: see docs/analysis.md (claims study) for the learning curves, the measured CPU-seconds per "
               "update and the arithmetic of the default grid. GPU: --device cuda --width 256 --jobs 8 runs the "
               "cells side by side on one GPU.")
    p.add_argument("--conditions", type=_condition_list, default=["warm6", "nowarm6", "warm12"],
                   help=f"conditions to run, from {', '.join(CONDITIONS)} (default warm6,nowarm6,warm12)")
    p.add_argument("--seeds", type=depth_study.int_list, default=[1, 2, 3],
                   help="seeds per cell (default 1,2,3; at least 3 for a verdict worth reading)")
    p.add_argument("--ablations", type=_ablation_list, default=[],
                   help="ablation rows to add, comma-separated, from " + "; ".join(
                       f"{k}: {a['what']} ({a['args']})" for k, a in ABLATIONS.items()) + " (default none)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (default; one thread per run) or cuda (every run on one GPU, side by side)")
    p.add_argument("--analyze-batches", type=int, default=2,
                   help="valid batches for the end-of-training diagnostics (default 2)")
    learning_curve.add_arguments(p)
    depth_study.add_cell_arguments(
        p, out=DEFAULT_OUT, updates=DEFAULT_UPDATES, max_tokens=DEFAULT_MAX_TOKENS, warmup=DEFAULT_WARMUP,
        bleu_sentences=DEFAULT_BLEU_SENTENCES, lr=DEFAULT_LR, schemes=CLAIM_SCHEMES,
        schemes_help="comma-separated residual schemes, or all for every registered one (default "
                     f"{','.join(CLAIM_SCHEMES)}, the schemes the claims name)")
    return p


def _ablation_list(text):
    items = [t for t in text.split(",") if t]
    bad = [t for t in items if t not in ABLATIONS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown ablation(s) {','.join(bad)}: choose from {', '.join(ABLATIONS)}")
    return items


def _condition_list(text):
    items = [t for t in text.split(",") if t]
    bad = [t for t in items if t not in CONDITIONS]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"unknown condition(s) {','.join(bad) or text!r}: choose from "
                                         f"{', '.join(CONDITIONS)}")
    return items


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        args.device_args = () if args.device == "cuda" else ("--cpu",)
        t0 = time.time()
        data = depth_study.start_study(args)
        if args.learning_curve:
            text = learning_curve.main(args, depth_study.demo, data, cell_args, DEFAULT_UPDATES)
            print("\n" + text)
            log(f"wrote {os.path.join(args.out, 'learning_curve.md')}, learning_curve.json and learning_curve.png "
                f"({(time.time() - t0) / 60:.1f} min)")
            return 0
        rows = grid_rows(args)
        cells = [(r, c, k) for c in args.conditions for r in rows for k in args.seeds]
        if args.dry_run:
            for r, c, k in cells:
                ns, depth = cell_args(args, c, k, r)
                st = depth_study.cell_settings(ns, resolve(r)[0], depth, data)
                print(f"{r} {c} seed {k}: {depth_study.cell_dir(ns, st)}")
            return 0
        if args.report_only:
            results = [r for r in (read_cell(args, data, *c) for c in cells) if r]
            if not results:
                raise ToolError(f"no finished cell with these settings under {args.out}/cells")
        else:
            log(f"{len(cells)} cells: {', '.join(rows)} x conditions {','.join(args.conditions)} x seeds "
                f"{','.join(map(str, args.seeds))}, {args.updates} updates each, {args.jobs} job(s)")
            order = sorted(cells, key=lambda c: -CONDITIONS[c[1]][0])  # deepest first packs jobs better
            with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
                futures = {pool.submit(run_one, args, depth_study.demo, data, *c): c for c in order}
                done = {futures[f]: f.result() for f in concurrent.futures.as_completed(futures)}
            results = [done[c] for c in cells]
        by_budget = {}
        for b in budgets_of_grid(args, data, cells):
            found = [read_cell(args, data, *c, updates=b) for c in cells]
            by_budget[b] = {(r["scheme"], r["condition"], r["seed"]): r for r in found if r}
        text = write_report(args, results, time.time() - t0, by_budget)
        print("\n" + text)
        log(f"wrote {os.path.join(args.out, 'results.md')}, results.json and claims.png "
            f"({(time.time() - t0) / 60:.1f} min)")
    except ToolError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("\nInterrupted; run the same command again to resume (finished cells are kept).", file=sys.stderr)
        return 130
    return 0


__all__ = ["ABLATIONS", "CLAIM_SCHEMES", "CONDITIONS", "claims", "main", "mean_sd", "verdict"]

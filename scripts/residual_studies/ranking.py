"""Many schemes at one condition, ranked: the claims study's ``--rank CONDITION`` (``ranking.md``, ``ranking.json``,
``ranking.png``, ``ranking_curves.png``).

One line per row (scheme or ablation) of the grid at the condition: mean ± sample sd over seeds of valid nll
(bits per token), sacreBLEU and chrF, the diverged (or failed) seeds, the layer-1 / top-layer gradient ratio
and the cosine of the last two layer outputs (encoder / decoder, ``fairseq-residual-analyze`` on the final
checkpoint), the learning rate the row trained at, and the paper's IWSLT14 BLEU for the scheme at the
condition's depth where the paper has one (``fairseq_residual/paper_results.json``).

Order (:func:`rank`): rows whose seeds diverged or failed in the majority last; the others by mean valid nll,
lowest first (the metric the cells measure most precisely at this scale), equal means by mean BLEU. Each row's
difference to the next one down is a seed-paired difference with its 95% t-interval: resolved when the interval
excludes zero.

From the cells' validation curves (every checkpoint) and their measured training cost, as the ranking's plan
(docs/results/2026-12-04-ranking-plan.md) fixes them: **equal compute** (:func:`equal_compute`), each row's valid
nll after the training CPU-seconds Pre-LN needed for the final budget, and the **plateau rule** on the seed-mean
curve (:data:`CURVE_PLATEAU_FROM`).

**How far the order holds** (:func:`order_stability`): which pairs of rows differ beyond their seeds' spread, how
far the order at fewer updates (:data:`ORDER_AT`) is the final one, how far the selection's single seed orders
the rows as the final seeds do, and which pairs the paper's IWSLT14 table orders the other way.
"""
import glob
import itertools
import math
import os
import re
import shutil
import statistics

from fairseq_residual import paper_results

from .claims import CONDITIONS, cell_metrics, row_color, row_label
from .claims_report import plateau
from .files import read_json, write_json
from .logs import read_train_log, train_nll_by_update, valid_nll_by_update
from .report import _pyplot, markdown_table, scoring_text
from .stats import mean_sd, ms_text, verdict

#: the plan's plateau rule on a seed-mean validation curve: the first validation B >= 2,000 updates whose valid
#: nll is less than 0.03 bits below the one at B - 1,000 (the claims study's rule, read on the curve)
CURVE_PLATEAU_FROM = 2000
#: the baseline of the equal-compute column
BASELINE = "pre_ln"
#: fairseq's line when it resumes a run from a checkpoint
LOADED = re.compile(r"Loaded checkpoint \S+ \(epoch \d+ @ (\d+) updates\)")
#: the line ``runner.run_logged`` writes into a segment's log before each fairseq process it starts
PROCESS_START = re.compile(r"^\$ ", re.M)


def _last_process(log_text: str) -> str:
    """What the last fairseq process wrote into a segment's log (which keeps the killed processes' output
    before it): where that process resumed from is its own "Loaded checkpoint" line, not an earlier one's (a
    process that started from scratch, its checkpoint gone, loads nothing)."""
    starts = [m.start() for m in PROCESS_START.finditer(log_text)]
    return log_text[starts[-1]:] if starts else log_text


def rank(results, condition, lr_by_row=None):
    """The ranked rows of ``results`` (claims-study cells) at ``condition``.

    Args:
        lr_by_row: ``{row: learning rate}`` the rows trained at (None: each cell's own setting).

    Returns:
        list of dicts, best first: ``row``, ``label``, ``lr``, ``seeds``, ``diverged``, ``failed``, the
        ``(mean, sd, n)`` of ``valid_nll``, ``bleu``, ``chrf``, ``grad_enc``, ``grad_dec``, ``cos_enc``,
        ``cos_dec``, their texts under ``text``, ``paper`` (the paper's BLEU, ``"fail"`` or None), ``broken``
        (diverged or failed in most seeds), ``rank`` and ``vs_next`` (:func:`paired_difference` to the row below).
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
        entry["broken"] = 2 * (entry["diverged"] + entry["failed"]) > entry["seeds"]  # diverged or failed mostly
        rows.append(entry)

    def order(e):
        nll, bleu = e["valid_nll"][0], e["bleu"][0]
        return (e["broken"] or nll is None, nll if nll is not None else math.inf, -(bleu or 0.0))

    rows.sort(key=order)
    for i, e in enumerate(rows, 1):
        e["rank"] = i
    by_seed = _by_seed(results, condition)
    for above, below in zip(rows, rows[1:]):
        above["vs_next"] = paired_difference(by_seed, above["row"], below["row"])
    return rows


def _by_seed(results, condition, metric="valid_nll"):
    """``{(row, seed): metric or None}`` (:func:`.claims.cell_metrics`' ``metric``) of the cells at ``condition``."""
    return {(r["scheme"], r["seed"]): cell_metrics(r)[metric] for r in results if r["condition"] == condition}


def paired_difference(by_seed, a, b):
    """Row ``a``'s valid nll (or another metric) minus row ``b``'s, seed-paired: over the seed numbers both have
    (``by_seed``: ``{(row, seed): value or None}``, :func:`_by_seed`). Returns :func:`.stats.verdict`'s dict
    (claimed sign negative: ``a`` lower) with ``resolved``: the 95% t-interval excludes zero."""
    seeds = sorted({s for (row, s) in by_seed if row == a} & {s for (row, s) in by_seed if row == b})
    diffs = [by_seed[a, s] - by_seed[b, s] for s in seeds if by_seed[a, s] is not None and by_seed[b, s] is not None]
    v = verdict(diffs, -1)
    return dict(v, resolved=v["verdict"] != "inconclusive")


#: the budgets (updates) at which the rows' order is compared with their order at the final budget
ORDER_AT = (1000, 2000)


def same_order(first, second):
    """How far two orders of the same rows agree, over the rows both ``{row: value}`` hold a finite value for
    (lower first): ``(concordant, discordant, pairs)``; a pair tied in either is neither. Kendall's tau-a is
    ``(concordant - discordant) / pairs``."""
    common = [r for r in first if _finite(first[r]) and _finite(second.get(r))]
    pairs = list(itertools.combinations(common, 2))
    signs = [(first[a] - first[b]) * (second[a] - second[b]) for a, b in pairs]
    return sum(x > 0 for x in signs), sum(x < 0 for x in signs), len(pairs)


def _finite(value):
    return value is not None and math.isfinite(value)


def _negated(value):
    return None if value is None else -value


def order_stability(rows, results, condition, final, selected=None, lr_by_row=None):
    """How far the ranking's order can be trusted, over the rows not diverged in most seeds
    (``rows``: :func:`rank`'s; the final order is theirs, by mean valid nll at the final budget ``final``):

    * ``pairs``: every pair of rows, its :func:`paired_difference` (not only the neighbours of the table), and
      under ``"bleu"`` the same in BLEU; ``bleu_order``: the rows' order by mean BLEU (higher first) against the
      ranking's (:func:`same_order`);
    * ``within_training``: ``{U: same_order}``, the rows' order on their seed-mean validation curves
      (``equal_compute["curve"]``, the seeds that trained) at each budget U of :data:`ORDER_AT` below ``final``
      against the final order (:func:`same_order`);
    * ``one_seed``: the selection's cell at each row's chosen rate (``selected``: the selection cells, one seed,
      U updates, at ``condition``; ``lr_by_row``: the chosen rates) against the final seeds' mean at U updates
      (``"at_u"``: the seeds' noise alone) and against the final order (``"final"``: what the cheap screen
      predicts); None without them;
    * ``paper``: every pair of rows with a paper number (:func:`rank`'s ``paper``: higher BLEU first, a ``fail``
      last), ``{"rows", "agrees" (True, False, or None for a tie in the paper), "here": paired_difference}``.
    """
    kept = [e for e in rows if not e["broken"]]
    by_seed, bleu_by_seed = _by_seed(results, condition), _by_seed(results, condition, "bleu")
    pairs = [dict(paired_difference(by_seed, a["row"], b["row"]), rows=(a["row"], b["row"]),
                  bleu=paired_difference(bleu_by_seed, a["row"], b["row"]))
             for a, b in itertools.combinations(kept, 2)]
    curves = {e["row"]: (e.get("equal_compute") or {}).get("curve") or {} for e in kept}
    last = {e["row"]: e["valid_nll"][0] for e in kept}

    def at(u):
        return {row: c.get(u) for row, c in curves.items()}

    within = {u: same_order(at(u), last) for u in ORDER_AT if u < final}
    one_seed = None
    if selected and lr_by_row:
        chosen = {r["scheme"]: (cell_metrics(r)["valid_nll"], r["settings"]["updates"]) for r in selected
                  if r["scheme"] in last and r["condition"] == condition and lr_by_row.get(r["scheme"]) is not None
                  and math.isclose(r["settings"]["lr"], lr_by_row[r["scheme"]])}
        budgets = {u for _, u in chosen.values()}
        if len(budgets) == 1:
            u = budgets.pop()
            one = {row: nll for row, (nll, _) in chosen.items()}
            one_seed = dict(updates=u, at_u=same_order(one, at(u)), final=same_order(one, last))
    paper = {e["row"]: (0.0 if e["paper"] == "fail" else -e["paper"]) for e in kept if e.get("paper") is not None}
    by_pair = {p["rows"]: p for p in pairs}
    versus = [dict(rows=(a, b), here=by_pair[a, b], agrees=None if paper[a] == paper[b] else
                   (paper[a] - paper[b]) * (last[a] - last[b]) > 0)
              for a, b in itertools.combinations([e["row"] for e in kept if e["row"] in paper], 2)
              if _finite(last[a]) and _finite(last[b])]
    bleu_order = same_order({e["row"]: _negated(e["bleu"][0]) for e in kept}, last)
    return dict(pairs=pairs, bleu_order=bleu_order, final=final, within_training=within, one_seed=one_seed,
                paper=versus)


def _order_text(concordant, discordant, pairs):
    if not pairs:
        return "no pair (fewer than two rows)"
    tied = pairs - concordant - discordant
    return (f"{concordant} of {pairs} pairs in the same order, {discordant} reversed"
            + (f", {tied} tied" if tied else "") + f" (Kendall's tau-a {(concordant - discordant) / pairs:.2f})")


def _here(pair):
    """A reversed pair's seed-paired difference here, in words."""
    here, first = pair["here"], row_label(pair["rows"][0])
    if here["mean"] is None:
        return "no seed in common here"
    ci = f" ± {here['ci']:.3f}" if here["ci"] is not None else ""
    return (f"here {first} is lower by {-here['mean']:.3f} bits{ci}, "
            + ("beyond the seed spread" if here["resolved"] else "not told apart"))


def order_text(found):
    """:func:`order_stability`'s findings as a Markdown list."""
    pairs = found["pairs"]
    apart = [p for p in pairs if not p["resolved"]]
    lines = [f"- **Beyond the seed spread:** {len(pairs) - len(apart)} of {len(pairs)} pairs of rows differ in "
             "valid nll beyond it (the seed-paired 95% t-interval excludes zero). Not told apart: "
             + (", ".join(" / ".join(map(row_label, p["rows"])) for p in apart) if apart else "none") + ".",
             f"- **In BLEU:** {sum(p['bleu']['resolved'] for p in pairs)} of {len(pairs)} pairs differ beyond the seed "
             f"spread; the rows' BLEU order (higher first) against their valid-nll order: "
             f"{_order_text(*found['bleu_order'])}."]
    if found["within_training"]:
        lines.append(f"- **Within training:** the rows' order by seed-mean valid nll against the ranking's (at "
                     f"{found['final']} updates): at "
                     + "; at ".join(f"{u} updates {_order_text(*v)}" for u, v in found["within_training"].items())
                     + ".")
    one = found["one_seed"]
    if one:
        lines.append(f"- **One seed at {one['updates']} updates:** the selection's cell at each row's chosen rate, "
                     f"against the final seeds' mean at {one['updates']} updates (the seeds' noise alone): "
                     f"{_order_text(*one['at_u'])}; against the ranking at {found['final']} updates (what the "
                     f"cheap screen predicts): {_order_text(*one['final'])}.")
    versus = found["paper"]
    if versus:
        reversed_ = [p for p in versus if p["agrees"] is False]
        text = "; ".join(f"{row_label(p['rows'][0])} / {row_label(p['rows'][1])} ({_here(p)})" for p in reversed_)
        lines.append(f"- **Against the paper:** of {len(versus)} pairs of rows with a number in the paper's IWSLT14 "
                     f"table, {sum(p['agrees'] is True for p in versus)} are in the paper's order (its higher BLEU, "
                     f"here the lower valid nll), {len(reversed_)} reversed"
                     + (f": {text}" if reversed_ else "") + ".")
    return "\n".join(lines)


def _vs_next(e):
    v = e.get("vs_next")
    if not v or v["mean"] is None:
        return "-"
    ci = f" ± {v['ci']:.3f}" if v["ci"] is not None else ""
    return f"{v['mean']:+.3f}{ci} ({'resolved' if v['resolved'] else 'not resolved'}, n = {v['n']})"


def _equal(e, key=None):
    """The equal-compute cell of row ``e``: at its measured cost, or (``key`` "idle") at its idle-machine cost."""
    q = e.get("equal_compute")
    if key and q:
        q = q.get(key)
    if q and q.get("trained") is False:  # every seed diverged or failed: a broken run's curve is not read
        return "- (no seed trained)"
    if not q or q["updates"] is None:  # no Pre-LN cell to measure C yet (or no idle ratio for the row)
        return "-"
    if q["text"] is None:
        return f"below the first validation ({q['updates']:.0f} updates)"
    mark = " (its final budget: cheaper than Pre-LN, an upper bound)" if q["bound"] else ""
    return f"{q['text']} at {q['updates']:.0f} updates{mark}"


def table(rows):
    """The ranked rows as a Markdown table (with the equal-compute column at idle-machine costs when the rows
    have it)."""
    idle = any("idle" in (e.get("equal_compute") or {}) for e in rows)
    return markdown_table(
        ["rank", "scheme", "lr", "seeds", "diverged", "valid nll", "vs next (paired, 95% CI)", "BLEU", "chrF",
         "grad L1/top enc / dec", "cos top enc / dec", "CPU-s / update", "valid nll at Pre-LN's CPU-s",
         *(["the same at idle costs"] if idle else []), "plateau (curve)", "lowest on the curve (updates)",
         "training nll at the end", "paper BLEU (IWSLT14)"],
        [[e["rank"], e["label"], f"{e['lr']:g}", e["seeds"],
          f"{e['diverged']}" + (f" (+{e['failed']} failed)" if e["failed"] else ""),
          e["text"]["valid_nll"], _vs_next(e), e["text"]["bleu"], e["text"]["chrf"],
          f"{e['text']['grad_enc']} / {e['text']['grad_dec']}", f"{e['text']['cos_enc']} / {e['text']['cos_dec']}",
          "-" if e.get("cpu_per_update") is None else f"{e['cpu_per_update']:.3f}", _equal(e),
          *([_equal(e, "idle")] if idle else []), e.get("plateau_text", "-"), _lowest(e),
          (e.get("equal_compute") or {}).get("train_text") or "-",
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


def plot_curves(rows, path, title):
    """The seed-mean validation curves of the ranked rows against training CPU-seconds (updates x the row's
    CPU-seconds per update), with Pre-LN's CPU-seconds for the final budget marked: the equal-compute column
    is where each curve crosses that line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    total = None
    for e in rows:
        q = e.get("equal_compute") or {}
        if not q.get("curve") or not q.get("cpu_per_update"):
            continue
        xs = sorted(q["curve"])
        ax.plot([u * q["cpu_per_update"] for u in xs], [q["curve"][u] for u in xs], "-o", ms=2.5,
                color=row_color(e["row"]), label=e["label"])
        if e["row"] == BASELINE:
            total = max(xs) * q["cpu_per_update"]
    if total:
        ax.axvline(total, color="black", ls=":", lw=1, label="Pre-LN's CPU-s for the final budget")
    ax.set_xlabel("training CPU-seconds (one thread)")
    ax.set_ylabel("valid nll (bits / token), seed mean")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cpu_hours(cells):
    """The CPU-hours the finished ``cells`` (claims-study results) spent training and translating."""
    return sum((r.get("train_cpu_s") or 0) + ((r.get("scores") or {}).get("translate_cpu_s") or 0)
               for r in cells) / 3600


def this_machine():
    """This machine's CPU as the cells' costs name it: the model name of ``/proc/cpuinfo`` (else
    ``platform.processor()``, else "unknown CPU") and how many cores the process may use, e.g. "AMD EPYC, 2 cores"."""
    import platform

    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model or platform.processor() or 'unknown CPU'}, {cores} cores"


def cell_machine(run_dir):
    """The machine a finished cell trained on: the one its archived ``cost.json`` names, else this machine where
    the cell's training logs are here (it trained in this study folder), else None (unrecorded: an archive from
    before the record)."""
    saved = read_json(os.path.join(run_dir, "cost.json"))
    if saved:
        return saved.get("machine")
    return this_machine() if glob.glob(os.path.join(run_dir, "train-u*.log")) else None


def training_cost(run_dir, result):
    """``(training CPU-seconds, updates they trained)`` of the cell in ``run_dir`` (``result``: its result).

    Per segment of its ``train_state.json``: the CPU-seconds of the fairseq process that finished it and the
    updates that process trained (to the cell's ``reached`` where it stopped early), counted from where its log
    says that last process resumed (a study killed in the middle
    of a segment runs it again; fairseq resumes from the segment's last checkpoint, and the killed process's CPU
    time is not recorded), else from the segment's start. Where the logs are not kept (an archive), the
    ``cost.json`` the archive wrote; else the result's own totals."""
    segments = (read_json(os.path.join(run_dir, "train_state.json")) or {}).get("segments") or []
    logs = [os.path.join(run_dir, g["log"]) for g in segments if g.get("log")]
    if segments and len(logs) == len(segments) and all(os.path.exists(p) for p in logs):
        cpu = trained = 0
        for g, path in zip(segments, logs):
            with open(path, encoding="utf-8", errors="replace") as f:
                loaded = LOADED.findall(_last_process(f.read()))
            start = max(g["start"], int(loaded[-1])) if loaded else g["start"]
            end = min(g["updates"], result.get("reached") or g["updates"])  # a run that stopped early: its last
            cpu, trained = cpu + (g.get("train_cpu_s") or 0), trained + max(end - start, 0)
        return cpu, trained
    saved = read_json(os.path.join(run_dir, "cost.json"))
    if saved:
        return saved["train_cpu_s"], saved["trained_updates"]
    return result.get("train_cpu_s") or 0, result.get("reached") or 0


def _merged(archived, logged):
    """The points of an archived curve and of the logs, the logs' where both have an update (a cell restored
    from an archive and trained on has logs of its new segment only)."""
    points = {int(u): v for u, v in (archived or [])}
    points.update({int(u): v for u, v in logged})
    return [[u, points[u]] for u in sorted(points)]


def cell_curves(run_dir):
    """A cell's validation curve ``[[updates, valid nll], ...]`` and training curve ``[[updates, training nll],
    ...]``: from its logs (:func:`log_curves`, each log read once) and the archived ``curve.json`` and
    ``train_curve.json`` (:func:`_merged`; no training curve for a cell archived before it was kept)."""
    valid, train = log_curves(run_dir)
    return (_merged(read_json(os.path.join(run_dir, "curve.json")), valid),
            _merged(read_json(os.path.join(run_dir, "train_curve.json")), train))


def _at(curve, updates):
    """The curve's valid nll at ``updates``, linearly interpolated between validations; None outside."""
    for (u0, v0), (u1, v1) in zip(curve, curve[1:]):
        if u0 <= updates <= u1:
            return v0 + (v1 - v0) * (updates - u0) / (u1 - u0)
    return curve[-1][1] if curve and curve[-1][0] == updates else None


def _read_at(curves, total, rate, budget):
    """The seeds' curves read at ``total`` CPU-seconds for a row costing ``rate`` CPU-s per update (at most
    ``budget`` updates): ``{"cpu_per_update", "updates", "nll": (mean, sd, n), "text", "bound"}``; nothing is read
    where no curve is given."""
    entry = dict(cpu_per_update=rate, updates=None, nll=None, text=None, bound=False)
    if total and rate and curves:
        updates = total / rate
        entry["bound"] = updates > budget
        entry["updates"] = min(updates, budget)
        values = [_at(c, entry["updates"]) for c in curves]
        if all(v is not None for v in values):
            entry["nll"] = mean_sd(values)
            entry["text"] = ms_text(values, 3)
    return entry


def equal_compute(out, results, budget, idle=None):
    """Each row's valid nll after the training CPU-seconds Pre-LN needed for ``budget`` updates (the plan's
    equal-compute column), and the plateau rule on its seed-mean curve.

    C = Pre-LN's training CPU-seconds per update (summed over its cells, :func:`training_cost`) x ``budget``;
    a row costing c CPU-s per update is read at C / c updates on each seed's curve, linearly interpolated
    between validations, nothing extrapolated: a row cheaper than Pre-LN gets its value at ``budget``, an upper
    bound on its nll at equal compute (``bound``); a point before the first validation is not read.

    Args:
        idle: ``{row: training time per token relative to stock Pre-LN}`` measured on an idle machine
            (:func:`.speed_compare.training_time_ratios`), or None. With it, each row is read a second time
            (``"idle"``) at c = Pre-LN's measured cost x its ratio / Pre-LN's ratio: the same column without the
            load the cells ran under.

    Returns:
        ``{row: {"cpu_per_update", "updates", "nll": (mean, sd, n), "text", "bound", "trained", "plateau",
        "lowest", "curve", "train_nll": (mean, sd, n), "train_text", "machines"[, "idle"]}}``; nll: over the seeds
        that did not diverge or fail, as the ranking's valid nll (``trained`` False and no reading where every
        seed diverged or failed); curve: ``{updates: valid
        nll}``, the mean over the seeds that did not diverge or fail (over all where none did) at the validations
        they share; lowest: :func:`lowest_point` of the curve; train_nll: the training nll of the seeds that did
        not diverge or fail over the validation interval ending at ``budget`` (:func:`cell_curves`; n = 0
        where none has it; train_text names n where fewer seeds have it than trained);
        machines: those the row's cells trained on (:func:`cell_machine`).
    """
    cells = {}
    for r in results:
        cells.setdefault(r["scheme"], []).append(r)
    rate = {}
    for row, mine in cells.items():
        costs = [training_cost(os.path.join(out, "cells", r["cell"]), r) for r in mine if r.get("cell")]
        cpu, trained = sum(c for c, _ in costs), sum(t for _, t in costs)
        rate[row] = cpu / trained if trained else None
    total = rate.get(BASELINE) and rate[BASELINE] * budget
    found = {}
    for row, mine in cells.items():
        both = {r["cell"]: cell_curves(os.path.join(out, "cells", r["cell"])) for r in mine if r.get("cell")}
        read = [(r["status"] == "ok", [tuple(p) for p in both[r["cell"]][0]]) for r in mine if r.get("cell")]
        # read at equal compute: the seeds that trained, those the ranking's valid nll averages (none: no reading)
        curves = [c for ok, c in read if ok and c]
        # the seed-mean curve of the seeds that trained (those the ranking's valid nll averages), else of all
        by_update = [dict(c) for c in curves] or [dict(c) for _, c in read if c]
        common = sorted(set.intersection(*(set(d) for d in by_update))) if by_update else []
        mean_curve = {u: mean_sd([d[u] for d in by_update])[0] for u in common}
        # the training nll of the seeds the valid nll averages (those that trained); none for a row without one
        ok = [r for r in mine if r.get("cell") and r["status"] == "ok"]
        trained = [dict(map(tuple, both[r["cell"]][1])).get(budget) for r in ok]
        train_nll = mean_sd(trained)
        train_text = ms_text(trained, 3) + (f" (n = {train_nll[2]})" if 0 < train_nll[2] < len(ok) else "")
        entry = dict(_read_at(curves, total, rate[row], budget), trained=bool(ok),
                     curve=mean_curve, train_nll=train_nll, train_text=train_text,
                     plateau=plateau(mean_curve, start=CURVE_PLATEAU_FROM), lowest=lowest_point(mean_curve),
                     machines=sorted({cell_machine(os.path.join(out, "cells", r["cell"])) or "unrecorded"
                                      for r in mine if r.get("cell")}))
        if idle is not None:
            idle_rate = (rate.get(BASELINE) and idle.get(row) and idle.get(BASELINE)
                         and rate[BASELINE] * idle[row] / idle[BASELINE])
            entry["idle"] = _read_at(curves, total, idle_rate or None, budget)
        found[row] = entry
    return found


def lowest_point(curve):
    """The lowest point of a seed-mean validation curve ``{updates: valid nll}`` and how far the curve rose after
    it: ``(updates, nll, rise)`` with ``rise`` = the nll at the curve's last validation minus the lowest (0 when
    the lowest is the last; the earliest of equal lows); None for an empty curve. A rise is over-fitting (or
    instability) by the final budget, which the ranking, by the plan, still reads at the final budget."""
    points = [(u, v) for u, v in sorted(curve.items()) if _finite(v)]
    if not points:
        return None
    u, v = min(points, key=lambda p: p[1])
    return u, v, points[-1][1] - v


def _lowest(e):
    """The table's "lowest on the curve" cell of row ``e``."""
    low = (e.get("equal_compute") or {}).get("lowest")
    if not low:
        return "-"
    u, v, rise = low
    return f"{v:.3f} at {u:.0f}" + (f", then +{rise:.3f} by the end" if rise > 0 else "")


def machine_note(found) -> str:
    """A sentence on the machines the final cells trained on (``found``: :func:`equal_compute`'s), naming the rows
    whose cells did not all run on Pre-LN's one machine: their CPU-seconds, and so their equal-compute reading at
    measured costs, compare CPUs as well as schemes. Empty when every cell ran on one recorded machine."""
    every = sorted({m for e in found.values() for m in e.get("machines", ())})
    if len(every) == 1 and every[0] != "unrecorded":
        return ""
    base = found.get(BASELINE, {}).get("machines", [])
    known = len(base) == 1 and base != ["unrecorded"]
    apart = [row_label(row) for row, e in found.items() if row != BASELINE and (not known or e.get("machines") != base)]
    text = f"The final cells trained on: {', '.join(every)}."
    if apart:
        text += (f" Not all on Pre-LN's one recorded machine: {', '.join(apart)}; their equal-compute reading at "
                 "measured costs compares CPUs as well as schemes" + ("; the reading at idle costs does not." if
                                                                       any("idle" in e for e in found.values())
                                                                       else "."))
    return text


def cost_table(selection_cells, rows, final_updates, seeds, out=None):
    """What the ranking costs, from the finished cells: per row its measured training CPU-seconds per update
    (mean over its finished selection cells) and the projected CPU-hours of its final cells.

    Args:
        selection_cells: the finished selection cells (claims-study results).
        rows: the rows in report order.
        final_updates, seeds: the final cells' budget and how many seeds each row trains.
        out: the study folder, whose cells' logs give each cell's cost (:func:`training_cost`); None: the
            results' own totals.

    Returns:
        ``(Markdown table, {"spent_cpu_h", "projected_final_cpu_h", "per_update": {row: CPU-s or None}})``;
        spent: the training and translation CPU-seconds of every finished cell given.
    """
    lines, per_update = [], {}
    for row in rows:
        mine = [r for r in selection_cells if r["scheme"] == row and r.get("train_cpu_s")]
        dirs = [os.path.join(out, "cells", r["cell"]) if out and r.get("cell") else None for r in mine]
        costs = [training_cost(d, r) if d else (r["train_cpu_s"], r.get("reached")) for d, r in zip(dirs, mine)]
        costs = [cpu / trained for cpu, trained in costs if trained]
        per_update[row] = sum(costs) / len(costs) if costs else None
        projected = None if per_update[row] is None else per_update[row] * final_updates * seeds / 3600
        lines.append([row_label(row), len(mine), "-" if not costs else f"{per_update[row]:.3f}",
                      "-" if projected is None else f"{projected:.2f}", _machines(dirs)])
    spent = cpu_hours(selection_cells)
    projected = sum(v * final_updates * seeds for v in per_update.values() if v) / 3600
    text = markdown_table(["row", "selection cells finished", "training CPU-s per update (selection cells)",
                           f"final cells, projected CPU-h ({seeds} x {final_updates} updates)",
                           "machines of the selection cells ('unrecorded': archived before cells recorded it)"],
                          lines, align=["l", "r", "r", "r", "l"])
    return text, dict(spent_cpu_h=round(spent, 2), projected_final_cpu_h=round(projected, 2),
                      per_update=per_update)


def _machines(run_dirs):
    """Which machines the cells in ``run_dirs`` ran on, with how many cells each ("unrecorded" for archived cells
    without the record, "-" for none)."""
    counts = {}
    for d in run_dirs:
        if d:
            name = cell_machine(d) or "unrecorded"
            counts[name] = counts.get(name, 0) + 1
    return "; ".join(f"{name} ({n})" for name, n in counts.items()) or "-"


def log_curves(run_dir):
    """A cell's validation and training curves from its fairseq logs (``train-u*.log``, each read once).

    Returns:
        ``(valid, train)``: valid ``[[updates, valid nll in bits], ...]`` in update order, one point per
        validation (the cells validate at every checkpoint); train ``[[updates, nll in bits], ...]``, one point
        per validation ``updates``, the mean of the ``train_inner`` records (:func:`.logs.train_nll_by_update`,
        every ``--log-interval`` updates, with dropout) logged after the previous validation and up to it; a
        validation without such records has no training point.
    """
    records, validations = {}, {}
    for path in sorted(glob.glob(os.path.join(run_dir, "train-u*.log"))):
        log = read_train_log(path)  # once for both kinds of record
        records.update(train_nll_by_update(path, log))
        validations.update(valid_nll_by_update(path, log))
    train, previous = [], 0
    for u in sorted(validations):
        window = [v for n, v in records.items() if previous < n <= u]
        if window:
            train.append([u, statistics.fmean(window)])
        previous = u
    return [[u, validations[u]] for u in sorted(validations)], train


#: a finished cell's small files that the archive keeps (never checkpoints or logs)
ARCHIVED = ("settings.json", "train_state.json", "budgets/u*/result.json", "budgets/u*/analysis/analysis.json")


def archive(out, dest, cells=None):
    """Copy every finished cell's small files from the study folder ``out`` into ``dest/cells`` (the same
    layout, plus ``curve.json``, its validation curve, :func:`cell_curves` (from its logs, or from the archive a
    cell restored from one brought), ``train_curve.json``, its training nll between validations (the same), and ``cost.json``, its training
    CPU-seconds and the updates they trained, :func:`training_cost`, and the machine they ran on,
    :func:`cell_machine`: costs measured on different CPUs do not compare), so that the report can be
    rebuilt, and the study resumed on another machine, from what a repository holds: copy ``dest/cells``
    into a new study folder's ``cells`` and the same command skips every archived cell. ``cells``: the names
    of the cell folders to archive (a study's own, where one study folder holds the cells of several), or None
    for every finished cell. Returns the number of cells archived."""
    import json

    n = 0
    for run_dir in sorted(glob.glob(os.path.join(out, "cells", "*"))):
        if not glob.glob(os.path.join(run_dir, "budgets", "u*", "result.json")) or (
                cells is not None and os.path.basename(run_dir) not in cells):
            continue
        target = os.path.join(dest, "cells", os.path.basename(run_dir))
        for pattern in ARCHIVED:
            for src in glob.glob(os.path.join(run_dir, pattern)):
                dst = os.path.join(target, os.path.relpath(src, run_dir))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(src, dst)
        valid_points, trained_curve = cell_curves(run_dir)
        with open(os.path.join(target, "curve.json"), "w", encoding="utf-8") as f:
            json.dump(valid_points, f)
        if trained_curve:
            with open(os.path.join(target, "train_curve.json"), "w", encoding="utf-8") as f:
                json.dump(trained_curve, f)
        result = read_json(sorted(glob.glob(os.path.join(run_dir, "budgets", "u*", "result.json")))[-1]) or {}
        cpu, trained = training_cost(run_dir, result)
        cost = dict(train_cpu_s=cpu, trained_updates=trained)
        machine = cell_machine(run_dir)
        if machine:
            cost["machine"] = machine
        write_json(os.path.join(target, "cost.json"), cost)
        n += 1
    for name in ("ranking.md", "ranking.json", "ranking.png", "ranking_curves.png"):
        if os.path.exists(os.path.join(out, name)):
            shutil.copyfile(os.path.join(out, name), os.path.join(dest, name))
    return n


def write(out, results, condition, lr_by_row=None, note="", selection=None, progress=None, idle=None,
          selected=None, cost_basis="one thread, two runs side by side"):
    """``ranking.md``, ``ranking.json``, ``ranking.png`` and ``ranking_curves.png`` in ``out``; returns the
    Markdown text. ``ranking.json`` holds the ranked rows, the order's statistics, the cells and, with
    ``lr_by_row``, every row's rate as ``chosen_lr`` (what ``--lr-from`` reads).

    Args:
        results: the claims-study cells of ``condition`` (one per row and seed).
        lr_by_row: ``{row: learning rate}`` the rows trained at (None: each cell's own setting).
        note: a sentence on the protocol and the command, after the table's legend.
        selection: the learning-rate selection's Markdown table (:func:`.lr_protocol.selection_table`), or None.
        progress: a Markdown section on what has finished and what it costs (:func:`cost_table`), or None.
        idle: the rows' training time relative to stock Pre-LN on an idle machine (:func:`equal_compute`), or
            None.
        selected: the selection's cells (one seed per row and rate), for :func:`order_stability`; or None.
        cost_basis: how the cells ran, for the legend of the CPU-seconds columns.
    """
    rows = rank(results, condition, lr_by_row)
    budget = max((r.get("reached") or 0 for r in results), default=0)
    found = equal_compute(out, results, budget, idle) if rows else {}
    for e in rows:
        q = found.get(e["row"], {})
        e["cpu_per_update"], e["equal_compute"], e["plateau"] = q.get("cpu_per_update"), q, q.get("plateau")
        e["plateau_text"] = ("-" if not q.get("curve") else f"stopped at {q['plateau']}" if q.get("plateau")
                             else f"no plateau by {max(q['curve'])}")
    order = order_stability(rows, results, condition, budget, selected, lr_by_row) if rows else None
    depth = CONDITIONS[condition][0]
    title = f"Every row at {condition} ({depth}+{depth} layers), ranked"
    ranked = [table(rows), "", *([machine_note(found), ""] if machine_note(found) else []),
              paper_results.describe("iwslt14") or "", "", "![ranking](ranking.png)", "",
              "Validation curves against training CPU-seconds (equal compute: where each crosses the dotted line):",
              "", "![curves](ranking_curves.png)", "",
              "## How far the order holds", "", order_text(order), ""] if rows \
        else ["No row has a finished final cell yet: the ranking appears when the first do.", ""]
    idle_legend = ("; the same at idle costs: read where each row's cost per update is Pre-LN's measured cost "
                   "times the row's training time relative to Pre-LN's on an idle machine (the speed benchmark at "
                   "the cells' shape), free of the load the cells ran under") if idle else ""
    text = "\n".join([
        f"# {title}", "",
        "Mean ± sample sd over seeds; rows diverged in most seeds last, the others by valid nll (bits per "
        "token, lowest first). vs next: the seed-paired difference in valid nll to the row below, with its 95% "
        "t-interval (resolved when it excludes zero). grad: layer-1 / top-layer gradient norm, cos: cosine of "
        "the last two layer outputs, encoder / decoder. CPU-s / update: training CPU-seconds per update over the "
        f"row's cells in this table, its seeds ({cost_basis}; the progress table's figure is its selection cells'). "
        "Equal compute: the valid nll after the training "
        "CPU-seconds Pre-LN needed for the final budget, read on each seed's validation curve at that many of "
        "the row's updates (linear between validations, never extrapolated; a row cheaper than Pre-LN shows its "
        f"final-budget value, an upper bound){idle_legend}. Plateau: the first validation at or after "
        f"{CURVE_PLATEAU_FROM} updates less than 0.03 bits below the one 1,000 updates earlier, on the seed-mean "
        "curve; 'no plateau' makes the ranking one of training speed to the final budget, not of converged "
        "models. Lowest on the curve: the seed-mean curve's lowest validation, and how far it rose by the final "
        "budget (a rise is over-fitting or instability; the ranking stays at the final budget, as the plan "
        "registers). Training nll at the end: the mean of fairseq's training log records over the validation "
        "interval ending at the final budget (bits per token, with dropout; the seeds of the valid nll), "
        "beside the valid nll: a row whose training nll is low and valid nll high fits the training set "
        "without generalising. BLEU / chrF: " + scoring_text(results) + " " + note, "",
        *(["## Progress", "", progress, ""] if progress else []),
        *ranked,
        *(["## How each row's learning rate was chosen", "", selection, ""] if selection else [])])
    with open(os.path.join(out, "ranking.md"), "w", encoding="utf-8") as f:
        f.write(text)
    saved = dict(condition=condition, rows=rows, order=order, cells=results)
    if lr_by_row:  # every row with a rate, ranked or not yet: what --lr-from reads
        saved["chosen_lr"] = dict(lr_by_row)
    write_json(os.path.join(out, "ranking.json"), saved)
    if rows:
        plot(rows, os.path.join(out, "ranking.png"), title)
        plot_curves(rows, os.path.join(out, "ranking_curves.png"), f"{title}: valid nll against CPU time")
    else:  # no plot of another study that wrote into this folder is left to be read or archived as this one's
        for name in ("ranking.png", "ranking_curves.png"):
            if os.path.exists(os.path.join(out, name)):
                os.remove(os.path.join(out, name))
    return text


def _rate(lr) -> str:
    """``0.004`` -> ``4e-3``, ``0.0015`` -> ``1.5e-3`` (every significant digit kept)."""
    mantissa, exponent = f"{lr:.6e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _complete_rows(data):
    """``(rows, seeds)``: a ``ranking.json``'s rows with all their seeds (the most any row has), in rank order."""
    seeds = max(r["seeds"] for r in data["rows"])
    return [r for r in data["rows"] if r["seeds"] == seeds], seeds


def readme_table(data, baseline=BASELINE):
    """The README's summary of a ranking: every row with all its seeds (the most any row has), in rank order, its
    rate, valid nll and BLEU (mean ± sd), each against ``baseline`` as the seed-paired difference with its 95%
    interval ("level" where the interval spans zero), and the paper's IWSLT14 BLEU.

    Args:
        data: a ``ranking.json`` (:func:`write_report`'s), with its order's pairs.
        baseline: the row the others are read against.

    Returns:
        The Markdown table (a string ending in a newline).

    Raises:
        ValueError: ``baseline`` has not all its seeds.
    """
    rows, seeds = _complete_rows(data)
    if baseline not in {r["row"] for r in rows}:
        raise ValueError(f"{row_label(baseline)} has fewer than {seeds} seeds in the ranking: nothing to read against")
    pairs = {tuple(p["rows"]): p for p in data["order"]["pairs"]}

    def against(row, key, digits):
        pair, sign = pairs.get((row, baseline)), 1
        if pair is None:
            pair, sign = pairs[(baseline, row)], -1
        pair = pair if key is None else pair[key]
        if not pair["resolved"]:
            return "level"
        return f"{sign * pair['mean']:+.{digits}f} ± {pair['ci']:.{digits}f}"

    lines = []
    for r in rows:
        mine = r["row"] == baseline
        lines.append([r["label"], _rate(r["lr"]), r["text"]["valid_nll"], "" if mine else against(r["row"], None, 3),
                      r["text"]["bleu"], "" if mine else against(r["row"], "bleu", 2),
                      "-" if r["paper"] is None else r["paper"]])
    return markdown_table(["scheme", "lr", "valid nll (bits)", f"vs {row_label(baseline)}", "BLEU",
                           f"vs {row_label(baseline)}", "paper's IWSLT14 12-layer BLEU"], lines)


def rows_table(data):
    """The results page's summary of a ranking: every row with all its seeds, in rank order, its rate, valid nll,
    BLEU and chrF (mean ± sd), the mean layer-1 / top-layer gradient ratio (encoder / decoder) and the paper's
    IWSLT14 BLEU (``data``: a ``ranking.json``). Returns the Markdown table."""
    lines = [[r["label"], _rate(r["lr"]), r["text"]["valid_nll"], r["text"]["bleu"], r["text"]["chrf"],
              " / ".join(r["text"][k].split(" ± ")[0] for k in ("grad_enc", "grad_dec")),
              "-" if r["paper"] is None else r["paper"]]
             for r in _complete_rows(data)[0]]
    return markdown_table(["", "lr", "valid nll (bits)", "BLEU", "chrF", "grad L1 / top, enc / dec",
                           "paper's IWSLT14 12-layer BLEU"], lines)

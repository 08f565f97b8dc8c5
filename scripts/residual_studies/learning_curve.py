"""Learning curves: where BLEU stops moving, the measurement behind the claims study's budget.

Entry point: ``scripts/claims_study.sh --learning-curve`` (the claims study's options choose the model,
recipe and data). For each scheme of ``--schemes`` it trains one cell of the claims study (the first of
``--conditions``, the first of ``--seeds``) for ``--updates`` updates with a checkpoint every
``--curve-every`` updates, translates every checkpoint exactly as a study cell's final one is translated
(beam search on the first ``--bleu-sentences`` test sentences, sacreBLEU and chrF of the detokenized
output against the raw references), and reads the valid nll that fairseq's validation logged at each
save. Output, under ``--out``: ``learning_curve.md``, ``learning_curve.json``, ``learning_curve.png``;
the cells live in ``cells/`` beside the study's (their settings differ, so nothing is shared by
accident) and are resumed like them.

Where a metric stops moving (:func:`plateau`): the first checkpoint from which on the running mean of
three consecutive checkpoints stays within a tolerance of its best value (BLEU: :data:`BLEU_TOL`, about
the seed-to-seed spread of one cell's BLEU; valid nll: :data:`NLL_TOL`). When only the last checkpoint
qualifies the metric is still moving at the end of the curve, and no plateau is reported.

A checkpoint that fairseq does not write is a gap in the curve, not an error: fairseq names the save
of an update that ends an epoch after the epoch and ``--no-epoch-checkpoints`` drops it.
"""
import glob
import os
import re
import time

from . import cell, grid
from .claims import DEFAULT_UPDATES, cell_args
from .files import read_json, write_json
from .logs import valid_nll_by_update
from .report import COLORS, LABELS, ORDER, _pyplot, fmt, markdown_table
from .runner import ToolError, loadavg, logger

#: BLEU points: a plateau's tolerance, about the seed-to-seed spread of a cell's BLEU at this scale
BLEU_TOL = 0.5
#: chrF points: a plateau's tolerance for chrF
CHRF_TOL = 1.0
#: bits per token: a plateau's tolerance for the valid nll
NLL_TOL = 0.05
_CKPT_RE = re.compile(r"checkpoint_\d+_(\d+)\.pt$")

log = logger("learning-curve")


def checkpoints(run_dir, final_updates, final_path):
    """``[(updates, path)]`` of a cell's checkpoints in update order: the ``checkpoint_<epoch>_<updates>.pt``
    saves up to ``final_updates``, and ``final_path`` (the budget's checkpoint) as ``final_updates`` when no
    save of that update exists."""
    found = {}
    for path in glob.glob(os.path.join(run_dir, "checkpoint_*_*.pt")):
        m = _CKPT_RE.search(path)
        if m and int(m.group(1)) <= final_updates:
            found[int(m.group(1))] = path
    if final_updates not in found and os.path.exists(final_path):
        found[final_updates] = final_path
    return sorted(found.items())


def running_mean(values, width=3):
    """The centred running mean of ``values`` over ``width`` neighbours (fewer at the ends)."""
    half = width // 2
    out = []
    for i in range(len(values)):
        window = [v for v in values[max(0, i - half):i + half + 1] if v is not None]
        out.append(sum(window) / len(window) if window else None)
    return out


def plateau(updates, values, tol, higher_is_better=True):
    """Where a metric stops moving.

    Args:
        updates: the checkpoints' update counts, increasing.
        values: the metric at each (None where missing).
        tol: how far below its best (above, for a loss) the smoothed metric may lie, in its own units.
        higher_is_better: True for BLEU and chrF, False for a loss.

    Returns:
        ``(update, best)``: the first update count from which on the three-checkpoint running mean stays
        within ``tol`` of its best value, and that best smoothed value; ``update`` is None when fewer than
        three checkpoints (that one and the ones after it) do so: the metric is still moving at the end
        of the curve (the running mean at the last checkpoint averages only two points and lags behind a
        rising curve, so one or two checkpoints near the best say nothing).
    """
    pts = [(u, v) for u, v in zip(updates, values) if v is not None]
    if len(pts) < 3:
        return None, None
    smooth = running_mean([v for _, v in pts])
    sign = 1 if higher_is_better else -1
    best = max(smooth, key=lambda v: sign * v)
    first = None
    for i in range(len(smooth) - 1, -1, -1):  # walk back while the curve stays near its best
        if sign * (best - smooth[i]) <= tol:
            first = pts[i][0]
        else:
            break
    if first is None or [u for u, _ in pts].index(first) > len(pts) - 3:
        return None, best
    return first, best


def curve_of_cell(args, data, settings, run_dir):
    """BLEU, chrF and valid nll at every checkpoint of one trained cell (translations cached in
    ``curve/<updates>/``). Returns ``[{updates, bleu, chrf, valid_nll}]``."""
    nll = {}
    for train_log in sorted(glob.glob(os.path.join(run_dir, "train-u*.log"))):
        nll.update(valid_nll_by_update(train_log))
    final = os.path.join(cell.budget_dir(run_dir, settings["updates"]), "checkpoint.pt")
    points = []
    for updates, path in checkpoints(run_dir, settings["updates"], final):
        out = os.path.join(run_dir, "curve", str(updates))
        cache = os.path.join(out, "scores.json")
        scores = read_json(cache)
        if scores is None:
            scores = cell.translate_and_score(args, data, settings, run_dir, checkpoint=path, out_dir=out)
            if scores.get("bleu") is not None:
                write_json(cache, scores)
        points.append(dict(updates=updates, bleu=scores.get("bleu"), chrf=scores.get("chrf"),
                           valid_nll=nll.get(updates)))
    return points


def run_scheme(args, data, scheme):
    """The learning curve of one scheme: its cell (the first condition and seed, a checkpoint every
    ``--curve-every`` updates) trained, every checkpoint scored, and where each metric stops moving."""
    ns, depth = cell_args(args, args.conditions[0], args.seeds[0], scheme)
    ns.save_every = args.curve_every
    result = cell.run(ns, data, scheme, depth, label=f"{scheme} learning curve")
    settings = result["settings"]
    run_dir = os.path.join(args.out, "cells", result["cell"])
    if result["status"] != "ok":
        log(f"{scheme}: {result['status']} ({result.get('reason')}); its curve stops where training did")
    t0 = time.time()
    points = curve_of_cell(args, data, settings, run_dir)
    log(f"{scheme}: {len(points)} checkpoints scored ({time.time() - t0:.0f} s)")
    ups = [p["updates"] for p in points]
    bleu_at, bleu_best = plateau(ups, [p["bleu"] for p in points], BLEU_TOL)
    chrf_at, _ = plateau(ups, [p["chrf"] for p in points], CHRF_TOL)
    nll_at, nll_best = plateau(ups, [p["valid_nll"] for p in points], NLL_TOL, higher_is_better=False)
    return dict(scheme=scheme, status=result["status"], reason=result.get("reason"), cell=result["cell"],
                settings=settings, command=result.get("command"), train_cpu_s=result.get("train_cpu_s"),
                points=points, plateau=dict(bleu=bleu_at, bleu_best=bleu_best, chrf=chrf_at, valid_nll=nll_at,
                                            valid_nll_best=nll_best))


def write_report(args, curves, budget, wall_s):
    """``learning_curve.md`` / ``.json`` / ``.png`` under ``args.out``; returns the Markdown text."""
    s0 = curves[0]["settings"]
    updates = sorted({p["updates"] for c in curves for p in c["points"]})
    by = {c["scheme"]: {p["updates"]: p for p in c["points"]} for c in curves}

    def cell(scheme, u):
        p = by[scheme].get(u)
        if p is None:
            return "-"
        return f"{fmt(p['bleu'])} / {fmt(p['chrf'], 1)} / {fmt(p['valid_nll'], 3)}"

    rows = [[u] + [cell(c["scheme"], u) for c in curves] for u in updates]
    lines = [
        "# Learning curves: where BLEU stops moving", "",
        f"Command: `scripts/claims_study.sh {' '.join(args.argv)}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M')}; wall {wall_s / 60:.1f} min this invocation; load average at "
        f"the end {loadavg()}.", "",
        f"Setup: the claims study's cell `{args.conditions[0]}` ({s0['depth']}+{s0['depth']} layers, width "
        f"{s0['width']}, FFN {s0['ffn_dim']}, {s0['heads']} heads, dropout {s0['dropout']}, lr {s0['lr']}, "
        f"warm-up {s0['warmup']}, max_tokens {s0['max_tokens']}), seed {s0['seed']}, {s0['updates']} updates, "
        f"a checkpoint every {args.curve_every} updates. Each checkpoint: sacreBLEU / chrF of beam-{s0['beam']} "
        f"translations of the first {s0['bleu_sentences']} test sentences, and the valid nll (bits per target "
        f"token, whole valid split) of fairseq's validation at that save.", "",
        "## BLEU / chrF / valid nll by updates", "",
        markdown_table(["updates"] + [LABELS[c["scheme"]] for c in curves], rows),
        "## Where each metric stops moving", "",
        f"First checkpoint from which on the running mean of three checkpoints stays within {BLEU_TOL} BLEU "
        f"({CHRF_TOL} chrF, {NLL_TOL} bits of valid nll) of its best, for at least three checkpoints; 'still "
        f"moving' when fewer do.", "",
        markdown_table(
            ["scheme", "status", "BLEU stops at", "best BLEU (smoothed)", "chrF stops at", "valid nll stops at",
             "best valid nll (smoothed)", "training CPU-s per update"],
            [[LABELS[c["scheme"]], c["status"], c["plateau"]["bleu"] or "still moving",
              fmt(c["plateau"]["bleu_best"]), c["plateau"]["chrf"] or "still moving",
              c["plateau"]["valid_nll"] or "still moving", fmt(c["plateau"]["valid_nll_best"], 3),
              fmt(c["train_cpu_s"] / c["settings"]["updates"], 3) if c.get("train_cpu_s") else "-"]
             for c in curves]),
        "The CPU time per update includes fairseq's validation at every save (the study's cells validate "
        "once, at the end).", "",
        "![learning curves](learning_curve.png)", "",
    ]
    text = "\n".join(lines)
    with open(os.path.join(args.out, "learning_curve.md"), "w", encoding="utf-8") as f:
        f.write(text)
    write_json(os.path.join(args.out, "learning_curve.json"),
               dict(curves=curves, curve_every=args.curve_every, study_budget=budget,
                    tolerances=dict(bleu=BLEU_TOL, chrf=CHRF_TOL, valid_nll=NLL_TOL)))
    plot(curves, budget, os.path.join(args.out, "learning_curve.png"), s0)
    return text


def plot(curves, budget, path, s0):
    """BLEU, chrF and valid nll against updates, one line per scheme, each plateau a dotted line of the
    scheme's colour, and the claims study's default budget a grey band edge."""
    plt = _pyplot()
    panels = (("bleu", "sacreBLEU", "bleu"), ("chrf", "chrF", "chrf"), ("valid_nll", "valid nll (bits / token)",
                                                                         "valid_nll"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (key, title, pkey) in zip(axes, panels):
        for c in curves:
            pts = [(p["updates"], p[key]) for p in c["points"] if p[key] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, color=COLORS[c["scheme"]], label=LABELS[c["scheme"]])
            at = c["plateau"].get(pkey)
            if at:
                ax.axvline(at, color=COLORS[c["scheme"]], ls=":", lw=1)
        if budget:
            ax.axvline(budget, color="gray", lw=2, alpha=0.5, label=f"claims study default ({budget} updates)")
        ax.set_xlabel("updates")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Learning curves, {s0['depth']}+{s0['depth']} layers, width {s0['width']}, lr {s0['lr']}, "
                 f"max_tokens {s0['max_tokens']} (dotted: where the metric stops moving)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def study(args):
    """Run the learning curves of ``args.schemes`` (the parsed options of :func:`.claims.parse_args`; see
    the module docstring) and write the report; returns the exit status.

    Raises:
        ToolError: ``--curve-every`` out of range.
    """
    if not 0 < args.curve_every <= args.updates:
        raise ToolError(f"--curve-every {args.curve_every} must be between 1 and --updates {args.updates}")
    if args.report_only:  # its report scores every checkpoint of a curve: that is the run, not a report of one
        raise ToolError("--report-only does not apply to --learning-curve: run the same command without it "
                        "(finished cells are not trained again, scored checkpoints not scored again)")
    t0 = time.time()
    data = grid.start(args, log)
    schemes = [s for s in ORDER if s in args.schemes]
    if args.dry_run:
        for scheme in schemes:
            ns, depth = cell_args(args, args.conditions[0], args.seeds[0], scheme)
            ns.save_every = args.curve_every
            print(f"{scheme} learning curve, {args.updates} updates, a checkpoint every {args.curve_every}: "
                  f"{cell.folder(args.out, cell.settings(ns, scheme, depth, data))}")
        return 0
    log(f"{len(schemes)} learning curve(s): {','.join(schemes)}, {args.updates} updates, a checkpoint every "
        f"{args.curve_every}, {args.jobs} job(s)")
    curves = grid.run(lambda s: run_scheme(args, data, s), schemes, args.jobs)
    text = write_report(args, curves, DEFAULT_UPDATES, time.time() - t0)
    print("\n" + text)
    log(f"wrote {os.path.join(args.out, 'learning_curve.md')}, learning_curve.json and learning_curve.png "
        f"({(time.time() - t0) / 60:.1f} min)")
    return 0


def main(args):
    """:func:`study` with the user's errors and Ctrl-C handled (:func:`.grid.main`)."""
    return grid.main(lambda: study(args), log)


__all__ = ["BLEU_TOL", "CHRF_TOL", "NLL_TOL", "checkpoints", "main", "plateau", "running_mean", "study",
           "valid_nll_by_update"]

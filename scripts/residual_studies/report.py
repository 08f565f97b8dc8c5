"""Reports of the tools: scheme order, labels and colours (from the scheme registry, the same in every
table and figure), number formats, Markdown tables, and the figures."""
import math

from fairseq_residual.schemes import SCHEME_NAMES, colors, labels

#: every registered scheme, in the order of the paper's tables
ORDER = SCHEME_NAMES
#: ``{scheme: label}`` and ``{scheme: matplotlib colour}``: the one palette of every figure
LABELS = labels()
COLORS = colors()
#: colours for rows that are not schemes (ablations), in the order they are handed out; those a scheme
#: has are skipped (:func:`unused_colors`)
EXTRA_COLORS = ("tab:pink", "tab:gray", "gold", "navy", "teal", "magenta", "lime", "sienna", "black",
                "tab:olive", "tab:cyan", "tab:purple", "tab:orange", "tab:brown", "crimson", "darkkhaki",
                "deepskyblue", "indigo", "yellowgreen", "rosybrown")


def unused_colors(n):
    """``n`` colours that no registered scheme has, from :data:`EXTRA_COLORS`, so that a plot with every
    scheme and extra rows never gives two rows one colour.

    Raises:
        ValueError: fewer than ``n`` colours are left.
    """
    free = [c for c in EXTRA_COLORS if c not in set(COLORS.values())]
    if len(free) < n:
        raise ValueError(f"{n} extra rows but only {len(free)} colours that no scheme has: add to EXTRA_COLORS")
    return free[:n]


def fmt(value, digits=2):
    """``value`` with ``digits`` decimals, ``-`` for None."""
    return "-" if value is None else f"{value:.{digits}f}"


def fmtg(value):
    """3 significant digits (ratios that span 1e-5 .. 1), ``-`` for None."""
    return "-" if value is None else f"{value:.3g}"


def scoring_text(results) -> str:
    """How the cells' BLEU and chrF were scored, from their settings and scores: "sacreBLEU of beam-4 translations
    of the first 500 test sentences (detokenized, raw references); BLEU signature `...`; chrF signature `...`".
    Every distinct beam, sentence count and signature is named (cells scored another way show as a second
    value); a sentence without scored cells says so."""
    scored = [r for r in results if r.get("scores")]
    if not scored:
        return "No cell has been scored yet."

    def each(values, fmt_one):
        found = sorted({v for v in values if v is not None}, key=str)
        return " / ".join(fmt_one(v) for v in found) if found else "not recorded"

    beams = each((r.get("settings", {}).get("beam") for r in scored), str)
    sentences = each((r.get("settings", {}).get("bleu_sentences") for r in scored), str)
    bleu = each((r["scores"].get("bleu_signature") for r in scored), lambda v: f"`{v}`")
    chrf = each((r["scores"].get("chrf_signature") for r in scored), lambda v: f"`{v}`")
    return (f"sacreBLEU of beam-{beams} translations of the first {sentences} test sentences (detokenized, raw "
            f"references); BLEU signature {bleu}; chrF signature {chrf}.")


def markdown_table(header, rows, align=None):
    """A Markdown table: ``header`` (cells), ``rows`` (lists of cells), ``align`` one of ``l``/``r``
    per column (default: first left, the others right)."""
    align = align or ["l"] + ["r"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _pyplot():
    import logging

    # matplotlib logs its set-up and font search at DEBUG, from its import on
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_loss_curves(curves, path, title):
    """Train and valid loss against updates, one colour per scheme (``curves``: ``{scheme:
    logs.loss_curves(...)}``)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for scheme, c in curves.items():
        label, color = LABELS[scheme], COLORS[scheme]
        if c["train"]:
            ax.plot(*zip(*c["train"]), color=color, lw=1.2, label=f"{label} train")
        if c["valid"]:
            u = [v[0] for v in c["valid"]]
            ax.plot(u, [v[1] for v in c["valid"]], color=color, ls="--", marker="o", ms=3,
                    label=f"{label} valid")
    valid = [v[1] for c in curves.values() for v in c["valid"] if math.isfinite(v[1])]
    if valid:  # the first train losses (~log2 of the vocabulary) would squash the curves' ends
        ax.set_ylim(top=max(valid) + 1.0)
    ax.set_xlabel("updates")
    ax.set_ylabel("label-smoothed cross-entropy (bits / target token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(ncol=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_against_depth(schemes, depths, by, path, panels, suptitle):
    """One panel per ``(title, get)`` of ``panels``: ``get(result)`` against depth, one line per scheme;
    a run without a number (diverged, failed) is an x in a band below the data.

    Args:
        by: ``{(scheme, depth): result}`` with ``result["status"]``.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2))
    for ax, (title, get) in zip(axes, panels):
        bad_y = []
        for s_name in schemes:
            xs, ys, bad = [], [], []
            for d in depths:
                r = by.get((s_name, d))
                if r is None:
                    continue
                v = get(r)
                if r["status"] == "ok" and v is not None and math.isfinite(v):
                    xs.append(d)
                    ys.append(v)
                else:
                    bad.append(d)
            ax.plot(xs, ys, marker="o", color=COLORS[s_name], label=LABELS[s_name])
            bad_y.append((s_name, bad))
        if any(bad for _, bad in bad_y):  # a band below the data for the runs without a number
            lo, hi = ax.get_ylim()
            span = (hi - lo) or 1.0
            ax.set_ylim(lo - 0.35 * span, hi)
            ax.axhline(lo - 0.05 * span, color="gray", linewidth=0.8, linestyle=":")
            for k, (s_name, bad) in enumerate(bad_y):
                if bad:
                    y = lo - (0.12 + 0.08 * k) * span
                    ax.scatter(bad, [y] * len(bad), marker="x", s=80, color=COLORS[s_name],
                               label=f"{LABELS[s_name]} diverged/failed")
        ax.set_xscale("log", base=2)
        ax.set_xticks(depths)
        ax.set_xticklabels([str(d) for d in depths])
        ax.set_xlabel("layers per stack (encoder = decoder)")
        ax.set_ylabel(title)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)

"""The figures of ``fairseq-residual-analyze``: one PNG per quantity, every model overlaid."""
import logging
import math
import os

from ..config import FP16_MAX
from .common import POST_LN, PRE_LN, RESI_DUAL, SCHEME_COLORS, STACKS, SUBLAYER_NAMES

# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------


def _nan(values):
    """None -> NaN, for plotting."""
    return [math.nan if v is None else v for v in values]


#: Post-LN is drawn wider, under the others: at initialisation ResiDual's encoder x_a stream is the
#: Post-LN computation itself (same seed, same weights), and the two curves coincide.
SCHEME_STYLES = {
    POST_LN: {"marker": "o", "markersize": 5, "linewidth": 2.6, "zorder": 2},
    PRE_LN: {"marker": "s", "markersize": 3, "linewidth": 1.5, "zorder": 3},
    RESI_DUAL: {"marker": "^", "markersize": 3, "linewidth": 1.3, "zorder": 4},
}


def _style(i, run):
    scheme = run["scheme"]
    color = SCHEME_COLORS.get(scheme) if run.get("_unique_scheme", True) else None
    style = {"color": color or f"C{i}", "marker": "o", "markersize": 3, "linewidth": 1.5}
    style.update(SCHEME_STYLES.get(scheme, {}))
    return style


def _legend(ax, inside_up_to=8):
    """The axes' legend, inside it for up to ``inside_up_to`` lines; more (``--residual-scheme all`` draws one
    per registered scheme) would hide the curves and the panels beside, so the figure gets one legend on its
    right instead (:func:`_figure_legend`, drawn when it is saved)."""
    if len(ax.get_legend_handles_labels()[0]) <= inside_up_to:
        ax.legend(fontsize=8)
    elif not hasattr(ax.figure, "_legend_from"):
        ax.figure._legend_from = ax


def _figure_legend(fig):
    """One legend beside ``fig`` of the lines of the axes :func:`_legend` chose, in columns of at most 20, each
    line named by its model (a label's parenthesised detail, e.g. one panel's gradient ratio, left out)."""
    ax = getattr(fig, "_legend_from", None)
    if ax is None:
        return
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, [label.split(" (")[0] for label in labels], loc="center left", bbox_to_anchor=(1.0, 0.5),
               fontsize=7, ncol=-(-len(handles) // 20))


def write_plots(runs, out_dir, meta, dpi=90):
    """One PNG per quantity, every run overlaid; returns the written paths.

    Args:
        runs: the ``models`` entries of the report (``analyze_model`` results plus ``label``).
        out_dir: existing output directory.
        meta: the report's top-level entries (``loss_name``, ``subset``, ``batches``,
            ``target_tokens``, ``dropout``), shown in the titles.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search logs at DEBUG

    counts = {}
    for run in runs:
        counts[run["scheme"]] = counts.get(run["scheme"], 0) + 1
    for run in runs:
        run["_unique_scheme"] = counts[run["scheme"]] == 1
    what = (f"{meta['loss_name']}, {meta['subset']} subset: {meta['batches']} batch(es), "
            f"{meta['target_tokens']} target tokens; dropout {meta['dropout']}")
    paths = []

    def save(fig, name):
        path = os.path.join(out_dir, name)
        fig.tight_layout()
        _figure_legend(fig)
        fig.savefig(path, dpi=dpi, bbox_inches="tight")  # the legend beside the figure is kept whole
        plt.close(fig)
        paths.append(path)

    def layers_axis(ax, n, title, ylabel, log=False):
        ax.set_title(title)
        ax.set_xlabel("layer (1 = lowest, next to the embedding)")
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        if n <= 24:
            ax.set_xticks(range(1, n + 1, 1 if n <= 12 else 2))

    # 1. per-layer parameter gradient norms
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, s in zip(axes, STACKS):
        n = 0
        for i, run in enumerate(runs):
            values = run["param_grad_norm"][s]
            n = max(n, len(values))
            ratio = run["grad_norm_low_top"][s]
            label = run["label"] + (f" (layer 1 / top = {ratio:.3g})" if ratio is not None else "")
            ax.plot(range(1, len(values) + 1), values, label=label, **_style(i, run))
        layers_axis(ax, n, f"{s}", "||grad of layer parameters|| (log)", log=True)
        _legend(ax)
    fig.suptitle(f"Gradient norm of each layer's parameters\n({what})", fontsize=10)
    save(fig, "grad_norm_layers.png")

    # 2. sub-layer output gradient norms
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    panels = [("encoder", "self_attn"), ("encoder", "ffn"), None,
              ("decoder", "self_attn"), ("decoder", "cross_attn"), ("decoder", "ffn")]
    handles = labels = None
    for ax, panel in zip(axes.flat, panels):
        if panel is None:
            legend_ax = ax
            continue
        s, sub = panel
        n = 0
        for i, run in enumerate(runs):
            values = run["sublayer_output_grad_norm"][s][sub]
            n = max(n, len(values))
            ax.plot(range(1, len(values) + 1), values, label=run["label"], **_style(i, run))
        layers_axis(ax, n, f"{s} {SUBLAYER_NAMES[sub]}", "||grad of sub-layer output h|| (log)",
                    log=True)
        handles, labels = ax.get_legend_handles_labels()
    legend_ax.axis("off")
    if handles:
        many = len(handles) > 12  # --residual-scheme all: two columns of small print fit the empty panel
        legend_ax.legend(handles, labels, loc="center", title="model", fontsize=6.5 if many else None,
                         ncol=2 if many else 1)
    fig.suptitle("Gradient norm at each sub-layer's output h (the branch added to the residual "
                 f"stream), all positions\n({what})", fontsize=10)
    save(fig, "grad_norm_sublayers.png")

    # 3. consecutive-layer cosine similarity
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, s in zip(axes, STACKS):
        n = 0
        for i, run in enumerate(runs):
            values = _nan(run["cosine_consecutive"][s])
            n = max(n, len(values) + 1)
            name = run["label"] + (" x_a stream" if run["scheme"] == RESI_DUAL else "")
            ax.plot(range(1, len(values) + 1), values, label=name, **_style(i, run))
            dual = run.get("cosine_consecutive_dual")
            if dual:
                style = _style(i, run)
                style.update(linestyle="--", marker="s")
                ax.plot(range(1, len(dual[s]) + 1), _nan(dual[s]), label=run["label"] + " dual stream x_d",
                        **style)
        ax.set_title(s)
        ax.set_xlabel("layer l (pair: output of layer l vs layer l+1)")
        ax.set_ylabel("mean cos(y_l, y_l+1) over tokens")
        ax.set_ylim(top=1.02)
        ax.grid(True, alpha=0.3)
        _legend(ax)
    fig.suptitle("Cosine similarity of consecutive layer outputs (1 = the layer changed nothing: "
                 f"representation collapse)\n({what})", fontsize=10)
    save(fig, "cosine_similarity.png")

    # 4. ResiDual dual-stream range
    dual_runs = [(i, r) for i, r in enumerate(runs) if r.get("dual_stream")]
    if dual_runs:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, s in zip(axes, STACKS):
            n = 0
            for i, run in dual_runs:
                d = run["dual_stream"][s]
                n = max(n, len(d["max_abs"]))
                safe = d["safe_scale"]
                label = (f"{run['label']} (c = {d['scale']:g}; "
                         f"safe c = {safe:g})" if safe is not None else f"{run['label']} (c = {d['scale']:g})")
                ax.plot(range(1, len(d["max_abs"]) + 1), d["max_abs"], label=label, **_style(i, run))
            safety = dual_runs[0][1]["dual_stream"][s]["fp16_safety"]
            ax.axhline(FP16_MAX, color="black", linestyle="-", linewidth=1, label="fp16 max 65504")
            ax.axhline(safety * FP16_MAX, color="gray", linestyle=":", linewidth=1,
                       label=f"safety limit {safety:g} x 65504")
            layers_axis(ax, n, s, "max |x_d| after the layer (log)", log=True)
            _legend(ax)
        fig.suptitle(f"ResiDual dual stream x_d: largest magnitude per layer vs the fp16 range\n({what})",
                     fontsize=10)
        save(fig, "dual_stream_range.png")
    # 5. multi-stream schemes: how alike the streams are, how far their mixing is from the identity
    stream_runs = [(i, r) for i, r in enumerate(runs) if r.get("stream_cosine")]
    if stream_runs:
        # the mixing row only where a run has a mixing (hyper-connections, mHC): two-stream schemes have none
        mixing = any(r.get("mixing_distance") for _, r in stream_runs)
        fig, axes = plt.subplots(2 if mixing else 1, 2, figsize=(11, 7.5 if mixing else 4.2), squeeze=False)
        for col, s in enumerate(STACKS):
            n = 0
            for i, run in stream_runs:
                values = _nan(run["stream_cosine"][s])
                n = max(n, len(values))
                axes[0, col].plot(range(1, len(values) + 1), values, label=run["label"], **_style(i, run))
                if run.get("mixing_distance"):
                    dist = _nan(run["mixing_distance"][s])
                    axes[1, col].plot(range(1, len(dist) + 1), dist, label=run["label"], **_style(i, run))
            layers_axis(axes[0, col], n, s, "mean cos between streams (1: collapsed)")
            if mixing:
                layers_axis(axes[1, col], n, s, "||M - I||_F / sqrt(n), M the layer's mixing")
            for ax in axes[:, col]:
                if ax.get_legend_handles_labels()[0]:
                    _legend(ax)
        fig.suptitle("Residual streams: their mean pairwise cosine after each layer (streams collapsing into one\n"
                     "approach 1)" + (" and the distance of each layer's effective stream mixing from the identity"
                                      if mixing else "") + f"\n({what})", fontsize=10)
        save(fig, "streams.png")
    for run in runs:
        run.pop("_unique_scheme", None)
    return paths

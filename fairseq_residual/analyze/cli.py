"""The command line of ``fairseq-residual-analyze``: options, the run over every requested model,
``analysis.json``, the summary table."""
import argparse
import contextlib
import json
import logging
import os
import sys
import warnings

import torch

from ..config import FP16_MAX
from ..schemes import SCHEME_NAMES as SCHEMES
from ..user_errors import closest, long_options
from .common import ALL, DEFAULT_ARCH, PKG_DIR, PROG, SCHEME_NAMES, AnalyzeError, logger
from .loading import build_criterion, build_fresh_model, check_data, fairseq_model_argv, load_batches, load_checkpoint_model
from .measure import analyze_model
from .plots import write_plots

# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Per-layer gradient norms, consecutive-layer cosine similarity, the residual streams of "
        "multi-stream schemes and ResiDual's dual-stream range, for a residual_transformer of any registered "
        "scheme, on a checkpoint or a fresh model, written as JSON and PNG plots. Other fairseq model options "
        "(e.g. --activation-fn gelu) are passed to fairseq for fresh models.",
        epilog="Definitions and the --resi-dual-scale rule: python -c 'import fairseq_residual."
        "analyze as a; help(a)', or docs/analysis.md.",
    )
    p.add_argument("data", nargs="?", help="binarized data directory (fairseq-preprocess --destdir)")
    p.add_argument("--subset", default="valid", help="subset to draw batches from (default: valid)")
    p.add_argument("-s", "--source-lang", help="source language (default: inferred from DATA)")
    p.add_argument("-t", "--target-lang", help="target language (default: inferred from DATA)")
    g = p.add_argument_group("model (a checkpoint, or a fresh model)")
    g.add_argument("--checkpoint", nargs="+", metavar="PATH",
                   help="checkpoint(s) written by fairseq-train; several are overlaid in the plots")
    g.add_argument("--arch", help=f"fresh model: --arch preset (default: {DEFAULT_ARCH})")
    g.add_argument("--residual-scheme", choices=SCHEMES + (ALL,),
                   help="fresh model: the scheme, or 'all' for every registered scheme overlaid (default: all, or the "
                   "preset's _<scheme> suffix); with --checkpoint: the expected scheme (checked)")
    g.add_argument("--layers", type=int, metavar="N", help="fresh model: layers per stack")
    g.add_argument("--embed-dim", type=int, help="fresh model: embedding / model width")
    g.add_argument("--ffn-dim", type=int, help="fresh model: FFN inner width")
    g.add_argument("--heads", type=int, help="fresh model: attention heads")
    g.add_argument("--seed", type=int, default=1, help="initialisation and batch-order seed (default 1)")
    g = p.add_argument_group("measurement")
    g.add_argument("--batches", type=int, default=1, metavar="K",
                   help="number of batches (default 1); gradients are of their summed loss")
    g.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch (default 4096)")
    g.add_argument("--batch-size", "--max-sentences", type=int, dest="max_sentences",
                   help="sentences per batch (default: no limit)")
    g.add_argument("--loss", choices=("label_smoothed_cross_entropy", "cross_entropy"),
                   default="label_smoothed_cross_entropy", help="criterion (default: label-smoothed CE)")
    g.add_argument("--label-smoothing", type=float, default=0.1, help="for the label-smoothed loss")
    g.add_argument("--keep-dropout", action="store_true",
                   help="keep the model's dropout (default: all dropout and LayerDrop set to 0)")
    g.add_argument("--fp16-safety", type=float, default=0.1, metavar="F",
                   help="ResiDual: fraction of the fp16 range (65504) the dual stream may use when "
                   "recommending --resi-dual-scale (default 0.1)")
    g.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    g = p.add_argument_group("output")
    g.add_argument("--output-dir", default="analysis", help="where analysis.json and the PNGs go")
    g.add_argument("--no-plots", action="store_true", help="write the JSON only")
    g.add_argument("--verbose", action="store_true", help="show fairseq's log messages")
    return p


def _check_args(args, extra, own_options=()):
    for option in extra:  # a typo of this tool's own option, before anything else is said about it
        close = closest(option.split("=")[0], own_options, cutoff=0.8)
        if option.startswith("--") and close:
            raise AnalyzeError(f"unknown option {option.split('=')[0]} (did you mean {close}?)")
    if args.batches < 1:
        raise AnalyzeError(f"--batches must be >= 1, got {args.batches}")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise AnalyzeError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if not 0 < args.fp16_safety <= 1:
        raise AnalyzeError(f"--fp16-safety must be in (0, 1], got {args.fp16_safety}: the fraction of 65504 a sum may "
                           f"reach (default 0.1)")
    fresh_only = [f"--{k.replace('_', '-')}" for k in ("arch", "layers", "embed_dim", "ffn_dim", "heads")
                  if getattr(args, k) is not None]
    if args.checkpoint:
        if fresh_only or extra:
            raise AnalyzeError(
                f"{' '.join(fresh_only + list(extra))}: these describe a fresh model, but --checkpoint "
                f"was given (a checkpoint's architecture is read from it): drop them, or drop --checkpoint"
            )
    elif args.layers is not None and args.layers < 1:
        raise AnalyzeError(f"--layers must be >= 1, got {args.layers}")


def _fresh_schemes(args):
    if args.residual_scheme is not None:
        return list(SCHEMES) if args.residual_scheme == ALL else [args.residual_scheme]
    arch = args.arch or DEFAULT_ARCH
    for scheme in SCHEMES:
        if arch.endswith("_" + scheme):
            return [scheme]
    return list(SCHEMES)


def run(args, extra=(), argv=None):
    """Analyse every requested model; write ``analysis.json`` and the plots; return the report."""
    from fairseq import utils

    _check_args(args, extra, long_options(build_parser()))
    src, tgt = check_data(args.data, args.subset, args.source_lang, args.target_lang)
    try:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as exc:
        raise AnalyzeError(f"--device {args.device}: not a torch device ({exc}): use cpu, cuda or cuda:N")
    if device.type not in ("cpu", "cuda"):
        raise AnalyzeError(f"--device {args.device}: this tool runs on cpu or cuda only: use --device cpu, cuda or "
                           f"cuda:N, or leave --device out")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise AnalyzeError(f"--device {args.device}: this torch has no CUDA device (torch.cuda.is_available() is "
                           f"False): use --device cpu, or leave --device out")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise AnalyzeError(f"--device {args.device}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                           f"cuda:0 to cuda:{torch.cuda.device_count() - 1}: use one of them")
    # a checkpoint's task reads its own direction from DATA (either file naming): only languages the user typed
    # can ask for another
    typed_langs = (src, tgt) if args.source_lang or args.target_lang else None
    models = []  # (source, path or scheme); built one at a time to keep memory low
    if args.checkpoint:
        for path in args.checkpoint:
            if not os.path.isfile(path):
                load_checkpoint_model(path, args.data, args.residual_scheme, typed_langs)  # raises the message
        _check_schemes(args.checkpoint, args.residual_scheme)
        for path in args.checkpoint:
            models.append(("checkpoint", path))
    else:
        for scheme in _fresh_schemes(args):
            models.append(("init", scheme))

    runs = []
    for source, what in models:
        if source == "checkpoint":
            model, task, scheme = load_checkpoint_model(what, args.data, args.residual_scheme, typed_langs)
            info = {"source": "checkpoint", "checkpoint": what}
        else:
            arch = args.arch or DEFAULT_ARCH
            fs_argv = fairseq_model_argv(args.data, arch, what, args.layers, args.embed_dim,
                                         args.ffn_dim, args.heads, args.seed, src, tgt, extra)
            model, task = build_fresh_model(fs_argv, seed=args.seed)
            scheme = what
            shown = [("fairseq_residual" if a == PKG_DIR else a) for a in fs_argv[1:]]  # no local paths
            info = {"source": "init", "arch": arch, "seed": args.seed, "fairseq_args": shown}
        model.to(device)
        batches = load_batches(task, model, args.subset, args.batches, args.max_tokens,
                               args.max_sentences, args.seed)
        if len(batches) < args.batches:
            logger.warning(f"subset '{args.subset}' gives only {len(batches)} batch(es) of "
                           f"--max-tokens {args.max_tokens}; using them all")
        if device.type != "cpu":
            batches = [utils.move_to_cuda(b, device) for b in batches]
        criterion = build_criterion(task, args.loss, args.label_smoothing)
        result = analyze_model(model, criterion, batches, args.keep_dropout, args.fp16_safety)
        label = SCHEME_NAMES[scheme]
        if source == "checkpoint":  # by its run folder and file (the report's "checkpoint" keeps the path)
            label += f": {os.path.basename(os.path.dirname(os.path.abspath(what)))}/{os.path.basename(what)}"
        info.update(source_lang=task.cfg.source_lang, target_lang=task.cfg.target_lang)  # the direction measured
        runs.append({"label": label, **info, **result})
        del model, batches

    first = runs[0]
    meta = {
        "tool": PROG,
        "command": [PROG] + list(sys.argv[1:] if argv is None else argv),
        "data": args.data,
        "subset": args.subset,
        # the direction measured: the models' (each run records its own), DATA's when they differ
        **(dict(source_lang=runs[0]["source_lang"], target_lang=runs[0]["target_lang"])
           if len({(r["source_lang"], r["target_lang"]) for r in runs}) == 1 else
           dict(source_lang=src, target_lang=tgt)),
        "batches": first["batches"],
        "max_tokens": args.max_tokens,
        "sentences": first["sentences"],
        "target_tokens": first["target_tokens"],
        "loss_name": args.loss if args.loss == "cross_entropy" else
        f"label_smoothed_cross_entropy (eps {args.label_smoothing:g})",
        "dropout": "kept" if args.keep_dropout else "off",
        "device": str(device),
        "fp16_max": FP16_MAX,
        "fp16_safety": args.fp16_safety,
        "definitions": {
            "param_grad_norm": "L2 norm of d(loss)/d(layer parameters); loss = criterion summed over "
            "the batches / their target tokens; layer 1 = lowest",
            "grad_norm_low_top": "param_grad_norm of layer 1 / that of the top layer",
            "sublayer_output_grad_norm": "L2 norm of d(loss)/d(h) over all positions, h = output of "
            "self_attn / encoder_attn / fc2",
            "cosine_consecutive": "entry l-1: mean over non-pad tokens of cos(output of layer l, "
            "output of layer l+1); ResiDual: the x_a stream",
            "cosine_consecutive_dual": "ResiDual: the same for the dual stream x_d",
            "cosine_consecutive_streams": "the same for every extra stream the scheme names (x_d, y, h1..hn)",
            "stream_cosine": "multi-stream schemes: entry l-1, mean over non-pad tokens of the mean pairwise cos "
            "between the streams after layer l (one stream dominating: stream collapse, arXiv 2606.03483)",
            "mixing_distance": "hyper-connections, mHC: entry l-1, ||M - I||_F / sqrt(n), M the product of layer "
            "l's sub-layers' width mixings (h' = M h, mean over non-pad tokens)",
            "dual_stream.safe_scale": "largest 1-2-5 value c <= 1 with c * max|x_d at c=1| <= "
            "fp16_safety * 65504",
            "running_sums": "the largest |value| over the forward passes of every LayerNorm input and every tensor "
            "the residual objects return (padding included), its site, and fp16_headroom = 65504 / it "
            "(below 1 / fp16_safety: too close to fp16's range, train in bf16 or fp32; below 1: it overflows fp16)",
        },
    }
    os.makedirs(args.output_dir, exist_ok=True)
    report = {**meta, "models": runs}
    plots = [] if args.no_plots else write_plots(runs, args.output_dir, meta)
    report["plots"] = [os.path.basename(p) for p in plots]
    path = os.path.join(args.output_dir, "analysis.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(summary_table(runs, args.fp16_safety))
    print(f"wrote {path}" + (f" and {len(plots)} plots ({', '.join(report['plots'])})" if plots else ""))
    return report


def _check_schemes(paths, expected):
    """Before any is measured: several checkpoints of which some were not trained with ``--residual-scheme
    expected`` (one checkpoint: :func:`.loading.load_checkpoint_model` says it). Files the safe loader cannot read
    are left to that function's messages.

    Raises:
        AnalyzeError: naming each checkpoint of another scheme, and the fix for several schemes.
    """
    from ..checkpoint_safety import read_checkpoint_structure
    from .loading import checkpoint_scheme

    if expected in (None, ALL) or len(paths) < 2:
        return
    trained = {}
    for path in paths:
        try:
            trained[path] = checkpoint_scheme(read_checkpoint_structure(path))
        except Exception:  # noqa: BLE001 - unreadable here: load_checkpoint_model names what it is
            continue
    other = {path: scheme for path, scheme in trained.items() if scheme != expected}
    if other:
        schemes = set(trained.values())
        fix = (f"drop --residual-scheme (each checkpoint's scheme is read from it)" +
               (f" or pass --residual-scheme {schemes.pop()}" if len(schemes) == 1 else ""))
        raise AnalyzeError(f"--residual-scheme {expected} was given, but " + ", ".join(
            f"{path} was trained with {scheme}" for path, scheme in other.items()) + f": {fix}")


def summary_table(runs, fp16_safety=0.1):
    """A plain-text table of the headline numbers of each run; a line under it says what ``-`` in a gradient
    ratio means where one is, and one names the runs whose largest running sum has less fp16 headroom than
    ``1 / fp16_safety``."""
    rows = [("model", "layers", "enc grad L1/top", "dec grad L1/top", "enc cos top", "dec cos top",
             "max|x_d| enc/dec", "safe c enc/dec", "max running sum (fp16 headroom)")]
    for run in runs:
        cos = run["cosine_consecutive"]
        dual = run.get("dual_stream")
        fmt = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
        rows.append((
            run["label"],
            f"{run['encoder_layers']}+{run['decoder_layers']}",
            fmt(run["grad_norm_low_top"]["encoder"]),
            fmt(run["grad_norm_low_top"]["decoder"]),
            fmt(cos["encoder"][-1] if cos["encoder"] else None),  # None: no pair measured
            fmt(cos["decoder"][-1] if cos["decoder"] else None),
            "-" if not dual else f"{dual['encoder']['max_abs_peak']:.3g}/{dual['decoder']['max_abs_peak']:.3g}",
            "-" if not dual else f"{fmt(dual['encoder']['safe_scale'])}/{fmt(dual['decoder']['safe_scale'])}",
            _running_sum_cell(run.get("running_sums")),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)
    if any(v is None for run in runs for v in run["grad_norm_low_top"].values()):
        table += ("\n(grad L1/top '-': the top layer's gradient norm is 0, so there is no ratio; e.g. ReZero at "
                  "initialisation, whose alpha = 0 leaves its layers' weights without gradient)")
    close = [run["label"] for run in runs
             if run.get("running_sums") and run["running_sums"]["fp16_headroom"] < 1 / fp16_safety]
    if close:
        table += (f"\n(fp16: the largest running sum of {', '.join(close)} is above {fp16_safety:g} x 65504 "
                  "('!': above 65504, an overflow); train it in bf16 or fp32, see docs/precision.md)")
    return table


def _running_sum_cell(top):
    """``max (headroom)`` of a run's ``running_sums``, with ``!`` where the headroom is below 1 (an fp16
    overflow); ``-`` where nothing was recorded."""
    if not top:
        return "-"
    return f"{top['peak']:.3g} ({top['fp16_headroom']:.3g}{'!' if top['fp16_headroom'] < 1 else ''})"


#: loggers whose INFO chatter the tool hides unless --verbose
QUIET_LOGGERS = ("fairseq", "matplotlib", "PIL")


@contextlib.contextmanager
def _tool_logging(verbose):
    """The tool's logging while it runs: a stderr handler on the root logger when it has none, fairseq's,
    matplotlib's and PIL's INFO hidden and two harmless torch warnings ignored unless ``verbose``. Every
    level, handler and warning filter is restored on leaving, so that a caller calling :func:`main`
    in-process keeps its own logging."""
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), {n: logging.getLogger(n).level for n in QUIET_LOGGERS})
    with warnings.catch_warnings():
        try:
            logging.basicConfig(
                level=logging.INFO if verbose else logging.WARNING,
                format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                stream=sys.stderr,
            )
            if not verbose:
                for name in QUIET_LOGGERS:
                    logging.getLogger(name).setLevel(logging.WARNING)
                # harmless torch warnings that fairseq's code triggers on every batch
                warnings.filterwarnings("ignore", message=".*pin_memory.*")
                warnings.filterwarnings("ignore", message=".*mismatched key_padding_mask and attn_mask.*")
            yield
        finally:
            root.setLevel(saved[0])
            for handler in root.handlers[:]:
                if handler not in saved[1]:
                    root.removeHandler(handler)
            for name, level in saved[2].items():
                logging.getLogger(name).setLevel(level)


def main(argv=None):
    """Entry point; returns the exit code (0 ok, 2 bad input). The logging it sets up lasts while it
    runs (:func:`_tool_logging`)."""
    from ..cli_help import one_line_error

    parser = build_parser()
    one_line_error(parser)  # a wrong choice on one line with the closest one, as in fairseq's tools
    args, extra = parser.parse_known_args(argv)
    if args.data is None:  # optional for argparse only so that this can say where it went
        last = (args.checkpoint or [None])[-1]
        parser.error(f"no data directory: --checkpoint takes several paths and took {last}, a folder, as one; put "
                     f"the data directory first ({PROG} {last} --checkpoint ...)" if last and os.path.isdir(last)
                     else "the following arguments are required: data")
    extra = [a for a in extra if a != "--"]  # "--" may separate the fairseq options
    with _tool_logging(args.verbose):
        try:
            run(args, extra, argv)
        except AnalyzeError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
    return 0


def cli_main():
    sys.exit(main())


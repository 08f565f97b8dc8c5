"""Depth-scaling study: Post-LN vs Pre-LN vs ResiDual at several depths, same update budget, CPU.

Entry point: ``scripts/depth_study.sh`` (run with ``--help`` for the options). For every residual
scheme and every depth L (layers per stack, default 6, 12, 24, 48) it trains a narrow
``residual_transformer`` (default width 64, FFN 128, 4 heads) on the shipped Ding German->English
corpus for the same number of updates with the same recipe, then records

* the valid loss and nll loss (fairseq's end-of-training validation on the whole valid split,
  bits per target token),
* sacreBLEU (and chrF) of ``fairseq-generate`` translations of the first ``--bleu-sentences`` test
  sentences, detokenized with the sentencepiece model and scored against the raw references,
* the per-layer gradient-norm ratio (encoder layer 1 / top layer, ``--task
  translation_with_grad_norms``) at the last logged update, and the wall time.

A run that breaks is reported, not dropped: ``diverged`` when fairseq stops on NaN/Inf gradients
(``FloatingPointError``), a loss-scale or other "exceeded" fatal error, or ends with a NaN valid loss
or a valid nll loss above the uniform guess log2(|V|) (the loss exploded); ``failed`` for any other
error (its message is kept).

Output (default ``runs/depth_study/``)::

    data/                       sentencepiece model + binarized corpus (scripts/demo.py's
                                data preparation, reused) and data/bleu-test-N/ (BLEU subset)
    cells/<scheme>-L<depth>-w<width>-<hash>/
                                train-u<updates>.log (one per training segment), checkpoint_last.pt,
                                train_state.json, budgets/u<updates>/ (result.json, checkpoint.pt,
                                generate-test.txt)
    results.md, results.json, quality_vs_depth.png

The hash covers every setting but the number of updates. Finished cells (the budget's
``result.json`` present) are skipped, so an interrupted study resumes where it stopped, ``--depths`` /
``--schemes`` can be extended later without redoing anything, and a larger ``--updates`` continues
every cell from its last checkpoint instead of training it again (:func:`run_cell`).
``--report-only`` rebuilds the tables and the plot.
Errors meant for the user are printed as ``ERROR: ...`` with exit status 2.
"""

import argparse
import concurrent.futures
import datetime
import hashlib
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time

from . import PLUGIN_DIR, REPO, demo, divergence
from .commands import generate_command
from .commands import train_command as fairseq_train_command
from .files import read_json, write_json
from .logs import number as _num
from .logs import read_generate, read_train_log
from .report import LABELS, ORDER, fmt, fmtg, plot_against_depth
from .runner import ToolError, loadavg, logger, run_logged, tool

USER_DIR = PLUGIN_DIR
DEFAULT_DATA = os.path.join(REPO, "data", "ding-de-en")
DEFAULT_OUT = os.path.join(REPO, "runs", "depth_study")
SCHEMES = ORDER
SRC, TGT = "de", "en"


#: a cell's training saves its checkpoint every this many updates by default (``--checkpoint-every``; not
#: a setting of the cell: it changes no number), so that a killed study loses at most that many updates of
#: each running cell
CHECKPOINT_EVERY = 250

StudyError = ToolError
log = logger("depth-study")


# ------------------------------------------------------------------------------------------------
# data


def prepare(args, demo):
    """Binarized corpus (demo's preparation) and a binarized BLEU subset of the test split."""
    try:
        digests, counts = demo.check_corpus(args.data)
        ns = argparse.Namespace(out=args.out, subset=0, data=args.data, overwrite=False)
        paths = demo.prepare_data(ns, {"vocab_size": args.vocab_size}, digests, counts)
    except demo.DemoError as exc:
        raise StudyError(str(exc))
    n = min(args.bleu_sentences, counts["test"])
    bleu_dir = os.path.join(paths["dir"], f"bleu-test-{n}")
    stamp = os.path.join(bleu_dir, "done.json")
    settings = {"data": paths["fingerprint"], "sentences": n}
    if read_json(stamp) != settings:
        os.makedirs(bleu_dir, exist_ok=True)
        for lang in (SRC, TGT):
            with open(os.path.join(paths["dir"], "spm", f"test.{lang}"), encoding="utf-8") as f:
                lines = f.read().split("\n")[:n]
            with open(os.path.join(bleu_dir, f"test.{lang}"), "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
        with open(os.path.join(paths["dir"], "raw", f"test.{TGT}"), encoding="utf-8") as f:
            refs = f.read().split("\n")[:n]
        with open(os.path.join(bleu_dir, f"ref.{TGT}"), "w", encoding="utf-8") as f:
            f.write("\n".join(refs) + "\n")
        cmd = [tool("fairseq-preprocess"), "--source-lang", SRC, "--target-lang", TGT,
               "--testpref", os.path.join(bleu_dir, "test"), "--destdir", os.path.join(bleu_dir, "bin"),
               "--joined-dictionary", "--srcdict", os.path.join(paths["dir"], "dict.txt"), "--workers", "1"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise StudyError(f"fairseq-preprocess of the BLEU subset failed:\n{proc.stderr[-2000:]}")
        write_json(stamp, settings)
    with open(os.path.join(paths["dir"], "dict.txt"), encoding="utf-8") as f:
        vocab = sum(1 for _ in f) + 4  # fairseq adds <s>, <pad>, </s>, <unk>
    return dict(paths, bleu_bin=os.path.join(bleu_dir, "bin"), bleu_ref=os.path.join(bleu_dir, f"ref.{TGT}"),
                bleu_sentences=n, vocab=vocab)


# ------------------------------------------------------------------------------------------------
# one cell: train, classify, translate, score


def cell_settings(args, scheme, depth, data):
    """The settings of one cell (their hash names its folder). ``args.save_every`` (when set and
    non-zero) adds a checkpoint every that many updates, for learning curves (:mod:`.learning_curve`)."""
    s = dict(scheme=scheme, depth=depth, width=args.width, ffn_dim=args.ffn_dim or 2 * args.width,
             heads=args.heads, updates=args.updates, lr=args.lr, warmup=args.warmup,
             max_tokens=args.max_tokens, dropout=args.dropout, clip_norm=args.clip_norm,
             seed=args.seed, data=data["fingerprint"], beam=args.beam,
             bleu_sentences=data["bleu_sentences"], extra_train_args=args.extra_train_args)
    if getattr(args, "save_every", 0):
        s["save_every"] = args.save_every
    return s


def cell_dir(args, settings):
    """The folder of one cell: scheme, depth and width in its name, then a hash of every setting except
    the number of updates, so that a longer budget continues the same cell instead of starting again."""
    key = {k: v for k, v in settings.items() if k != "updates"}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    name = f"{settings['scheme']}-L{settings['depth']}-w{settings['width']}-{digest}"
    return os.path.join(args.out, "cells", name)


def budget_dir(run_dir, updates):
    """Where a cell keeps what it measured after ``updates`` updates: ``result.json``, the checkpoint of
    that budget (``checkpoint.pt``), its translations and diagnostics."""
    return os.path.join(run_dir, "budgets", f"u{updates}")


def result_path(args, settings):
    """The ``result.json`` of a cell at its budget (``settings["updates"]``)."""
    return os.path.join(budget_dir(cell_dir(args, settings), settings["updates"]), "result.json")


def train_command(args, s, data_bin, run_dir):
    settings = dict(layers=s["depth"], embed_dim=s["width"], ffn_dim=s["ffn_dim"], heads=s["heads"],
                    dropout=s["dropout"], attention_dropout=0, activation_dropout=0, clip_norm=s["clip_norm"],
                    lr=s["lr"], warmup_updates=s["warmup"], weight_decay=0.0001, label_smoothing=0.1,
                    max_tokens=s["max_tokens"], max_update=s["updates"], seed=s["seed"],
                    log_interval=args.log_interval)
    return fairseq_train_command(
        tool("fairseq-train"), data_bin, run_dir, s["scheme"], settings, args.user_dir, SRC, TGT,
        task="translation_with_grad_norms", task_args=("--log-grad-norm-interval", str(args.log_interval)),
        device_args=getattr(args, "device_args", ("--cpu",)),
        # checkpoints with the optimizer's state (so that a larger budget continues the run) every
        # --checkpoint-every updates, only the newest kept (a killed run resumes from it and loses at most
        # that many updates), and at the end; with save_every one every that many updates, all kept.
        # fairseq validates at every mid-epoch save (the valid nll of the log's learning curve); the
        # epoch-based intervals are out of reach. Saving and validating do not change the run: fairseq
        # seeds every update with seed + update number, and the task fixes the batches (tasks.py).
        save_args=("--save-interval", "100000", "--validate-interval", "100000")
        + (("--save-interval-updates", str(s["save_every"]), "--keep-interval-updates", "-1")
           if s.get("save_every") else
           ("--save-interval-updates", str(getattr(args, "checkpoint_every", CHECKPOINT_EVERY)),
            "--keep-interval-updates", "1")),
        extra=shlex.split(s["extra_train_args"]))


def parse_log(path):
    """fairseq's ``--log-format json`` lines: lists of dicts for train_inner, train and valid."""
    log = read_train_log(path)
    return {kind: log[kind] for kind in ("train_inner", "train", "valid")}


def classify(rc, log_text, stats, vocab):
    """``(status, reason)``: ok / diverged / failed, by the project's rule (:mod:`.divergence`)."""
    return divergence.classify(rc, log_text, stats.get("valid_nll_loss"), vocab)


def translate_and_score(args, demo, data, s, run_dir, checkpoint=None, out_dir=None):
    """Translate the BLEU subset with ``checkpoint`` (default the cell's ``checkpoint_last.pt``), writing
    into ``out_dir`` (default the cell's folder), and score it: sacreBLEU and chrF of the detokenized
    hypotheses against the raw references. Returns the scores (``bleu`` None when generation failed)."""
    ckpt = checkpoint or os.path.join(run_dir, "checkpoint_last.pt")
    out_dir = out_dir or run_dir
    os.makedirs(out_dir, exist_ok=True)
    cmd = generate_command(tool("fairseq-generate"), data["bleu_bin"], ckpt, out_dir, args.user_dir, SRC, TGT,
                           beam=s["beam"], device_args=getattr(args, "device_args", ("--cpu",)))
    t0 = time.time()
    rc, cpu = run_logged(cmd, os.path.join(out_dir, "generate.log"), args.threads)
    if rc != 0:
        return {"bleu": None, "bleu_error": f"fairseq-generate exit status {rc} (see generate.log)"}
    hyps = read_generate(os.path.join(out_dir, "generate-test.txt"))["hyps"]
    n = data["bleu_sentences"]
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=data["spm_model"])
    hyp_path = os.path.join(out_dir, f"hyp.test.{TGT}")
    with open(hyp_path, "w", encoding="utf-8") as f:
        f.write("".join(sp.decode(hyps.get(i, "").split()) + "\n" for i in range(n)))
    scores = demo.score(hyp_path, data["bleu_ref"])
    scores["translate_s"] = round(time.time() - t0, 1)
    scores["translate_cpu_s"] = cpu
    scores["translated"] = len(hyps)
    return scores


def run_cell(args, demo, data, scheme, depth, label=None):
    """Train, classify, translate and score one cell at its budget of ``args.updates`` updates; ``label``
    names it in progress lines (default ``<scheme> L=<depth>``). Returns the result dict (also in the
    budget's ``result.json``).

    A cell is trained once: a later call with a larger budget continues it from its last checkpoint
    (fairseq restores the model, Adam's moments, the learning-rate schedule and the position in the
    epoch, and seeds every update with seed + update number, so the continued run is the run that would
    have gone on), a call with a budget it already reached returns that budget's result. A cell that
    diverged or failed is not trained further: larger budgets report the same outcome.

    Raises:
        StudyError: the cell was trained past ``args.updates`` without measuring that budget.
    """
    s = cell_settings(args, scheme, depth, data)
    updates = s["updates"]
    name = label or f"{scheme} L={depth}"
    run_dir = cell_dir(args, s)
    bdir = budget_dir(run_dir, updates)
    result_file = os.path.join(bdir, "result.json")
    done = read_json(result_file)
    if done is not None:
        log(f"{name}: finished earlier ({done['status']}), skipped")
        return done
    os.makedirs(bdir, exist_ok=True)
    write_json(os.path.join(run_dir, "settings.json"), {k: v for k, v in s.items() if k != "updates"})
    state_file = os.path.join(run_dir, "train_state.json")
    state = read_json(state_file)
    ckpt = os.path.join(bdir, "checkpoint.pt")
    if state is not None and state["updates"] > updates and state["status"] == "ok":
        raise StudyError(f"{name}: this cell ({rel_cell(run_dir)}) was trained to {state['updates']} updates "
                         f"already, past the {updates} asked for, and its state at {updates} updates was not "
                         f"kept; ask for --updates {state['updates']} or more, or use another --out")
    if state is None or (state["status"] == "ok" and state["updates"] < updates):
        state = train_segment(args, s, data, run_dir, state, name)
        write_json(state_file, state)
        if state["status"] == "ok":
            atomic_copy(os.path.join(run_dir, "checkpoint_last.pt"), ckpt)
    result = dict({k: v for k, v in state.items() if k != "segments"}, settings=s,
                  cell=os.path.basename(run_dir), budget=updates)
    if state["status"] != "ok" and state["updates"] < updates:
        result["reason"] = f"{state['reason']} (before {state['updates']} updates; not trained further)"
    result["scores"] = None
    last = os.path.join(run_dir, "checkpoint_last.pt")
    use = ckpt if os.path.exists(ckpt) else (last if state["status"] == "diverged" and os.path.exists(last) else None)
    if use is not None:
        result["scores"] = translate_and_score(args, demo, data, s, run_dir, checkpoint=use, out_dir=bdir)
        log(f"{name}: BLEU {result['scores'].get('bleu')} "
            f"({result['scores'].get('translate_s', 0):.0f} s to translate)")
    write_json(result_file, result)
    return result


def rel_cell(run_dir):
    return os.path.join(os.path.basename(os.path.dirname(run_dir)), os.path.basename(run_dir))


def atomic_copy(src, dst):
    """Copy ``src`` to ``dst`` through a temporary file in ``dst``'s folder (a kill leaves no half file)."""
    tmp = f"{dst}.tmp{os.getpid()}"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def train_segment(args, s, data, run_dir, state, name):
    """Train a cell from where ``state`` left it (None: from scratch) to ``s["updates"]``; the segment's log
    is ``train-u<updates>.log``. Returns the new state: status, reason, the last validation's statistics,
    wall and CPU seconds summed over the segments, and one entry per segment (its command)."""
    updates = s["updates"]
    start = state["updates"] if state else 0
    log(f"{name}: training {'from scratch' if not start else f'on from {start} updates'} to {updates} updates "
        f"(load average {loadavg()})")
    t0 = time.time()
    cmd = train_command(args, s, data["bin"], run_dir)
    log_path = os.path.join(run_dir, f"train-u{updates}.log")
    rc, cpu = run_logged(cmd, log_path, args.threads, append=True)  # a resumed segment keeps the killed part
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    parsed = parse_log(log_path)
    valid = parsed["valid"][-1] if parsed["valid"] else {}
    inner = parsed["train_inner"]
    last_gn = next((r for r in reversed(inner) if "gnorm_enc_low_top" in r), {})
    prev = (state or {}).get("stats", {})
    stats = {
        "valid_loss": _num(valid.get("valid_loss")),
        "valid_nll_loss": _num(valid.get("valid_nll_loss")),
        "valid_ppl": _num(valid.get("valid_ppl")),
        "updates_done": int(_num(inner[-1].get("num_updates")) or 0) if inner else prev.get("updates_done", 0),
        "first_train_loss": prev.get("first_train_loss") if start else (_num(inner[0].get("loss")) if inner else None),
        "last_train_loss": _num(inner[-1].get("loss")) if inner else None,
        "last_gnorm": _num(inner[-1].get("gnorm")) if inner else None,
        "grad_norm_low_top_enc": _num(last_gn.get("gnorm_enc_low_top")),
        "grad_norm_low_top_dec": _num(last_gn.get("gnorm_dec_low_top")),
    }
    status, reason = classify(rc, text, stats, data["vocab"])
    train_s = round(time.time() - t0, 1)
    command = " ".join(shlex.quote(c) for c in cmd)
    segments = list((state or {}).get("segments", [])) + [
        dict(start=start, updates=updates, status=status, train_s=train_s, train_cpu_s=cpu, command=command,
             log=os.path.basename(log_path))]
    log(f"{name}: {status}{' (' + reason + ')' if reason else ''}, valid nll {stats['valid_nll_loss']}, "
        f"{train_s:.0f} s")
    return dict(status=status, reason=reason, exit_status=rc, stats=stats, updates=updates if status == "ok" else start,
                train_s=round(sum(g["train_s"] for g in segments), 1),
                train_cpu_s=round(sum(g["train_cpu_s"] or 0 for g in segments), 1), load_end=loadavg(),
                command=command, segments=segments)


# ------------------------------------------------------------------------------------------------
# report


def write_report(args, data, results, wall_s):
    by = {(r["settings"]["scheme"], r["settings"]["depth"]): r for r in results}
    schemes = [s for s in args.schemes if any(k[0] == s for k in by)]
    depths = sorted({k[1] for k in by})
    any_s = results[0]["settings"]
    sig = next((r["scores"].get("bleu_signature") for r in results if r.get("scores")
                and r["scores"].get("bleu_signature")), None)

    def cell_text(r):
        if r is None:
            return "not run"
        bleu = r["scores"].get("bleu") if r.get("scores") else None
        nll = r["stats"].get("valid_nll_loss")
        if r["status"] == "ok":
            return f"{fmt(bleu)} / {fmt(nll)}"
        return f"**{r['status']}**" + (f" ({fmt(bleu)} / {fmt(nll)})" if bleu is not None else "")

    head = "| layers per stack | " + " | ".join(LABELS[s] for s in schemes) + " |\n"
    head += "|---:|" + "---|" * len(schemes) + "\n"
    pivot = head + "".join(
        f"| {d} | " + " | ".join(cell_text(by.get((s, d))) for s in schemes) + " |\n" for d in depths)

    detail = ("| scheme | layers | status | valid loss | valid nll | BLEU | chrF | enc grad L1/top | "
              "dec grad L1/top | train s (CPU s) | translate s (CPU s) | note |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
    for d in depths:
        for s in schemes:
            r = by.get((s, d))
            if r is None:
                continue
            st, sc = r["stats"], r.get("scores") or {}
            detail += (f"| {LABELS[s]} | {d} | {r['status']} | {fmt(st.get('valid_loss'))} | "
                       f"{fmt(st.get('valid_nll_loss'))} | {fmt(sc.get('bleu'))} | {fmt(sc.get('chrf'))} | "
                       f"{fmtg(st.get('grad_norm_low_top_enc'))} | {fmtg(st.get('grad_norm_low_top_dec'))} | "
                       f"{r['train_s']:.0f} ({fmt(r.get('train_cpu_s'), 0)}) | "
                       f"{fmt(sc.get('translate_s'), 0)} ({fmt(sc.get('translate_cpu_s'), 0)}) | "
                       f"{(r['reason'] or '').replace('|', '/')} |\n")
    command = "scripts/depth_study.sh " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    cell_wall = sum(r.get("train_s") or 0 for r in results)
    cpus = [r.get("train_cpu_s") for r in results]
    cell_cpu = None if None in cpus else sum(cpus)  # cells of older versions did not record it
    text = (
        "# Depth-scaling study: Post-LN vs Pre-LN vs ResiDual\n\n"
        f"Command: `{command}`  \n"
        f"Date: {datetime.datetime.now():%Y-%m-%d %H:%M}; {os.cpu_count()} CPU cores, {args.jobs} job(s) "
        f"of {args.threads or 'default'} thread(s); load average at the end {loadavg()}; this "
        f"invocation {wall_s / 60:.1f} min; the cells' training took {cell_wall / 60:.1f} min wall"
        + (f", {cell_cpu / 60:.1f} CPU-min" if cell_cpu is not None else "")
        + " (translation not included).\n\n"
        f"Setup: Ding de->en corpus (13k training pairs), joint sentencepiece vocabulary "
        f"{args.vocab_size}; residual_transformer L+L layers, width {any_s['width']}, FFN "
        f"{any_s['ffn_dim']}, {any_s['heads']} heads, dropout {any_s['dropout']}, shared embeddings; Adam "
        f"(0.9, 0.98), lr {any_s['lr']} (inverse_sqrt, {any_s['warmup']} warm-up updates from 1e-7), "
        f"clip-norm {any_s['clip_norm']}, weight decay 1e-4, label smoothing 0.1, max_tokens "
        f"{any_s['max_tokens']}, **{any_s['updates']} updates for every cell**, seed {any_s['seed']}, "
        f"CPU, fp32.\n\n"
        f"BLEU: sacreBLEU of beam-{any_s['beam']} translations of the first {data['bleu_sentences']} "
        f"test sentences (detokenized, raw references); signature `{sig}`. Valid loss / nll: fairseq's "
        f"validation on all 1000 valid pairs after the last update, bits per target token. Grad "
        f"L1/top: gradient norm of layer 1's parameters / the top layer's at the last logged update "
        f"(`--task translation_with_grad_norms`). Times: wall-clock seconds on a possibly shared "
        f"machine, and the CPU seconds the process used (user + system; comparable across loads).\n\n"
        f"A cell is **diverged** (the project's one rule, fairseq_residual/tools/divergence.py) when "
        f"training stopped on a NaN/inf loss, NaN/Inf gradients, the fp16 minimum loss scale or a fatal "
        f"'exceeded' error, or ended with a NaN valid loss or a valid nll above log2(|V|) = "
        f"{math.log2(data['vocab']):.2f} bits (worse than a uniform guess); **failed** for other errors.\n\n"
        f"## BLEU / valid nll loss by depth\n\n{pivot}\n"
        f"## All numbers\n\n{detail}\n"
        f"Plot: `quality_vs_depth.png`\n")
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    write_json(os.path.join(args.out, "results.json"), dict(
        command=command, date=datetime.datetime.now().isoformat(timespec="seconds"),
        wall_s=round(wall_s, 1), vocab=data["vocab"], bleu_sentences=data["bleu_sentences"],
        bleu_signature=sig, cells=results))
    plot(schemes, depths, by, os.path.join(args.out, "quality_vs_depth.png"), any_s)
    return pivot


def plot(schemes, depths, by, path, s):
    panels = [("BLEU (sacreBLEU, test subset)", lambda r: (r.get("scores") or {}).get("bleu")),
              ("valid nll loss (bits / token)", lambda r: r["stats"].get("valid_nll_loss"))]
    plot_against_depth(schemes, depths, by, path, panels,
                       f"Quality against depth: width {s['width']}, FFN {s['ffn_dim']}, {s['updates']} updates "
                       f"of {s['max_tokens']} tokens, lr {s['lr']}, warm-up {s['warmup']}\n"
                       "(x below the dotted line: the run diverged or failed, see results.md)")


# ------------------------------------------------------------------------------------------------


def int_list(text):
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def scheme_list(text):
    """Comma-separated scheme names, or ``all`` for every registered scheme."""
    if text.strip() == "all":
        return list(SCHEMES)
    values = [v for v in text.replace(" ", "").split(",") if v]
    bad = [v for v in values if v not in SCHEMES]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"unknown scheme(s) {bad}: choose from {', '.join(SCHEMES)}")
    return values


def add_cell_arguments(p, out, updates=300, max_tokens=4096, warmup=60, bleu_sentences=300, lr=1e-3,
                       schemes=None, schemes_help=None):
    """The options of one cell (model, recipe, data, scoring, parallelism), shared with the claims study
    (:mod:`.claims`); the keyword arguments are the caller's defaults (``schemes`` None: every registered
    scheme)."""
    p.add_argument("--schemes", type=scheme_list, default=list(schemes or SCHEMES),
                   help=schemes_help or "comma-separated residual schemes, or all (default: every registered "
                                        f"one, {','.join(SCHEMES)})")
    p.add_argument("--updates", type=int, default=updates, help="updates per cell (default %(default)s)")
    p.add_argument("--width", type=int, default=64, help="model width (default 64)")
    p.add_argument("--ffn-dim", type=int, default=None, help="FFN width (default: 2 x width)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--lr", type=float, default=lr, help="peak learning rate (default %(default)s)")
    p.add_argument("--warmup", type=int, default=warmup,
                   help="inverse_sqrt warm-up updates (default %(default)s)")
    p.add_argument("--clip-norm", type=float, default=0.0, help="gradient clipping (default 0: off)")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout (default 0.1)")
    p.add_argument("--max-tokens", type=int, default=max_tokens, help="tokens per batch (default %(default)s)")
    p.add_argument("--vocab-size", type=int, default=4000, help="sentencepiece vocabulary (default 4000)")
    p.add_argument("--bleu-sentences", type=int, default=bleu_sentences,
                   help="translate the first N test sentences for BLEU (default %(default)s)")
    p.add_argument("--beam", type=int, default=4, help="beam size for BLEU (default 4)")
    p.add_argument("--log-interval", type=int, default=25,
                   help="fairseq log and per-layer grad-norm interval, updates (default 25)")
    p.add_argument("--checkpoint-every", type=int, default=CHECKPOINT_EVERY,
                   help="save each cell's checkpoint (and validate) every N updates, so that a killed study "
                        "resumes losing at most N updates per running cell (default %(default)s; changes no "
                        "number: the cell is the same)")
    p.add_argument("--jobs", type=int, default=2,
                   help="cells trained at the same time (default 2: one per core of a 2-core machine)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads per fairseq process (OMP_NUM_THREADS; default 1; 0: torch's "
                        "choice). Narrow models gain little from a second thread and lose much when "
                        "the cores are shared")
    p.add_argument("--data", default=DEFAULT_DATA, help="corpus folder (default: data/ding-de-en)")
    p.add_argument("--out", default=out, help="output folder (default: %(default)s)")
    p.add_argument("--user-dir", default=USER_DIR, help="the fairseq_residual plugin folder")
    p.add_argument("--extra-train-args", default="", help="more fairseq-train options (one string)")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: rebuild the report and the plot from finished cells")
    p.add_argument("--dry-run", action="store_true", help="print the cells and their commands only")


def start_study(args):
    """Check the cell options, create ``--out`` (made absolute) and prepare the data: the start shared by
    the depth study and the claims study. Returns :func:`prepare`'s data dict.

    Raises:
        StudyError: an option out of range, naming it.
    """
    if args.updates < 1 or args.jobs < 1 or args.bleu_sentences < 1 or args.checkpoint_every < 1:
        raise StudyError("--updates, --jobs, --bleu-sentences and --checkpoint-every must be >= 1")
    if args.width % args.heads:
        raise StudyError(f"--width {args.width} is not divisible by --heads {args.heads}")
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    return prepare(args, demo)


def build_parser():
    p = argparse.ArgumentParser(
        prog="depth_study.sh", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train residual_transformer models of every registered scheme at several depths "
                    "for the same number of updates on the Ding de->en corpus (CPU); report valid loss, "
                    "sacreBLEU and divergence as a Markdown table, JSON and a plot. Finished cells are "
                    "skipped when run again.",
        epilog="Default grid: every registered scheme x 4 depths x 300 updates (measured with three schemes: "
               "12 cells, about 115 CPU-minutes, about 1 hour on 2 idle cores with the default --jobs 2 "
               "--threads 1; the cost grows with the number of schemes). Larger grid, e.g.: depth_study.sh "
               "--depths 6,12,24,48,96 --updates 2000 --warmup 400 --width 128 --jobs 8 on a bigger machine")
    p.add_argument("--depths", type=int_list, default=[6, 12, 24, 48],
                   help="layers per stack, comma-separated (default: 6,12,24,48)")
    p.add_argument("--seed", type=int, default=1)
    add_cell_arguments(p, out=DEFAULT_OUT)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        t0 = time.time()
        data = start_study(args)
        cells = [(s, d) for d in args.depths for s in args.schemes]
        if args.dry_run:
            for s, d in cells:
                st = cell_settings(args, s, d, data)
                print(f"{cell_dir(args, st)}\n  " + " ".join(
                    shlex.quote(c) for c in train_command(args, st, data["bin"], cell_dir(args, st))))
            return 0
        if args.report_only:
            results = [read_json(result_path(args, cell_settings(args, s, d, data))) for s, d in cells]
            results = [r for r in results if r]
            if not results:
                raise StudyError(f"no finished cell with these settings under {args.out}/cells")
        else:
            log(f"{len(cells)} cells: schemes {','.join(args.schemes)} x depths "
                f"{','.join(map(str, args.depths))}, {args.updates} updates each, {args.jobs} job(s)")
            # deepest first: the longest cells start early, which packs parallel jobs better
            order = sorted(cells, key=lambda c: -c[1])
            with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
                futures = {pool.submit(run_cell, args, demo, data, s, d): (s, d) for s, d in order}
                done = {futures[f]: f.result() for f in concurrent.futures.as_completed(futures)}
            results = [done[c] for c in cells]
        pivot = write_report(args, data, results, time.time() - t0)
        print("\n" + pivot)
        log(f"wrote {os.path.join(args.out, 'results.md')}, results.json and quality_vs_depth.png "
            f"({(time.time() - t0) / 60:.1f} min)")
    except StudyError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("\nInterrupted; run the same command again to resume (finished cells are kept).",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

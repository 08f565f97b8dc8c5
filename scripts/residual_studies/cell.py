"""One study cell: a ``residual_transformer`` trained with one recipe for a budget of updates, classified by
the divergence rule, translated and scored, and grown to larger budgets.

A cell is a mapping of settings (:func:`settings`: scheme, depth, width, FFN width, heads, updates, lr,
warm-up, max tokens, dropout, clip-norm, seed, the data's fingerprint, beam, BLEU sentences and extra
fairseq-train options). Its folder (:func:`folder`) is ``<out>/cells/<scheme>-L<depth>-w<width>-<hash>``,
the hash covering every setting but the number of updates, so that a larger budget continues the same
cell. Inside it::

    train-u<updates>.log      fairseq-train's output, one file per training segment (a resumed segment
                              keeps the killed part)
    checkpoint_last.pt, ...   fairseq's checkpoints (the optimizer's state with them)
    train_state.json          status, reason, last validation, updates reached, time, one entry per segment
    settings.json             the settings but the updates
    budgets/u<updates>/       result.json (written last), checkpoint.pt, generate-test.txt, hyp.test.en,
                              and analysis/ (:func:`analyze`)

:func:`run` is the whole life of a cell at one budget: a budget already measured returns its result; a
larger one continues the run from ``checkpoint_last.pt`` (fairseq restores the model, Adam's moments, the
learning-rate schedule and the position in the epoch, and seeds every update with seed + update number, so
the continued run is the run that would have gone on); a smaller one than the cell was trained to is
refused, since its state was not kept. A cell continues when it is ok, or when the divergence rule flagged
it only for its valid nll above the uniform guess at the end of a segment that fairseq finished (exit status
0, a finite valid nll: its checkpoint is finite), which a short first budget can do to a run that is
learning; a run that stopped on NaN/Inf or crashed is not trained further. Every result says which budget
it was asked for (``budget``) and how many updates the cell has (``reached``).

The study's options set the cells' settings; :func:`check_extra_args` refuses extra fairseq-train options
that would set them again (the cell would be filed, hashed and reported as one scheme, depth, seed or recipe
and trained as another).
"""
import math
import os
import shlex
import shutil
import time

from . import divergence
from .commands import generate_command
from .commands import train_command as fairseq_train_command
from .data import SRC, TGT, decode, score
from .files import fingerprint, read_json, write_json
from .logs import number, read_generate, read_train_log
from .runner import ToolError, loadavg, logger, run_logged, tool

#: a cell's training saves its checkpoint every this many updates by default (``--checkpoint-every``; not
#: a setting of the cell: it changes no number), so that a killed study loses at most that many updates of
#: each running cell
CHECKPOINT_EVERY = 250

log = logger("cell")

#: the fairseq-train options the cell's command sets, and the cell setting each one decides (None: the
#: cell's bookkeeping, not a setting); ``--extra-train-args`` may not set them (:func:`check_extra_args`)
CELL_OPTIONS = {
    "--residual-scheme": "scheme", "--arch": "scheme",
    "--encoder-layers": "depth", "--decoder-layers": "depth",
    "--encoder-layers-to-keep": "depth", "--decoder-layers-to-keep": "depth",
    "--encoder-embed-dim": "width", "--decoder-embed-dim": "width",
    "--encoder-ffn-embed-dim": "ffn_dim", "--decoder-ffn-embed-dim": "ffn_dim",
    "--encoder-attention-heads": "heads", "--decoder-attention-heads": "heads",
    "--seed": "seed", "--lr": "lr",
    "--warmup-updates": "warmup", "--lr-scheduler": "warmup", "--warmup-init-lr": "warmup",
    "--max-tokens": "max_tokens", "--batch-size": "max_tokens", "--update-freq": "max_tokens",
    "--max-update": "updates", "--max-epoch": "updates",
    "--dropout": "dropout", "--clip-norm": "clip_norm",
    "--save-dir": "out", "--user-dir": "user_dir", "--cpu": "device",
    "--task": None, "--source-lang": None, "--target-lang": None, "--restore-file": None,
    "--log-format": None, "--log-interval": "log_interval",
}


def check_extra_args(extra, study_options):
    """Refuse extra fairseq-train options that set what the study sets for every cell.

    Args:
        extra: the ``--extra-train-args`` string.
        study_options: ``{cell setting: the study's option that sets it}`` (a setting without one is fixed
            by the study).

    Raises:
        ToolError: naming the first such option and the study's option to use instead.
    """
    for token in shlex.split(extra or ""):
        option = token.split("=", 1)[0].replace("_", "-") if token.startswith("--") else None
        if option not in CELL_OPTIONS:
            continue
        setting = CELL_OPTIONS[option]
        instead = study_options.get(setting)
        what = (f"use {instead} instead" if instead else
                "the study fixes it for every cell (its recipe is part of the cell's identity); it has no option "
                "to change it")
        raise ToolError(f"--extra-train-args sets {option}, which the study sets itself for every cell (the cell's "
                        f"folder, settings and report would name one value and fairseq would train with another): "
                        f"{what}")


def can_continue(state, run_dir):
    """Whether a cell in ``state`` can be trained on: it is ok, or it diverged only by its valid nll above the
    uniform guess at the end of a segment fairseq finished (exit status 0, finite valid nll) and
    ``checkpoint_last.pt`` is there."""
    if state["status"] == "ok":
        return True
    nll = state.get("stats", {}).get("valid_nll_loss")
    return (state["status"] == "diverged" and state.get("exit_status") == 0 and nll is not None
            and math.isfinite(nll) and os.path.exists(os.path.join(run_dir, "checkpoint_last.pt")))


def reached(state):
    """The updates a cell has: the segment's end when fairseq finished it, else the last logged update."""
    if state.get("exit_status") == 0 and state.get("segments"):
        return state["segments"][-1]["updates"]
    return max(state.get("stats", {}).get("updates_done") or 0, state["updates"])


def shortfall(results):
    """The results whose cell has fewer updates than the budget they report (``reached`` < ``budget``)."""
    return [r for r in results if r.get("reached", r.get("budget")) is not None
            and r.get("budget") is not None and r.get("reached", r["budget"]) < r["budget"]]


def settings(args, scheme, depth, data):
    """The settings of one cell (their hash names its folder), from the study's options ``args``.
    ``args.save_every`` (when set and non-zero) adds a checkpoint every that many updates, all kept, for
    learning curves."""
    s = dict(scheme=scheme, depth=depth, width=args.width, ffn_dim=args.ffn_dim or 2 * args.width,
             heads=args.heads, updates=args.updates, lr=args.lr, warmup=args.warmup,
             max_tokens=args.max_tokens, dropout=args.dropout, clip_norm=args.clip_norm,
             seed=args.seed, data=data["fingerprint"], beam=args.beam,
             bleu_sentences=data["bleu_sentences"], extra_train_args=args.extra_train_args)
    if getattr(args, "save_every", 0):
        s["save_every"] = args.save_every
    return s


def folder(out, s):
    """The folder of the cell with settings ``s`` under the study folder ``out``: scheme, depth and width in
    its name, then a hash of every setting except the number of updates."""
    key = {k: v for k, v in s.items() if k != "updates"}
    digest = fingerprint(key, length=8)
    return os.path.join(out, "cells", f"{s['scheme']}-L{s['depth']}-w{s['width']}-{digest}")


def budget_dir(run_dir, updates):
    """Where a cell keeps what it measured after ``updates`` updates: ``result.json``, the checkpoint of
    that budget (``checkpoint.pt``), its translations and diagnostics."""
    return os.path.join(run_dir, "budgets", f"u{updates}")


def result_path(out, s):
    """The ``result.json`` of a cell at its budget (``s["updates"]``)."""
    return os.path.join(budget_dir(folder(out, s), s["updates"]), "result.json")


def budgets(run_dir):
    """The budgets (update counts) at which the cell in ``run_dir`` has a result, as a set."""
    found = set()
    root = os.path.join(run_dir, "budgets")
    for name in os.listdir(root) if os.path.isdir(root) else ():
        if name.startswith("u") and name[1:].isdigit() and os.path.exists(os.path.join(root, name, "result.json")):
            found.add(int(name[1:]))
    return found


def train_command(args, s, data_bin, run_dir):
    """The cell's ``fairseq-train`` command (:func:`.commands.train_command` with the cell's recipe)."""
    recipe = dict(layers=s["depth"], embed_dim=s["width"], ffn_dim=s["ffn_dim"], heads=s["heads"],
                  dropout=s["dropout"], attention_dropout=0, activation_dropout=0, clip_norm=s["clip_norm"],
                  lr=s["lr"], warmup_updates=s["warmup"], weight_decay=0.0001, label_smoothing=0.1,
                  max_tokens=s["max_tokens"], max_update=s["updates"], seed=s["seed"],
                  log_interval=args.log_interval)
    return fairseq_train_command(
        tool("fairseq-train"), data_bin, run_dir, s["scheme"], recipe, args.user_dir, SRC, TGT,
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
    records = read_train_log(path)
    return {kind: records[kind] for kind in ("train_inner", "train", "valid")}


def classify(rc, log_text, stats, vocab):
    """``(status, reason)``: ok / diverged / failed, by the project's rule (:mod:`.divergence`)."""
    return divergence.classify(rc, log_text, stats.get("valid_nll_loss"), vocab,
                               (stats.get("first_train_loss"), stats.get("last_train_loss")))


def train_segment(args, s, data, run_dir, state, name):
    """Train a cell from where ``state`` left it (None: from scratch) to ``s["updates"]``; the segment's log
    is ``train-u<updates>.log``. Returns the new state: status, reason, the last validation's statistics,
    wall and CPU seconds summed over the segments, and one entry per segment (its command)."""
    updates = s["updates"]
    start = state["updates"] if state else 0
    interrupted = os.path.exists(os.path.join(run_dir, "checkpoint_last.pt"))  # a segment a kill cut short
    begin = (f"on from {start} updates" if start else
             "on from the checkpoint of an interrupted run (fairseq resumes from checkpoint_last.pt)" if interrupted
             else "from scratch")
    log(f"{name}: training {begin} to {updates} updates "
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
        "valid_loss": number(valid.get("valid_loss")),
        "valid_nll_loss": number(valid.get("valid_nll_loss")),
        "valid_ppl": number(valid.get("valid_ppl")),
        # the last update any record names (a --log-interval above the updates logs no train_inner)
        "updates_done": max([int(number(r.get("num_updates")) or 0) for kind in ("train_inner", "train", "valid")
                             for r in parsed[kind]] or [prev.get("updates_done", 0)]),
        "first_train_loss": prev.get("first_train_loss") if start else (number(inner[0].get("loss")) if inner else None),
        "last_train_loss": number(inner[-1].get("loss")) if inner else None,
        "last_gnorm": number(inner[-1].get("gnorm")) if inner else None,
        "grad_norm_low_top_enc": number(last_gn.get("gnorm_enc_low_top")),
        "grad_norm_low_top_dec": number(last_gn.get("gnorm_dec_low_top")),
    }
    status, reason = classify(rc, text, stats, data["vocab"])
    train_s = round(time.time() - t0, 1)
    command = " ".join(shlex.quote(c) for c in cmd)
    segments = list((state or {}).get("segments", [])) + [
        dict(start=start, updates=updates, status=status, train_s=train_s, train_cpu_s=cpu, command=command,
             log=os.path.basename(log_path))]
    log(f"{name}: {status}{' (' + reason + ')' if reason else ''}, valid nll {stats['valid_nll_loss']}, "
        f"{train_s:.0f} s")
    # where the next segment starts: the end of this one when fairseq finished it (also when the rule then
    # flagged its loss), else where it started (fairseq's save of a crashed run is not trusted)
    return dict(status=status, reason=reason, exit_status=rc, stats=stats, updates=updates if rc == 0 else start,
                train_s=round(sum(g["train_s"] for g in segments), 1),
                train_cpu_s=round(sum(g["train_cpu_s"] or 0 for g in segments), 1), load_end=loadavg(),
                command=command, segments=segments)


def translate_and_score(args, data, s, run_dir, checkpoint=None, out_dir=None):
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
    hyp_path = os.path.join(out_dir, f"hyp.test.{TGT}")
    decode(data["spm_model"], [hyps.get(i, "") for i in range(data["bleu_sentences"])], hyp_path)
    scores = score(hyp_path, data["bleu_ref"])
    scores["translate_s"] = round(time.time() - t0, 1)
    scores["translate_cpu_s"] = cpu
    scores["translated"] = len(hyps)
    return scores


def run(args, data, scheme, depth, label=None):
    """Train, classify, translate and score one cell at its budget of ``args.updates`` updates; ``label``
    names it in progress lines (default ``<scheme> L=<depth>``). Returns the result dict (also in the
    budget's ``result.json``).

    A cell is trained once: a later call with a larger budget continues it from its last checkpoint, a
    call with a budget it already reached returns that budget's result. A cell that diverged by its loss
    alone continues (:func:`can_continue`); one that stopped on NaN/Inf or failed is not trained further:
    larger budgets report the same outcome, with the updates it has (``reached``).

    Raises:
        ToolError: the cell was trained past ``args.updates`` without measuring that budget.
    """
    s = settings(args, scheme, depth, data)
    updates = s["updates"]
    name = label or f"{scheme} L={depth}"
    run_dir = folder(args.out, s)
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
    if state is not None and reached(state) > updates and can_continue(state, run_dir):
        raise ToolError(f"{name}: this cell ({_short(run_dir)}) was trained to {reached(state)} updates "
                        f"already, past the {updates} asked for, and its state at {updates} updates was not "
                        f"kept; ask for --updates {reached(state)} or more, or use another --out")
    if state is not None and state["status"] != "ok" and reached(state) < updates and can_continue(state, run_dir):
        log(f"{name}: diverged by its loss alone at {reached(state)} updates ({state['reason']}); trained on")
        state = dict(state, updates=reached(state))  # states of earlier versions kept the segment's start
    if state is None or (can_continue(state, run_dir) and state["updates"] < updates):
        state = train_segment(args, s, data, run_dir, state, name)
        write_json(state_file, state)
        if state["status"] == "ok":
            _atomic_copy(os.path.join(run_dir, "checkpoint_last.pt"), ckpt)
    result = dict({k: v for k, v in state.items() if k != "segments"}, settings=s,
                  cell=os.path.basename(run_dir), budget=updates, reached=min(reached(state), updates))
    if state["status"] != "ok" and result["reached"] < updates:
        result["reason"] = f"{state['reason']} (at {result['reached']} updates; not trained further)"
    result["scores"] = None
    last = os.path.join(run_dir, "checkpoint_last.pt")
    use = ckpt if os.path.exists(ckpt) else (last if state["status"] == "diverged" and os.path.exists(last) else None)
    if use is not None:
        result["scores"] = translate_and_score(args, data, s, run_dir, checkpoint=use, out_dir=bdir)
        log(f"{name}: BLEU {result['scores'].get('bleu')} "
            f"({result['scores'].get('translate_s', 0):.0f} s to translate)")
    write_json(result_file, result)
    return result


def analyze(args, data, bdir):
    """``fairseq-residual-analyze`` on the checkpoint of a cell's budget (cached in ``analysis/`` of the
    budget's folder): the per-layer gradient ratio (layer 1 / top) and the cosine of the last two layer
    outputs, per stack; None without a checkpoint or when the tool fails."""
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


def _short(run_dir):
    return os.path.join(os.path.basename(os.path.dirname(run_dir)), os.path.basename(run_dir))


def _atomic_copy(src, dst):
    """Copy ``src`` to ``dst`` through a temporary file in ``dst``'s folder (a kill leaves no half file)."""
    tmp = f"{dst}.tmp{os.getpid()}"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


__all__ = ["CELL_OPTIONS", "CHECKPOINT_EVERY", "analyze", "budget_dir", "budgets", "can_continue",
           "check_extra_args", "classify", "folder", "parse_log", "reached", "shortfall",
           "result_path", "run", "settings", "train_command", "train_segment", "translate_and_score"]

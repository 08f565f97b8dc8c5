"""German->English demo on the shipped Ding corpus: Post-LN vs Pre-LN vs ResiDual, end to end.

Entry point: ``scripts/run_demo.sh`` (``make demo`` / ``make demo-long``); run with ``--help`` for the
options. Steps, each one reused when a previous run finished it with the same settings:

1. check the raw corpus (``data/ding-de-en/{train,valid,test}.{de,en}``): every file present,
   non-empty, UTF-8, no empty line, ``.de`` and ``.en`` of a split with the same number of lines;
2. learn one joint sentencepiece model on train (both sides), encode every split with it, turn its
   vocabulary into a fairseq dictionary and binarize with ``fairseq-preprocess --joined-dictionary``;
3. for each residual scheme, train a small ``residual_transformer`` with ``fairseq-train --user-dir
   fairseq_residual`` on CPU (same seed, same data order, same number of updates for every scheme),
   the schemes side by side with one CPU thread each; an interrupted run resumes from its
   ``checkpoint_last.pt``, a larger ``--max-update`` continues a finished one;
4. translate the test split with ``fairseq-generate --beam 5`` (``checkpoint_best.pt``, the lowest
   valid loss), decode the sentencepiece pieces and score the detokenized text against the raw
   references with sacreBLEU and chrF (sacrebleu's Python API; the signatures are printed);
5. write the results table (Markdown and JSON), a plot of train and valid loss against updates,
   five example translations, and check the printed ``fairseq-interactive`` command on a sentence.

Output folder layout (default ``demo_out/``, ``demo_out/long/`` with ``--long``)::

    data/raw/          the corpus as used (a prefix of each split with --subset)
    data/spm.model     joint sentencepiece model; data/spm/ encoded text; data/dict.txt
    data/bin/          fairseq-preprocess output (joined dictionary)
    runs/<scheme>/     checkpoint_{best,last}.pt, train.log (fairseq's JSON log lines),
                       generate-test.txt, hyp.test.en (detokenized), step stamps
    results.md, results.json, loss_curves.png, examples.md
    history.json       every run of the demo on this folder: time, load average, what it computed

Errors meant for the user are printed as ``ERROR: ...`` with exit status 2.
"""

import argparse
import datetime
import math
import os
import shlex
import signal
import subprocess
import sys
import time

from . import PLUGIN_DIR, RUNS
from .commands import GENERATION, generate_command
from .commands import interactive_command as fairseq_interactive_command
from .commands import train_command as fairseq_train_command
from .cell import check_extra_args
from .data import DEFAULT_CORPUS, MIN_VOCAB, SRC, TGT, check_corpus, corpus_label, decode, prepare, score
from .files import file_id, read_json, read_lines, write_json
from .logs import loss_curves as parse_train_log
from .logs import read_generate
from .demo_report import RunHistory, write_reports
from .report import LABELS as SCHEME_LABELS
from .report import ORDER as SCHEME_NAMES
from .report import plot_loss_curves as plot
from .options import at_least, fraction, name_list, nonnegative_int, positive_float, positive_int
from .runner import ToolError, loadavg, logger, parallel, rel, require_cuda, tool
from .runner import run as _run
from .steps import Step

#: the demo's output folder without --out (with --long: its long/)
DEFAULT_OUT = os.path.join(RUNS, "demo")

SCHEMES = ("post_ln", "pre_ln", "resi_dual")  # the demo's default; --schemes takes any registered scheme
N_EXAMPLES = 5
#: the demo's option behind each setting of a run (:func:`.cell.check_extra_args`; clip-norm is fixed at 0)
DEMO_OPTIONS = dict(scheme="--schemes", depth="--layers", width="--embed-dim", ffn_dim="--ffn-dim", heads="--heads",
                    seed="--seed", lr="--lr", warmup="--warmup-updates", max_tokens="--max-tokens",
                    updates="--max-update", dropout="--dropout", out="--out", user_dir="--user-dir", device="--gpu",
                    log_interval="--log-interval")
INTERACTIVE_SENTENCE = "Ich habe heute keine Zeit."

# Model / training presets. Every value can be overridden on the command line. The default preset
# was sized by measurement (docs/demo.md): a 2+2-layer, 128-wide model at 1 CPU thread costs about
# 0.21 CPU seconds per update of 1024 tokens, so 2000 updates per scheme, the three schemes trained
# side by side on 2 cores, train and evaluate all three in about 11 minutes on a 2-core CPU
# (10.8 min measured, whole run).
_MODEL = dict(vocab_size=4000, layers=2, embed_dim=128, ffn_dim=512, heads=4,
              dropout=0.1, attention_dropout=0.1, activation_dropout=0.1,
              max_tokens=1024, lr=3e-3, warmup_updates=300, weight_decay=1e-4, label_smoothing=0.1)
PRESETS = {
    "default": dict(_MODEL, max_update=2000, log_interval=50),
    "long": dict(_MODEL, max_update=8000, log_interval=100),  # 4x the default budget
    # For tests: a model of about 50k parameters on a vocabulary of a few hundred pieces.
    "tiny": dict(
        vocab_size=300, layers=2, embed_dim=32, ffn_dim=64, heads=2,
        dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
        max_tokens=1024, lr=1e-3, warmup_updates=10, weight_decay=0.0, label_smoothing=0.1,
        max_update=5, log_interval=1,
    ),
}


log = logger("demo")


def run(cmd, **kwargs):
    """:func:`runner.run` logging as the demo."""
    return _run(cmd, log=log, **kwargs)


# ------------------------------------------------------------------------------------------------
# 3. training


def device_args(args):
    return [] if args.gpu else ["--cpu"]


def train_command(args, cfg, scheme, data_bin, run_dir):
    settings = dict(cfg, seed=args.seed, clip_norm="0.0")
    return fairseq_train_command(tool("fairseq-train"), data_bin, run_dir, scheme, settings, args.user_dir,
                                 SRC, TGT, device_args=device_args(args), extra=args.extra_train_args)


def train(args, cfg, scheme, data, history):
    run_dir = os.path.join(args.out, "runs", scheme)
    model_keys = ("layers", "embed_dim", "ffn_dim", "heads", "dropout", "attention_dropout",
                  "activation_dropout", "max_tokens", "lr", "warmup_updates", "weight_decay",
                  "label_smoothing", "max_update")
    settings = dict(data=data["fingerprint"], scheme=scheme, seed=args.seed,
                    extra_train_args=args.extra_train_args, **{k: cfg[k] for k in model_keys})
    step = Step(run_dir, f"training {scheme}", settings, overwrite=args.overwrite,
                files=("train_settings.json", "train_done.json"))
    old = read_json(step.stamp)
    # a larger --max-update continues a finished run (inverse_sqrt does not depend on it)
    grow = (old is not None and step.diff() and set(step.diff()) == {"max_update"}
            and old["max_update"] < cfg["max_update"])
    if step.check(resumable=("max_update",) if grow else ()):
        log(f"train {scheme}: reusing finished run in {rel(run_dir)}")
        return run_dir
    times_path = os.path.join(run_dir, "train_time.json")
    log_path = os.path.join(run_dir, "train.log")
    last = os.path.join(run_dir, "checkpoint_last.pt")
    if os.path.exists(last):
        times = read_json(times_path, [])
        log(f"train {scheme}: resuming from {rel(last)} (fairseq restores model, optimizer and "
            f"data position) up to {cfg['max_update']} updates")
    else:  # nothing to resume: forget the time and log lines of earlier failed attempts
        times = []
        for path in (times_path, log_path):
            if os.path.exists(path):
                os.remove(path)
        log(f"train {scheme}: {cfg['max_update']} updates from scratch; load average {loadavg()}")
    history.add(f"train {scheme}")
    session = dict(start=datetime.datetime.now().isoformat(timespec="seconds"), load_start=loadavg())
    t0, stats = time.time(), {}
    try:
        cpu = run(train_command(args, cfg, scheme, data["bin"], run_dir), log_path=log_path,
                  append=True, prefix=f"[{scheme}] ", stats=stats)
    finally:
        session.update(wall_s=round(time.time() - t0, 1), cpu_s=round(stats.get("cpu_s", 0.0), 1),
                       load_end=loadavg())
        write_json(times_path, times + [session])
    curves = parse_train_log(log_path)
    updates = max([p[0] for p in curves["train"] + curves["valid"]], default=0)
    step.finish(dict(updates=updates, wall_s=round(sum(s["wall_s"] for s in times + [session]), 1)))
    log(f"train {scheme}: done, {updates} updates; this session {session['wall_s']:.0f} s wall, "
        f"{cpu:.0f} s CPU")
    return run_dir


# ------------------------------------------------------------------------------------------------
# 4. translation and scoring


def generate(args, scheme, data, run_dir, n_test, history):
    ckpt = os.path.join(run_dir, "checkpoint_best.pt")
    if not os.path.isfile(ckpt):
        raise ToolError(f"{rel(ckpt)} is missing although training {scheme} finished; restore it, or "
                        f"delete {rel(run_dir)} to train {scheme} again")
    settings = dict(checkpoint=file_id(ckpt), data=data["fingerprint"], **GENERATION)
    step = Step(run_dir, f"translation {scheme}", settings, cheap=True, owns=False,
                files=("gen_settings.json", "gen_done.json"))
    hyp_path = os.path.join(run_dir, "hyp.test.en")
    if step.check() and os.path.exists(hyp_path):
        log(f"translate {scheme}: reusing {rel(hyp_path)}")
        return hyp_path, step.info()
    log(f"translate {scheme}: fairseq-generate on {n_test} test sentences (beam {GENERATION['beam']})")
    history.add(f"translate {scheme}")
    t0 = time.time()
    cmd = generate_command(tool("fairseq-generate"), data["bin"], ckpt, run_dir, args.user_dir, SRC, TGT,
                           device_args=device_args(args))
    cpu = run(cmd, log_path=os.path.join(run_dir, "generate.log"), prefix=f"[{scheme}] ")
    hyps = read_generate(os.path.join(run_dir, "generate-test.txt"))["hyps"]
    if sorted(hyps) != list(range(n_test)):
        raise ToolError(f"fairseq-generate translated {len(hyps)} of {n_test} test sentences "
                        f"(see {rel(os.path.join(run_dir, 'generate-test.txt'))})")
    decode(data["spm_model"], [hyps[i] for i in range(n_test)], hyp_path)
    info = dict(seconds=round(time.time() - t0, 1), cpu_s=round(cpu, 1))
    step.finish(info)
    return hyp_path, info


# ------------------------------------------------------------------------------------------------
# 5. interactive check, reports, plot


def interactive_command(args, data, run_dir, tool_path=False):
    """The ``fairseq-interactive`` command that translates with the demo's best model, every path absolute so
    that it runs from any folder; ``tool_path``: the tool by its full path (as the demo checks it) rather than
    by name (as printed for a user with the virtual environment on PATH)."""
    p = os.path.abspath
    return fairseq_interactive_command(tool("fairseq-interactive") if tool_path else "fairseq-interactive",
                                       p(data["bin"]), p(os.path.join(run_dir, "checkpoint_best.pt")),
                                       p(args.user_dir), p(data["spm_model"]), SRC, TGT, device_args(args))


def check_interactive(args, data, run_dir, sentence):
    """Run the printed fairseq-interactive command on ``sentence``; return its H- translation."""
    ckpt = os.path.join(run_dir, "checkpoint_best.pt")
    settings = dict(checkpoint=file_id(ckpt), sentence=sentence,
                    cmd=interactive_command(args, data, run_dir, tool_path=True))
    step = Step(run_dir, "interactive check", settings, cheap=True, owns=False,
                files=("interactive_settings.json", "interactive_done.json"))
    if step.check():
        log(f"interactive: reusing checked translation ({rel(step.done_path)})")
        return step.info()["translation"]
    cmd = interactive_command(args, data, run_dir, tool_path=True)
    log(f"interactive: checking the fairseq-interactive command on {sentence!r}")
    proc = subprocess.run(cmd, input=sentence + "\n", capture_output=True, text=True, encoding="utf-8")
    hyps = [line.split("\t")[2] for line in proc.stdout.splitlines()
            if line.startswith("D-") and line.count("\t") >= 2]
    if proc.returncode != 0 or len(hyps) != 1:
        raise ToolError("the fairseq-interactive check failed (exit status "
                        f"{proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    step.finish(dict(translation=hyps[0]))
    return hyps[0]


# ------------------------------------------------------------------------------------------------


def build_parser():
    p = argparse.ArgumentParser(
        prog="run_demo.sh", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="German->English demo: train residual_transformer models of the schemes of --schemes "
                    "(default Post-LN, Pre-LN and ResiDual) on the Ding corpus (CPU), translate the test split "
                    "and score them (sacreBLEU, chrF). Finished steps are reused when run again.",
        epilog="Presets (the options above override their values):\n" + "\n".join(
            f"  {name:8s} " + ", ".join(f"{k}={v}" for k, v in p.items()) for name, p in PRESETS.items()))
    p.add_argument("--long", action="store_true", help="longer, better run (4x the default updates)")
    p.add_argument("--tiny", action="store_true", help="tiny model and vocabulary, for tests")
    p.add_argument("--schemes", default=",".join(SCHEMES),
                   help=f"comma-separated residual schemes to train (default: {','.join(SCHEMES)})")
    p.add_argument("--data", default=DEFAULT_CORPUS, help="corpus folder with {train,valid,test}.{de,en} "
                   "(default: data/ding-de-en)")
    p.add_argument("--out", default=None, help=f"output folder (default: {DEFAULT_OUT}, its long/ "
                                               f"with --long; $FAIRSEQ_RESIDUAL_RUNS sets the folder above it)")
    p.add_argument("--subset", type=nonnegative_int, default=0, metavar="N",
                   help="use only the first N sentence pairs of each split (0: all)")
    p.add_argument("--seed", type=nonnegative_int, default=1, help="fairseq-train --seed, the same for every scheme")
    p.add_argument("--overwrite", action="store_true",
                   help="redo finished steps whose settings changed (default: stop with an error)")
    for key, typ in (("vocab_size", at_least(MIN_VOCAB)), ("layers", positive_int), ("embed_dim", positive_int),
                     ("ffn_dim", positive_int), ("heads", positive_int), ("dropout", fraction),
                     ("max_tokens", positive_int), ("lr", positive_float), ("warmup_updates", positive_int),
                     ("max_update", positive_int), ("log_interval", positive_int)):
        p.add_argument("--" + key.replace("_", "-"), type=typ, default=None, dest=key,
                       help="override the preset's " + key)
    p.add_argument("--jobs", type=nonnegative_int, default=0,
                   help="schemes trained (and translated) at the same time (default: all)")
    p.add_argument("--threads", type=nonnegative_int, default=1,
                   help="CPU threads of each fairseq process (OMP_NUM_THREADS, default 1)")
    p.add_argument("--gpu", action="store_true",
                   help="train and translate on the GPU (default: CPU, as the budget assumes)")
    p.add_argument("--user-dir", default=PLUGIN_DIR,
                   help="the fairseq_residual plugin folder (default: the one Python imports, %(default)s)")
    p.add_argument("--extra-train-args", default="", help="more fairseq-train options (one string)")
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    history = RunHistory()
    preset = "tiny" if args.tiny else "long" if args.long else "default"
    cfg = dict(PRESETS[preset])
    for key in cfg:
        if getattr(args, key, None) is not None:
            cfg[key] = getattr(args, key)
    check_extra_args(args.extra_train_args, DEMO_OPTIONS)
    args.extra_train_args = shlex.split(args.extra_train_args)
    try:
        schemes = name_list(SCHEME_NAMES, "scheme")(args.schemes)
    except argparse.ArgumentTypeError as exc:
        raise ToolError(f"--schemes: {exc}") from None
    if args.gpu:
        require_cuda("--gpu")
    if args.subset < 0 or 0 < args.subset < N_EXAMPLES:
        raise ToolError(f"--subset must be 0 (all) or at least {N_EXAMPLES}")
    if args.out is None:
        args.out = os.path.join(DEFAULT_OUT, "long") if args.long else DEFAULT_OUT
    args.out = os.path.abspath(args.out)
    args.data = os.path.abspath(args.data)
    args.user_dir = os.path.abspath(args.user_dir)
    os.makedirs(args.out, exist_ok=True)
    # one thread per fairseq process: on a small CPU, OpenMP threads of small matrices mostly wait
    # for each other (measured: 2 threads 2.5x slower than 1 on a busy 2-core machine); the
    # schemes run in parallel instead
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    command = " ".join(["scripts/run_demo.sh"] + [shlex.quote(a) for a in argv])
    log(f"{command}")
    log(f"preset {preset}: " + ", ".join(f"{k}={v}" for k, v in cfg.items()))
    log(f"output folder {rel(args.out)}; {os.cpu_count()} CPU cores, load average {loadavg()}")

    digests, counts = check_corpus(args.data)
    data = prepare(args.out, args.data, cfg["vocab_size"], digests, counts, subset=args.subset,
                   overwrite=args.overwrite, log=log, computed=history.computed)
    n_test = min(counts["test"], args.subset) if args.subset else counts["test"]
    ref_path = os.path.join(data["raw"], f"test.{TGT}")

    results = dict(command=command, preset=preset, schemes={})
    curves, hyp_paths = {}, {}
    jobs = args.jobs or len(schemes)
    log(f"training {', '.join(schemes)}: {jobs} at a time, {os.environ.get('OMP_NUM_THREADS')} "
        f"thread(s) each, {cfg['max_update']} updates each")
    run_dirs = dict(zip(schemes, parallel(lambda s: train(args, cfg, s, data, history), schemes, jobs)))
    gens = dict(zip(schemes, parallel(lambda s: generate(args, s, data, run_dirs[s], n_test, history),
                                      schemes, jobs)))
    for scheme in schemes:
        run_dir = run_dirs[scheme]
        hyp_path, gen_info = gens[scheme]
        hyp_paths[scheme] = hyp_path
        c = curves[scheme] = parse_train_log(os.path.join(run_dir, "train.log"))
        times = read_json(os.path.join(run_dir, "train_time.json"), [])
        train_s = sum(t["wall_s"] for t in times)
        train_cpu = sum(t.get("cpu_s") or 0 for t in times)
        updates = max([u for u, *_ in c["train"] + c["valid"]], default=0)
        best = min(c["valid"], key=lambda v: v[1]) if c["valid"] else (0, math.nan, math.nan, math.nan)
        r = dict(score(hyp_path, ref_path), best_valid_loss=best[1], best_valid_nll_loss=best[2],
                 best_valid_ppl=best[3], best_valid_update=best[0], params=c["params"] or 0,
                 updates=updates, train_time_s=round(train_s, 1),
                 updates_per_s=round(updates / train_s, 3) if train_s else 0.0,
                 train_cpu_s=round(train_cpu, 1), translate_cpu_s=gen_info.get("cpu_s", 0.0),
                 translate_time_s=gen_info.get("seconds", 0.0),
                 train_load_average=[(t.get("load_start"), t.get("load_end")) for t in times])
        results["schemes"][scheme] = r
        log(f"{scheme}: {r['bleu_detail']}")
        log(f"{scheme}: chrF2 = {r['chrf']:.2f}   ({r['chrf_signature']})")

    srcs = read_lines(os.path.join(data["raw"], f"test.{SRC}"))
    refs = read_lines(ref_path)
    hyps = {s: read_lines(p) for s, p in hyp_paths.items()}
    examples = [dict(line=i + 1, source=srcs[i], reference=refs[i],
                     hypotheses={s: hyps[s][i] for s in schemes}) for i in range(N_EXAMPLES)]

    best_scheme = max(schemes, key=lambda s: results["schemes"][s]["bleu"])
    run_dir = os.path.join(args.out, "runs", best_scheme)
    translation = check_interactive(args, data, run_dir, INTERACTIVE_SENTENCE)
    bare = " ".join(shlex.quote(c) for c in interactive_command(args, data, run_dir))
    cmd_line = f"echo {shlex.quote(INTERACTIVE_SENTENCE)} | {bare} 2>/dev/null | grep ^D- | cut -f3"
    interactive = dict(scheme=best_scheme, command=cmd_line, interactive_command=bare,
                       sentence=INTERACTIVE_SENTENCE, translation=translation)

    plot_path = os.path.join(args.out, "loss_curves.png")
    plot(curves, plot_path, f"{corpus_label(args.data, short=True)}, {cfg['layers']}+{cfg['layers']} layers, width "
                            f"{cfg['embed_dim']}, {cfg['max_update']} updates ({preset} preset)")
    results["demo_wall_s"] = round(time.time() - history.t0, 1)
    results["history"] = history.record(os.path.join(args.out, "history.json"), command, results["demo_wall_s"])
    table = write_reports(args, cfg, results, examples, interactive, args.out)

    print()
    print(table)
    for i, ex in enumerate(examples, 1):
        print(f"{i}. source:    {ex['source']}\n   reference: {ex['reference']}")
        for s, h in ex["hypotheses"].items():
            print(f"   {SCHEME_LABELS[s] + ':':10s} {h}")
    print(f"\nBLEU signature: {next(iter(results['schemes'].values()))['bleu_signature']}")
    print(f"Results: {rel(os.path.join(args.out, 'results.md'))}, "
          f"{rel(os.path.join(args.out, 'results.json'))}; plot: {rel(plot_path)}; "
          f"examples: {rel(os.path.join(args.out, 'examples.md'))}")
    print(f"\nTranslate your own sentence with the {SCHEME_LABELS[best_scheme]} model (best BLEU "
          f"here); replace the German text:\n  {cmd_line}\n  -> {translation}")
    print(f"or type German sentences, one per line (D- lines hold the translations; Ctrl-D ends):\n"
          f"  {bare}")
    log(f"finished in {results['demo_wall_s'] / 60:.1f} min")
    return 0


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt


def cli():
    """``scripts/demo.py``: :func:`main` with the user's errors and Ctrl-C / SIGTERM handled."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        sys.exit(main())
    except ToolError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print("\nInterrupted; run the same command again to resume (finished steps are reused, "
              "training continues from checkpoint_last.pt).", file=sys.stderr)
        sys.exit(130)

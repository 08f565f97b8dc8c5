"""The demo's record of its runs and its results files: ``history.json`` (:class:`RunHistory`), ``results.json``,
``results.md`` and ``examples.md`` (:func:`write_reports`); the layout of the demo's folder is in
:mod:`.demo`."""
import datetime
import os
import time

from .commands import GENERATION
from .files import read_json, write_json
from .report import LABELS as SCHEME_LABELS
from .runner import git_commit, loadavg


class RunHistory:
    """One run of the demo for ``history.json``: when it started, its load average, and the steps it computed
    (:attr:`computed`, in the order they started; the rest it reused)."""

    def __init__(self):
        self.start = datetime.datetime.now().isoformat(timespec="seconds")
        self.t0, self.load_start = time.time(), loadavg()
        self.computed = []

    def add(self, step):
        self.computed.append(step)

    def record(self, path, command, wall_s):
        """Append this run to the history in ``path``; returns every run's entry, this one last."""
        history = read_json(path, []) + [dict(
            start=self.start, command=command, wall_s=wall_s, load_start=self.load_start, load_end=loadavg(),
            computed=list(self.computed))]
        write_json(path, history)
        return history


def write_reports(args, cfg, results, examples, interactive, out):
    """results.json, results.md and examples.md in ``out``; returns the Markdown table text."""
    write_json(os.path.join(out, "results.json"), dict(
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        command=results["command"], preset=results["preset"], commit=git_commit(),
        settings=cfg, generation=GENERATION,
        seed=args.seed, subset=args.subset, load_average_end=loadavg(), cpu_count=os.cpu_count(),
        demo_wall_s=results["demo_wall_s"], history=results["history"], schemes=results["schemes"],
        examples=examples,
        interactive=interactive))
    head = ("| scheme | BLEU | chrF | best valid loss | parameters | updates "
            "| train time (wall) | train CPU time | translate time (wall) |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    rows = []
    for scheme, r in results["schemes"].items():
        rows.append(f"| {SCHEME_LABELS[scheme]} | {r['bleu']:.2f} | {r['chrf']:.2f} | "
                    f"{r['best_valid_loss']:.3f} (@{r['best_valid_update']}) | {r['params']:,} | "
                    f"{r['updates']} | {r['train_time_s'] / 60:.1f} min | {r['train_cpu_s'] / 60:.1f} min | "
                    f"{r['translate_time_s']:.0f} s |")
    table = head + "\n".join(rows) + "\n"
    any_r = next(iter(results["schemes"].values()))
    ex_md = []
    for i, ex in enumerate(examples, 1):
        ex_md.append(f"{i}. **source:** {ex['source']}  \n   **reference:** {ex['reference']}  \n"
                     + "  \n".join(f"   **{SCHEME_LABELS[s]}:** {h}" for s, h in ex["hypotheses"].items()))
    ex_text = "\n".join(ex_md) + "\n"
    with open(os.path.join(out, "examples.md"), "w", encoding="utf-8") as f:
        f.write("# Example translations (test split)\n\n" + ex_text)
    c = cfg
    with open(os.path.join(out, "results.md"), "w", encoding="utf-8") as f:
        f.write(
            f"# German->English demo results ({results['preset']} preset)\n\n"
            f"Command: `{results['command']}`; {os.cpu_count()} CPU cores.  \n"
            f"Runs of the demo in this folder (what each computed; the rest it reused):\n\n"
            + "".join(f"- {h['start'].replace('T', ' ')}: `{h['command']}`, {h['wall_s'] / 60:.1f} min, "
                      f"load average {h['load_start']} at the start, {h['load_end']} at the end; "
                      f"computed: {', '.join(h['computed']) or 'nothing (all reused)'}\n"
                      for h in results["history"]) + "\n"
            f"Model: residual_transformer, {c['layers']}+{c['layers']} layers, {c['embed_dim']} / "
            f"{c['ffn_dim']} / {c['heads']} heads, dropout {c['dropout']}, shared embeddings, joint "
            f"sentencepiece vocabulary {c['vocab_size']}. Training: Adam, lr {c['lr']} (inverse_sqrt, "
            f"{c['warmup_updates']} warm-up updates), max_tokens {c['max_tokens']}, {c['max_update']} "
            f"updates, label smoothing {c['label_smoothing']}, seed {args.seed}, CPU. Translation: "
            f"checkpoint_best.pt, beam {GENERATION['beam']}, detokenized with sentencepiece, scored against the "
            f"raw references.\n\n{table}\n"
            f"BLEU signature: `{any_r['bleu_signature']}`  \nchrF signature: `{any_r['chrf_signature']}`\n\n"
            f"Loss is fairseq's label-smoothed cross-entropy in bits per target token; train time is "
            f"wall-clock on a shared machine.\n\nLoss curves: `loss_curves.png`\n\n"
            f"## Example translations\n\n{ex_text}\n"
            f"## Translate your own sentence\n\n```sh\n{interactive['command']}\n```\n\n"
            f"Checked on `{interactive['sentence']}`: `{interactive['translation']}`  \nTo type "
            f"sentences one per line (the `D-` lines hold the translations):\n\n"
            f"```sh\n{interactive['interactive_command']}\n```\n")
    return table

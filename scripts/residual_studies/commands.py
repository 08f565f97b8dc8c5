"""The one builder of the tools' ``fairseq-train``, ``fairseq-generate`` and ``fairseq-interactive`` commands
(and the home of their translation settings, :data:`GENERATION`), the benchmark configs' values, and the names
of the benchmark runs.

:func:`train_command` writes the command line of a ``residual_transformer`` translation run from one
settings mapping (the demo's presets, the study cells), :func:`generate_command` the translation of a test
split with one of its checkpoints, :func:`interactive_command` the translation of typed sentences;
:func:`config_values` reads a benchmark's tokens per update, default
precision and depth from its ``configs/*.yaml``, for ``scripts/train.sh`` (``python -m
residual_studies.shell train-defaults NAME``); :data:`RUN_NAME` is the run directory of one benchmark run,
which ``scripts/train.sh`` writes (it reads the pattern from ``train-defaults``) and :func:`parse_run_name`
reads (the results tables, ``scripts/evaluate.sh``'s metadata).
"""
import os
import re

from . import REPO

#: a benchmark run's directory under ``SAVE_ROOT/<benchmark>/``, as a ``str.format`` pattern (``scheme``,
#: ``layers`` per stack, ``seed``) and as the expression that reads it back
RUN_NAME = "{scheme}-{layers}L-seed{seed}"
RUN_NAME_RE = re.compile(r"^(?P<scheme>[a-z0-9_]+)-(?P<layers>\d+)L-seed(?P<seed>\d+)$")


def run_name(scheme, layers, seed):
    """The directory name of one benchmark run (:data:`RUN_NAME`)."""
    return RUN_NAME.format(scheme=scheme, layers=layers, seed=seed)


def parse_run_name(name):
    """``{"scheme", "layers", "seed"}`` of a run directory's name (layers and seed as ints), or None when
    ``name`` is not one."""
    m = RUN_NAME_RE.match(name)
    return dict(scheme=m.group("scheme"), layers=int(m.group("layers")), seed=int(m.group("seed"))) if m else None

#: the settings :func:`train_command` needs (beyond the data, the output folder and the scheme)
TRAIN_KEYS = ("layers", "embed_dim", "ffn_dim", "heads", "dropout", "attention_dropout",
              "activation_dropout", "clip_norm", "lr", "warmup_updates", "weight_decay", "label_smoothing",
              "max_tokens", "max_update", "seed", "log_interval")


def train_command(fairseq_train, data_bin, save_dir, scheme, settings, user_dir, src="de", tgt="en",
                  task="translation", task_args=(), device_args=("--cpu",), save_args=(), extra=()):
    """``fairseq-train`` of a ``residual_transformer`` with ``--residual-scheme scheme``, the same
    dimensions in both stacks, Adam (0.9, 0.98) with inverse_sqrt warm-up from 1e-7, label-smoothed
    cross-entropy, shared embeddings, JSON logs, no epoch checkpoints.

    Args:
        settings: a mapping with :data:`TRAIN_KEYS`.
        task_args, device_args, save_args, extra: more options after the task's, as the device's,
            after the checkpoint options, and at the end.
    """
    s = settings
    cmd = [fairseq_train, data_bin, "--user-dir", user_dir,
           "--task", task, "--source-lang", src, "--target-lang", tgt, *task_args,
           "--arch", "residual_transformer", "--residual-scheme", scheme, "--share-all-embeddings"]
    for stack in ("encoder", "decoder"):
        cmd += [f"--{stack}-layers", str(s["layers"]), f"--{stack}-embed-dim", str(s["embed_dim"]),
                f"--{stack}-ffn-embed-dim", str(s["ffn_dim"]), f"--{stack}-attention-heads", str(s["heads"])]
    cmd += ["--dropout", str(s["dropout"]), "--attention-dropout", str(s["attention_dropout"]),
            "--activation-dropout", str(s["activation_dropout"]),
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", str(s["clip_norm"]),
            "--lr", str(s["lr"]), "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", str(s["warmup_updates"]), "--warmup-init-lr", "1e-07",
            "--weight-decay", str(s["weight_decay"]),
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(s["label_smoothing"]),
            "--max-tokens", str(s["max_tokens"]), "--required-batch-size-multiple", "1",
            "--max-update", str(s["max_update"]), "--seed", str(s["seed"]),
            *device_args, "--num-workers", "0",
            "--save-dir", save_dir, "--no-epoch-checkpoints", *save_args,
            "--log-format", "json", "--log-interval", str(s["log_interval"])]
    return cmd + list(extra)


#: the translation settings of the tools' ``fairseq-generate`` and ``fairseq-interactive`` commands (a study
#: cell's ``beam`` is one of its settings and overrides this one)
GENERATION = dict(beam=5, max_len_a=1.2, max_len_b=10, batch_size=128)


def _search_args(g):
    return ["--beam", str(g["beam"]), "--max-len-a", str(g["max_len_a"]), "--max-len-b", str(g["max_len_b"])]


def generate_command(fairseq_generate, data_bin, checkpoint, results_path, user_dir, src="de", tgt="en",
                     device_args=("--cpu",), **generation):
    """``fairseq-generate`` of the ``test`` split of a translation data-bin with ``checkpoint``: beam
    search with :data:`GENERATION` (``generation`` overrides its values), every sentence kept
    (``--required-batch-size-multiple 1``), output to ``results_path/generate-test.txt``."""
    unknown = set(generation) - set(GENERATION)
    if unknown:
        raise TypeError(f"generate_command: unknown generation settings {sorted(unknown)}")
    g = dict(GENERATION, **generation)
    return [fairseq_generate, data_bin, "--user-dir", user_dir, "--path", checkpoint,
            "--task", "translation", "--source-lang", src, "--target-lang", tgt, "--gen-subset", "test",
            *_search_args(g), "--batch-size", str(g["batch_size"]), "--required-batch-size-multiple", "1",
            *device_args, "--num-workers", "0", "--results-path", results_path]


def interactive_command(fairseq_interactive, data_bin, checkpoint, user_dir, spm_model, src="de", tgt="en",
                        device_args=("--cpu",)):
    """``fairseq-interactive`` translating stdin with ``checkpoint``: the pieces of the sentencepiece model
    ``spm_model``, beam search with :data:`GENERATION` (one sentence at a time: no batch size)."""
    return [fairseq_interactive, data_bin, "--user-dir", user_dir, "--path", checkpoint,
            "--task", "translation", "--source-lang", src, "--target-lang", tgt,
            "--bpe", "sentencepiece", "--sentencepiece-model", spm_model,
            *_search_args(GENERATION), "--required-batch-size-multiple", "1", *device_args]


CONFIG_DIR = os.path.join(REPO, "configs")


def config_values(name, config_dir=CONFIG_DIR):
    """A benchmark config's ``tokens_per_update`` (max_tokens x update_freq, on one GPU),
    ``precision`` (fp32, fp16, bf16 or amp) and ``depth`` (encoder layers)."""
    from omegaconf import OmegaConf

    path = os.path.join(config_dir, f"{name}.yaml")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no benchmark config {path}")
    cfg = OmegaConf.load(path)
    common = cfg.get("common", {})
    precision = next((p for p in ("amp", "fp16", "bf16") if common.get(p, False)), "fp32")
    update_freq = cfg.optimization.get("update_freq", [1])
    return dict(tokens_per_update=int(cfg.dataset.max_tokens) * int(update_freq[0]), precision=precision,
                depth=int(cfg.model.encoder_layers))

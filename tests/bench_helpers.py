"""Helpers shared by the benchmark-pipeline tests (test_configs, test_train_script, test_evaluate):
tiny binarized corpora in the layouts of the real benchmarks, and running the shell scripts."""
import random
import subprocess
from pathlib import Path

from conftest import REPO, cli_env, run_cli

SCRIPTS = REPO / "scripts"
CONFIGS = REPO / "configs"

#: Overrides that shrink any benchmark config to a CPU-sized model and run (tests only).
TINY_TRAIN = [
    "model._name=residual_transformer_tiny",  # 64 / 64 / 2 heads
    "checkpoint.best_checkpoint_metric=loss",
    "checkpoint.maximize_best_checkpoint_metric=false",
    "common.log_interval=1",
    "dataset.num_workers=0",
    "optimization.lr=[0.005]",
    "lr_scheduler.warmup_updates=5",
]
#: ... plus, for the bilingual (translation task) configs: no validation BLEU (beam search)
TINY_TRANSLATION = TINY_TRAIN + ["task.eval_bleu=false"]

_CACHE = {}


def _words(rng, vocab, lo=3, hi=9):
    return [rng.choice(vocab) for _ in range(rng.randint(lo, hi))]


def multilingual_data_bin(tmp_path_factory, n_train=160, n_valid=16, n_test=21, seed=0):
    """OPUS-100's layout for translation_multi_simple_epoch, with 2 pairs en-de and en-nl.

    Made like scripts/prepare-opus100.sh makes it: one shared dictionary (dict.txt and identical
    dict.<lang>.txt), every pair binarized as en-xx (fairseq-preprocess --srcdict/--tgtdict),
    langs.txt / lang_pairs.txt (comma separated) in the data-bin, raw test text in ../raw/.
    Synthetic languages: de = the English words reversed and upper-cased, nl = upper-cased.

    Returns the data-bin directory (built once per session).
    """
    if "multi" in _CACHE:
        return _CACHE["multi"]
    from fairseq.data import Dictionary

    root = tmp_path_factory.mktemp("opus_like")
    rng = random.Random(seed)
    vocab = "a b c d e f g h i j k l m n o p".split()
    make = {"de": lambda ws: list(reversed(ws)), "nl": lambda ws: ws}
    text = root / "text"
    raw = root / "raw"
    binned = root / "data-bin"
    for d in (text, raw, binned):
        d.mkdir()
    for lang in ("de", "nl"):
        for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
            en_lines, xx_lines = [], []
            for _ in range(n):
                ws = _words(rng, vocab)
                en_lines.append(" ".join(ws))
                xx_lines.append(" ".join(make[lang](ws)).upper())
            (text / f"{split}.en-{lang}.en").write_text("\n".join(en_lines) + "\n")
            (text / f"{split}.en-{lang}.{lang}").write_text("\n".join(xx_lines) + "\n")
            if split == "test":
                (raw / f"test.en-{lang}.en").write_text("\n".join(en_lines) + "\n")
                (raw / f"test.en-{lang}.{lang}").write_text("\n".join(xx_lines) + "\n")
    d = Dictionary()
    for w in vocab + [w.upper() for w in vocab]:
        d.add_symbol(w)
    d.finalize(padding_factor=1)
    d.save(str(binned / "dict.txt"))
    for lang in ("en", "de", "nl"):
        d.save(str(binned / f"dict.{lang}.txt"))
    for lang in ("de", "nl"):
        run_cli([
            "fairseq-preprocess", "--source-lang", "en", "--target-lang", lang,
            "--trainpref", text / f"train.en-{lang}", "--validpref", text / f"valid.en-{lang}",
            "--testpref", text / f"test.en-{lang}", "--srcdict", binned / "dict.txt",
            "--tgtdict", binned / "dict.txt", "--destdir", binned, "--workers", "1",
        ])
    (binned / "langs.txt").write_text("en,de,nl\n")
    (binned / "lang_pairs.txt").write_text("en-de,de-en,en-nl,nl-en\n")
    _CACHE["multi"] = binned
    return binned


def run_script(args, check=True, timeout=600, **kwargs):
    """Run one of scripts/*.sh (bash) with the venv first on PATH; stdout and stderr merged."""
    proc = subprocess.run(
        ["bash", *[str(a) for a in args]], env=cli_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=timeout, **kwargs,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout[-8000:]}")
    return proc


def count_lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def generate_lines(path, prefix):
    """{sentence id: text} of the ``H-`` (last tab field) or ``T-`` lines of fairseq-generate output,
    parsed independently of scripts/score_bleu.py."""
    out = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith(prefix + "-"):
            fields = line.split("\t")
            out[int(fields[0][len(prefix) + 1:])] = fields[-1] if len(fields) > 1 else ""
    return out

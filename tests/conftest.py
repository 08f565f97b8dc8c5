"""Shared fixtures: building models in-process from fairseq command-line flags, tiny corpora, the environment
of subprocesses, and the study tooling (scripts/residual_studies, importable from here)."""
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

# Exactness by construction: MKL (torch's BLAS on x86) picks code paths by the memory alignment of its
# arguments unless its conditional numerical reproducibility is on, so that two runs of the same operations on
# the same shapes (a resumed run and an uninterrupted one, a model and its state-dict twin) could differ in
# the last bit. STRICT makes its results independent of alignment on a given CPU and thread count. Set before
# torch loads MKL; subprocesses inherit it (cli_env copies os.environ).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import pytest  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "fairseq_residual")
VENV_BIN = Path(sys.executable).parent
SCRIPTS = REPO / "scripts"
SHIPPED_CORPUS = REPO / "data" / "ding-de-en"
sys.path.insert(0, str(SCRIPTS))  # the study tooling runs from the checkout, as scripts/*.py run it

from residual_studies.runner import MALLOC_ENV  # noqa: E402

torch.set_num_threads(1)  # the suite runs on 2 shared cores; one thread per process is fastest overall
# every fairseq subprocess of the suite gets the tools' malloc settings (fewer page faults, same numbers)
for _key, _value in MALLOC_ENV.items():
    os.environ.setdefault(_key, _value)


# the fast lane by construction (tests/process_guard.py): a test not marked slow may not start a process
pytest_plugins = ["process_guard", "pytester"]
from process_guard import slow_fixture  # noqa: E402
from inprocess import fairseq_main  # noqa: E402


def pytest_itemcollected(item):
    """pytest-xdist's ``--dist loadgroup`` (the Makefile's): tests run one by one on whichever worker is free,
    except that the tests of a file that share a module-scoped fixture of that file (a trained model, a
    study run) go to one worker, which builds it once (``xdist_group``, by construction: no list by hand;
    marked as each test is collected, before xdist reads the marks)."""
    path = item.nodeid.split("::")[0]
    info = getattr(item, "_fixtureinfo", None)
    if info is not None and any(fd.scope == "module" and fd.baseid == path
                                for defs in info.name2fixturedefs.values() for fd in defs):
        item.add_marker(pytest.mark.xdist_group(path))


@pytest.hookimpl(trylast=True)  # after tests/process_guard.py has marked the tests of slow fixtures slow
def pytest_collection_modifyitems(items):
    """Under pytest-xdist, the slow tests (those that start processes, tests/process_guard.py) first, each
    lane in its files' order. ``--dist loadgroup`` hands out the groups of module-scoped fixtures first
    (largest first), then the other tests in collection order: a slow test collected late (a file near the
    end of the alphabet) could start when the other worker has little left and set the suite's wall time;
    this way the workers end on fast tests and finish together. (Without xdist the order stays the files'.)"""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: False (slow) first


def cli_env():
    """Environment for every subprocess of the suite (fairseq CLIs, the scripts): the venv's bin first on
    PATH, its Python as ``PYTHON`` (what the shell scripts run), one thread, unbuffered output, no
    weights_only override."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHON"] = sys.executable
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cli(args, cwd=None, check=True, timeout=600):
    """Run a fairseq CLI; on failure show its output. Returns the CompletedProcess (text)."""
    proc = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout[-6000:]}")
    return proc


def make_dictionary(n_symbols=40):
    """A fairseq Dictionary with ``n_symbols`` word types besides the 4 specials."""
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(n_symbols):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def build_model(arch, *flags, dictionary=None, task_cls=None):
    """Build a model exactly as ``fairseq-train --user-dir fairseq_residual --arch ARCH FLAGS`` would.

    Returns ``(model, args, task)``; the model is in eval mode (dropout off).
    """
    from fairseq import options
    from fairseq.tasks.translation import TranslationTask

    parser = options.get_training_parser()
    argv = ["/nonexistent-data", "--user-dir", USER_DIR, "--arch", arch, "--task", "translation"]
    args = options.parse_args_and_arch(parser, argv + [str(f) for f in flags])
    d = dictionary if dictionary is not None else make_dictionary()
    task = (task_cls or TranslationTask)(args, d, d)
    model = task.build_model(args)
    model.eval()
    return model, args, task


def random_batch(dictionary, bsz=4, src_len=7, tgt_len=6, seed=0, pad_rows=True):
    """A batch with left-padded sources and right-padded targets (fairseq's translation layout).

    Returns ``(src_tokens [B x S], src_lengths [B], prev_output_tokens [B x T], target [B x T])``.
    """
    g = torch.Generator().manual_seed(seed)
    pad, eos, nspecial = dictionary.pad(), dictionary.eos(), dictionary.nspecial
    V = len(dictionary)
    src = torch.full((bsz, src_len), pad, dtype=torch.long)
    tgt = torch.full((bsz, tgt_len), pad, dtype=torch.long)
    lengths = []
    for b in range(bsz):
        ls = src_len - (b % 3 if pad_rows else 0)
        lt = tgt_len - (b % 2 if pad_rows else 0)
        s = torch.randint(nspecial, V, (ls,), generator=g)
        s[-1] = eos
        src[b, src_len - ls :] = s  # left padding
        t = torch.randint(nspecial, V, (lt,), generator=g)
        t[-1] = eos
        tgt[b, :lt] = t
        lengths.append(ls)
    prev = torch.full_like(tgt, pad)
    prev[:, 0] = eos
    for b in range(bsz):
        lt = int(tgt[b].ne(pad).sum())
        prev[b, 1:lt] = tgt[b, : lt - 1]
    return src, torch.tensor(lengths), prev, tgt


def log_probs(model, src, lengths, prev):
    """The model's teacher-forced log-probabilities of ``prev`` (B x T x V)."""
    return model.get_normalized_probs(model(src, lengths, prev), log_probs=True)


def load_shared_weights(source, target):
    """Load into ``target`` every parameter and buffer it shares by name with ``source`` (not the scheme's id)."""
    theirs = target.state_dict()
    target.load_state_dict({k: v for k, v in source.state_dict().items() if k in theirs
                            and "residual_scheme_id" not in k}, strict=False)


def max_log_prob_difference(a, b, dictionary, bsz=4):
    """The largest |log-probability difference| of models ``a`` and ``b`` over the target (non-pad) positions of
    :func:`random_batch` ``(dictionary, bsz)``, without gradients."""
    src, lengths, prev, _ = random_batch(dictionary, bsz=bsz)
    with torch.no_grad():
        diff = log_probs(a, src, lengths, prev) - log_probs(b, src, lengths, prev)
    return diff[prev.ne(dictionary.pad())].abs().max().item()


def train_step(model, optimizer, dictionary, seed):
    """One optimizer step of ``model`` in training mode on :func:`random_batch` ``(dictionary, seed=seed)``: the
    summed negative log-likelihood of its targets, backward, ``optimizer.step()``."""
    src, lengths, prev, target = random_batch(dictionary, seed=seed)
    model.train()
    optimizer.zero_grad()
    lprobs = log_probs(model, src, lengths, prev)
    (-lprobs.gather(-1, target.unsqueeze(-1)).sum()).backward()
    optimizer.step()


def write_tiny_parallel(directory, n_train=240, n_valid=24, n_test=24, seed=0):
    """A tiny synthetic translation corpus (source words -> reversed, upper-cased target words)."""
    rng = random.Random(seed)
    words = "a b c d e f g h i j k l m n o p".split()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        with open(directory / f"{split}.src", "w") as fs, open(directory / f"{split}.tgt", "w") as ft:
            for _ in range(n):
                s = [rng.choice(words) for _ in range(rng.randint(3, 9))]
                fs.write(" ".join(s) + "\n")
                ft.write(" ".join(reversed(s)).upper() + "\n")
    return directory


@slow_fixture(scope="session")
def tiny_data_bin(tmp_path_factory):
    """A binarized tiny corpus with a joined dictionary: ``(raw_dir, bin_dir)``."""
    root = tmp_path_factory.mktemp("tiny_corpus")
    raw = write_tiny_parallel(root / "raw")
    binned = root / "bin"
    fairseq_main("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
                 "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", binned,
                 "--joined-dictionary", "--workers", "1")
    return raw, binned


@pytest.fixture
def fresh_copy(tmp_path):
    """Copy a directory into this test's tmp dir (for tests that write next to shared data)."""

    def _copy(src):
        dst = tmp_path / Path(src).name
        shutil.copytree(src, dst)
        return dst

    return _copy


def write_corpus_head(directory, n_train, n_valid, n_test):
    """The first ``n_train`` / ``n_valid`` / ``n_test`` pairs of each split of the shipped German-English corpus
    (data/ding-de-en) in ``directory`` (``{train,valid,test}.{de,en}``); returns the folder."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        for lang in ("de", "en"):
            with open(SHIPPED_CORPUS / f"{split}.{lang}", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            (directory / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    return directory


@pytest.fixture(scope="session")
def corpus_head(tmp_path_factory):
    """``corpus_head(n_train, n_valid, n_test)``: a folder holding the first pairs of the shipped corpus
    (:func:`write_corpus_head`), made once per session for each size; do not write into it."""
    made = {}

    def head(n_train, n_valid, n_test):
        key = (n_train, n_valid, n_test)
        if key not in made:
            made[key] = write_corpus_head(tmp_path_factory.mktemp("corpus_head"), *key)
        return made[key]

    return head


@slow_fixture(scope="session")
def shipped_data_bin(tmp_path_factory, corpus_head):
    """The first pairs of the shipped German-English corpus (data/ding-de-en), whitespace-tokenised and
    binarized with a joined dictionary capped at 2,000 types: ``(raw_dir, bin_dir)``, lang de -> en.

    400 training pairs and 24 valid/test pairs: enough for a few real updates and beam search on real
    text, small enough for CI."""
    raw = corpus_head(400, 24, 24)
    binned = tmp_path_factory.mktemp("shipped_corpus") / "bin"
    fairseq_main("fairseq-preprocess", "--source-lang", "de", "--target-lang", "en", "--trainpref", raw / "train",
                 "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", binned,
                 "--joined-dictionary", "--nwordssrc", "2000", "--workers", "1")
    return raw, binned

"""The studies' corpus: the check of the raw parallel corpus, one joint sentencepiece model, binarisation,
the BLEU subset of the test split, and scoring against the raw references.

One preparation serves the demo (``demo_out/data``) and the studies (``<out>/data``), so that a study's
cells and the demo's runs see the same pieces for the same settings:

1. :func:`check_corpus`: every ``{train,valid,test}.{de,en}`` file present, non-empty, UTF-8, without an
   empty line, and both sides of a split of the same length;
2. :func:`prepare`: the (prefix of the) corpus copied to ``data/raw``, one joint unigram sentencepiece model
   learned on train (both sides), every split encoded, the sentencepiece vocabulary as the fairseq
   dictionary (so every piece has an index, also in ``fairseq-interactive``), ``fairseq-preprocess
   --joined-dictionary`` into ``data/bin``; a resumable step whose settings fingerprint names the data in
   every cell's settings;
3. :func:`bleu_subset`: the first N test pairs binarized on their own (``data/bleu-test-N/``), for the
   studies' translations;
4. :func:`decode` and :func:`score`: hypotheses decoded with the sentencepiece model, sacreBLEU and chrF
   (sacrebleu's Python API) against the raw references.
"""
import glob
import os
import shutil
import subprocess
import time

from .files import fingerprint, read_json, read_lines, write_json, write_lines
from . import REPO
from .runner import ToolError, rel, run, say, tool
from .steps import Step

SRC, TGT = "de", "en"
#: the splits of every parallel corpus the tools read or write, in this order
SPLITS = ("train", "valid", "test")
#: the shipped Ding German-English corpus (data/README.md)
DEFAULT_CORPUS = os.path.join(REPO, "data", "ding-de-en")
#: the smallest sentencepiece vocabulary the preparation takes: its unknown piece and a few real ones
MIN_VOCAB = 8
#: what a study says when its folder holds a preparation with other settings (studies redo nothing finished)
STUDY_HINT = ("A study folder holds one preparation: use another --out folder, or the settings it was "
              "prepared with ({options}); or delete {folder} to prepare it again")
#: the studies' options behind the preparation's settings
STUDY_SETTING_OPTIONS = {"vocab_size": "--vocab-size {old}", "corpus": "--data of that corpus",
                         "subset": "the whole corpus"}


def check_corpus(data_dir, src=SRC, tgt=TGT):
    """Validate the raw parallel corpus.

    Returns:
        ``({file name: sha256}, {split: pairs})``.

    Raises:
        ToolError: naming the file (and line) that is missing, empty, not UTF-8, has an empty line, or
            whose line count differs from its other side.
    """
    import hashlib

    if not os.path.isdir(data_dir):
        raise ToolError(f"corpus folder not found: {data_dir} (expected {SPLITS} x .{src}/.{tgt} "
                        f"files, see data/README.md)")
    if glob.glob(os.path.join(data_dir, "dict.*.txt")) and glob.glob(os.path.join(data_dir, "*.idx")):
        raise ToolError(f"{data_dir} is a fairseq-preprocess output (dict.*.txt, *.bin/.idx); --data takes the raw "
                        f"text corpus ({', '.join(f'{s}.{src}/.{tgt}' for s in SPLITS)}, e.g. data/ding-de-en), which the "
                        f"study tokenizes and binarizes itself")
    digests, counts = {}, {}
    for split in SPLITS:
        for lang in (src, tgt):
            path = os.path.join(data_dir, f"{split}.{lang}")
            if not os.path.isfile(path):
                raise ToolError(f"missing data file: {path} (restore it, e.g. `git checkout -- "
                                f"{rel(path)}`, or see data/README.md to rebuild the corpus)")
            with open(path, "rb") as f:
                raw = f.read()
            if not raw.strip():
                raise ToolError(f"empty data file: {path}")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = raw[: exc.start].count(b"\n") + 1
                raise ToolError(f"data file is not valid UTF-8: {path} (line {line}, byte offset "
                                f"{exc.start}: {raw[exc.start:exc.start + 4]!r})") from None
            lines = text.split("\n")
            if lines[-1] == "":
                lines.pop()
            for i, line in enumerate(lines, 1):
                if not line.strip():
                    raise ToolError(f"empty line {i} in data file: {path} (every line must hold "
                                    f"one sentence)")
            digests[f"{split}.{lang}"] = hashlib.sha256(raw).hexdigest()
            counts[split, lang] = len(lines)
        n_src, n_tgt = counts[split, src], counts[split, tgt]
        if n_src != n_tgt:
            raise ToolError(
                f"line count mismatch: {os.path.join(data_dir, f'{split}.{src}')} has {n_src} lines but "
                f"{os.path.join(data_dir, f'{split}.{tgt}')} has {n_tgt} (line i of one must translate "
                f"line i of the other)")
    return digests, {split: counts[split, src] for split in SPLITS}


def prepare(out, corpus, vocab_size, digests, counts, subset=0, overwrite=False, hint=None, log=say, computed=None):
    """Sentencepiece model and binarized corpus in ``out/data`` (reused when finished with the same
    settings).

    Args:
        corpus: the raw corpus folder (checked by :func:`check_corpus`, which gave ``digests`` and
            ``counts``).
        subset: use only the first N pairs of each split (0: all).
        overwrite: redo a preparation finished with other settings (default: stop with an error).
        hint: what that error tells the user to do (:class:`.steps.Step`; default: the demo's options).
        computed: a list that gets ``"data"`` when the step runs (the demo's run history).

    Returns:
        dict: ``dir``, ``raw``, ``spm_model``, ``bin`` (paths) and ``fingerprint`` (of the settings: the
        data's identity in every cell's settings).
    """
    data = os.path.join(out, "data")
    settings = dict(corpus=digests, subset=subset, vocab_size=vocab_size,
                    spm_model_type="unigram", character_coverage=1.0)
    step = Step(data, "data preparation", settings, overwrite=overwrite, hint=hint)
    paths = dict(dir=data, raw=os.path.join(data, "raw"), spm_model=os.path.join(data, "spm.model"),
                 bin=os.path.join(data, "bin"), fingerprint=fingerprint(settings))
    if step.check():
        log(f"data: reusing {rel(data)} (sentencepiece model and binarized data)")
        return paths
    t0 = time.time()
    if computed is not None:
        computed.append("data")
    import sentencepiece as spm

    os.makedirs(paths["raw"], exist_ok=True)
    for split in SPLITS:
        for lang in (SRC, TGT):
            lines = read_lines(os.path.join(corpus, f"{split}.{lang}"))
            write_lines(os.path.join(paths["raw"], f"{split}.{lang}"), lines[: subset] if subset else lines)
    n = {s: min(counts[s], subset) if subset else counts[s] for s in SPLITS}
    log(f"data: {n['train']} / {n['valid']} / {n['test']} train / valid / test pairs")

    prefix = os.path.join(data, "spm")
    log(f"data: learning a joint sentencepiece model (unigram, vocabulary {vocab_size}) "
        f"on train.{SRC} + train.{TGT}")
    spm.SentencePieceTrainer.train(
        input=[os.path.join(paths["raw"], f"train.{lang}") for lang in (SRC, TGT)],
        model_prefix=prefix, vocab_size=vocab_size, model_type="unigram",
        character_coverage=1.0, hard_vocab_limit=False, num_threads=2,
        minloglevel=2, bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1)
    sp = spm.SentencePieceProcessor(model_file=paths["spm_model"])

    enc_dir = os.path.join(data, "spm")
    os.makedirs(enc_dir, exist_ok=True)
    for split in SPLITS:
        for lang in (SRC, TGT):
            lines = read_lines(os.path.join(paths["raw"], f"{split}.{lang}"))
            pieces = sp.encode(lines, out_type=str)
            write_lines(os.path.join(enc_dir, f"{split}.{lang}"), [" ".join(p) for p in pieces])

    # the fairseq dictionary is the sentencepiece vocabulary minus the specials fairseq adds itself, so
    # that every piece sentencepiece can produce (also in fairseq-interactive) has an index
    dict_path = os.path.join(data, "dict.txt")
    specials = {"<unk>", "<s>", "</s>", "<pad>"}
    write_lines(dict_path, [f"{sp.id_to_piece(i)} 1" for i in range(sp.get_piece_size())
                            if sp.id_to_piece(i) not in specials])
    if os.path.isdir(paths["bin"]):
        shutil.rmtree(paths["bin"])
    pre = lambda split: os.path.join(enc_dir, split)  # noqa: E731
    run([tool("fairseq-preprocess"), "--source-lang", SRC, "--target-lang", TGT,
         "--trainpref", pre("train"), "--validpref", pre("valid"), "--testpref", pre("test"),
         "--destdir", paths["bin"], "--joined-dictionary", "--srcdict", dict_path,
         "--workers", "2"], log_path=os.path.join(data, "preprocess.log"), log=log)
    step.finish(dict(seconds=round(time.time() - t0, 1), pairs=n, vocab=sp.get_piece_size()))
    log(f"data: done in {time.time() - t0:.0f} s -> {rel(paths['bin'])}")
    return paths


def bleu_subset(paths, counts, sentences):
    """The first ``sentences`` test pairs (at most the split's), binarized on their own with the corpus'
    dictionary in ``data/bleu-test-N/``, and their raw references.

    Returns:
        ``paths`` with ``bleu_bin``, ``bleu_ref``, ``bleu_sentences`` and ``vocab`` (the dictionary size
        with fairseq's four specials) added.

    Raises:
        ToolError: fairseq-preprocess failed.
    """
    n = min(sentences, counts["test"])
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
            raise ToolError(f"fairseq-preprocess of the BLEU subset failed:\n{proc.stderr[-2000:]}")
        write_json(stamp, settings)
    with open(os.path.join(paths["dir"], "dict.txt"), encoding="utf-8") as f:
        vocab = sum(1 for _ in f) + 4  # fairseq adds <s>, <pad>, </s>, <unk>
    return dict(paths, bleu_bin=os.path.join(bleu_dir, "bin"), bleu_ref=os.path.join(bleu_dir, f"ref.{TGT}"),
                bleu_sentences=n, vocab=vocab)


def corpus_label(corpus, short=False):
    """How reports name the corpus folder ``corpus``: the shipped Ding de->en corpus (:data:`DEFAULT_CORPUS`)
    by name, any other by its path, each with its training pairs (``short``: without them, for plot titles)."""
    shipped = os.path.realpath(corpus) == os.path.realpath(DEFAULT_CORPUS)
    name = "Ding de->en" if shipped else os.path.basename(os.path.normpath(corpus))
    if short:
        return name
    try:
        with open(os.path.join(corpus, f"train.{SRC}"), encoding="utf-8", errors="replace") as f:
            pairs = sum(1 for _ in f)
    except OSError:
        return f"shipped {name} corpus" if shipped else f"corpus {corpus}"
    return (f"shipped {name} corpus ({pairs:,} training pairs)" if shipped
            else f"corpus {corpus} ({pairs:,} training pairs)")


def prepare_study(out, corpus, vocab_size, bleu_sentences, log=say):
    """:func:`check_corpus`, :func:`prepare` (whole corpus) and :func:`bleu_subset`: a study's data."""
    digests, counts = check_corpus(corpus)
    paths = prepare(out, corpus, vocab_size, digests, counts, hint=_study_hint, log=log)
    return bleu_subset(paths, counts, bleu_sentences)


def _study_hint(folder, diff):
    """:data:`STUDY_HINT` for a study's data step whose settings ``diff`` (``{key: (old, new)}``) changed."""
    named = [STUDY_SETTING_OPTIONS[k].format(old=old) for k, (old, _) in diff.items() if k in STUDY_SETTING_OPTIONS]
    return STUDY_HINT.format(options=", ".join(named) or "see above", folder=rel(folder))


def decode(spm_model, pieces, path):
    """Write the sentencepiece ``pieces`` (one space-separated string per sentence) decoded, one line
    each, to ``path``."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=spm_model)
    write_lines(path, [sp.decode(p.split()) for p in pieces])


def score(hyp_path, ref_path):
    """sacreBLEU and chrF (default settings) of the hypotheses against the references, with signatures."""
    from sacrebleu.metrics import BLEU, CHRF

    hyps, refs = read_lines(hyp_path), read_lines(ref_path)
    bleu, chrf = BLEU(), CHRF()
    b, c = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return dict(bleu=round(b.score, 2), bleu_detail=str(b), bleu_signature=str(bleu.get_signature()),
                chrf=round(c.score, 2), chrf_signature=str(chrf.get_signature()))

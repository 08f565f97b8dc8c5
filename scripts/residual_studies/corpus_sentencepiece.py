"""Sentencepiece steps of the corpus preparation: one joint model trained on a per-language sample, applying
it, and fairseq's dictionary from its vocabulary.
"""
import os
import random

from .corpus_io import PrepError, chunks, info, iter_file_lines, iter_lines, open_in, open_out

def cmd_spm_train(args):
    import sentencepiece as spm

    rng = random.Random(args.seed)
    by_lang = {}
    for spec in args.input:
        lang, _, path = spec.partition(":")
        by_lang.setdefault(lang, []).append(path)
    sample_path = args.model_prefix + ".sample.txt"
    total = 0
    with open_out(sample_path) as out:
        for lang in sorted(by_lang):
            reservoir, seen = [], 0
            for line in iter_file_lines(by_lang[lang]):
                if not line.strip():
                    continue
                seen += 1
                if len(reservoir) < args.sample_per_lang:
                    reservoir.append(line)
                else:
                    j = rng.randrange(seen)
                    if j < args.sample_per_lang:
                        reservoir[j] = line
            out.write("".join(line + "\n" for line in reservoir))
            total += len(reservoir)
            info(f"spm sample [{lang}]: {len(reservoir)} of {seen} lines")
    info(f"training sentencepiece ({args.model_type}, vocab {args.vocab_size}) on {total} lines")
    try:
        spm.SentencePieceTrainer.train(
            input=sample_path, model_prefix=args.model_prefix, vocab_size=args.vocab_size,
            model_type=args.model_type, character_coverage=args.character_coverage,
            input_sentence_size=0, shuffle_input_sentence=True, num_threads=args.threads,
            minloglevel=2,
        )
    except RuntimeError as exc:
        raise PrepError(f"sentencepiece training failed: {exc}")
    if not args.keep_sample:
        os.remove(sample_path)


def cmd_spm_encode(args):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=args.model)
    n = 0
    with open_out(args.output) as out:
        for chunk in chunks(iter_file_lines([args.input]), 50000):
            pieces = sp.encode(chunk, out_type=str, num_threads=args.workers)
            out.write("".join(" ".join(p) + "\n" for p in pieces))
            n += len(chunk)
    info(f"spm-encode {os.path.basename(args.input)}: {n} lines")


FAIRSEQ_SPECIALS = {"<s>", "<pad>", "</s>", "<unk>"}


def cmd_spm_dict(args):
    n = 0
    with open_in(args.vocab) as src, open_out(args.output) as out:
        for line in iter_lines(src):
            piece = line.split("\t")[0]
            if not piece or piece in FAIRSEQ_SPECIALS or " " in piece:
                continue
            out.write(f"{piece} 1\n")
            n += 1
    info(f"spm-dict: {n} entries -> {args.output}")


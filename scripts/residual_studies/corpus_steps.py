"""Corpus preparation steps: the shared steps of scripts/prepare-{iwslt14,wmt14-en-de,opus100}.sh, and
their command line (``scripts/prepare_corpus.py``).

Standard library only (and the study library's error, :class:`.runner.ToolError`), no import of the plugin:
the shell scripts run a step as ``python scripts/prepare_corpus.py STEP ...`` (a fraction of a second per
step, where importing the plugin would load fairseq and torch each time). The steps live in
:mod:`.corpus_archive` (fetch, opus-pairs), :mod:`.corpus_text` (iwslt-train, segs, tokenize, lowercase,
clean, split-every) and :mod:`.corpus_sentencepiece` (spm-*), on the text files of :mod:`.corpus_io`.

One sub-command per step, so that the three shell scripts only wire steps together:

  fetch          find (or download) an archive, check it is a readable gzip/tar holding the
                 expected files, extract the wanted members
  iwslt-train    IWSLT train.tags filtering (drop <url>/<talkid>/<keywords> lines, strip
                 <title>/<description> tags), as fairseq's prepare-iwslt14.sh does with grep/sed
  segs           text of the <seg id=..> lines of an IWSLT .xml or WMT .sgm file
  tokenize       Moses punctuation normalisation, non-printing character removal, Moses
                 tokenisation (optionally aggressive hyphen splitting) and lower-casing (sacremoses)
  lowercase      lower-case a file (Moses lowercase.perl)
  clean          Moses clean-corpus-n.perl (length window and length ratio on a parallel corpus)
  split-every    every N-th line to one file, the rest to another (fairseq's awk NR%N split)
  opus-pairs     list the OPUS-100 pair folders to process
  spm-train      train one joint sentencepiece model on a per-language sample
  spm-encode     apply a sentencepiece model
  spm-dict       fairseq dictionary from a sentencepiece vocabulary
  check-deps     fail clearly when a Python module is missing

Files are read as UTF-8 (undecodable bytes replaced) and split on "\\n" only, like the Perl
and awk tools of the original recipes; "-" means stdin / stdout.
"""
import argparse
import sys

from .corpus_archive import cmd_fetch, cmd_opus_pairs
from .corpus_io import PrepError
from .corpus_sentencepiece import cmd_spm_dict, cmd_spm_encode, cmd_spm_train
from .corpus_text import cmd_clean, cmd_iwslt_train, cmd_lowercase, cmd_segs, cmd_split_every, cmd_tokenize


def cmd_check_deps(args):
    import importlib

    for module in args.modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise PrepError(f"Python module '{module}' is not importable by {sys.executable} "
                            f"({exc}); install it (pip install {args.pip.get(module, module)})")



def build_parser():
    p = argparse.ArgumentParser(prog="prepare_corpus.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("fetch", help="find/download, check and extract an archive")
    s.add_argument("--archives", required=True, help="folder holding the archives")
    s.add_argument("--name", required=True, help="archive file name")
    s.add_argument("--url", required=True, help="official download URL")
    s.add_argument("--dest", required=True, help="extraction folder")
    s.add_argument("--require", action="append", default=[],
                   help="member that must exist (a trailing '/' means: some file under it)")
    s.add_argument("--extract", action="append", default=[],
                   help="member or folder/ to extract (default: the --require ones)")
    s.add_argument("--offline", action="store_true", help="never download (also PREP_OFFLINE=1)")
    s.add_argument("--timeout", type=float, default=30.0, help="network timeout, seconds")
    s.add_argument("--hint", default="", help="extra line for the missing-archive message")
    s.set_defaults(func=cmd_fetch)

    s = sub.add_parser("iwslt-train", help="filter an IWSLT train.tags file")
    s.add_argument("-i", "--input", required=True)
    s.add_argument("-o", "--output", default="-")
    s.set_defaults(func=cmd_iwslt_train)

    s = sub.add_parser("segs", help="<seg> text of .xml/.sgm files (concatenated)")
    s.add_argument("-i", "--input", nargs="+", required=True)
    s.add_argument("-o", "--output", default="-")
    s.add_argument("--raw", action="store_true", help="strip and squeeze whitespace")
    s.set_defaults(func=cmd_segs)

    s = sub.add_parser("tokenize", help="Moses normalise/tokenise (sacremoses)")
    s.add_argument("--lang", required=True)
    s.add_argument("-i", "--input", nargs="+", default=["-"], help="files, concatenated")
    s.add_argument("-o", "--output", default="-")
    s.add_argument("--append", action="store_true")
    s.add_argument("-a", "--aggressive", action="store_true", help="split hyphens as @-@")
    s.add_argument("--norm-punct", action="store_true", help="normalize-punctuation.perl")
    s.add_argument("--remove-nonprint", action="store_true", help="remove-non-printing-char.perl")
    s.add_argument("--lower", action="store_true", help="lower-case the tokenised text")
    s.add_argument("--fix-apostrophe", action="store_true",
                   help="map U+2019 to ' before tokenising (fairseq does so on test sets)")
    s.add_argument("--workers", type=int, default=1)
    s.set_defaults(func=cmd_tokenize)

    s = sub.add_parser("lowercase", help="lower-case a file")
    s.add_argument("-i", "--input", required=True)
    s.add_argument("-o", "--output", default="-")
    s.set_defaults(func=cmd_lowercase)

    s = sub.add_parser("clean", help="clean-corpus-n.perl: CORPUS L1 L2 OUT")
    s.add_argument("--ratio", type=float, default=9.0)
    s.add_argument("--min", type=int, default=1)
    s.add_argument("--max", type=int, required=True)
    s.add_argument("corpus")
    s.add_argument("l1")
    s.add_argument("l2")
    s.add_argument("out")
    s.set_defaults(func=cmd_clean)

    s = sub.add_parser("split-every", help="every N-th line to --nth, others to --rest")
    s.add_argument("-n", type=int, required=True)
    s.add_argument("-i", "--input", required=True)
    s.add_argument("--nth", required=True)
    s.add_argument("--rest", required=True)
    s.set_defaults(func=cmd_split_every)

    s = sub.add_parser("opus-pairs", help="print 'folder lang' for the OPUS-100 pairs to use")
    s.add_argument("--root", help=".../opus-100-corpus/v1.0/supervised")
    s.add_argument("--pairs", default="", help="e.g. 'de,fr' or 'en-de de-en' (default: all)")
    s.add_argument("--langs-only", action="store_true",
                   help="only check --pairs and print its non-English languages")
    s.add_argument("--listing", help="the archive's member list (fetch writes it), to name the pairs it holds")
    s.set_defaults(func=cmd_opus_pairs)

    s = sub.add_parser("spm-train", help="joint sentencepiece model on a per-language sample")
    s.add_argument("--input", nargs="+", required=True, metavar="LANG:FILE")
    s.add_argument("--model-prefix", required=True)
    s.add_argument("--vocab-size", type=int, required=True)
    s.add_argument("--sample-per-lang", type=int, default=100000)
    s.add_argument("--model-type", default="unigram", choices=["unigram", "bpe"])
    s.add_argument("--character-coverage", type=float, default=0.9995)
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--keep-sample", action="store_true")
    s.set_defaults(func=cmd_spm_train)

    s = sub.add_parser("spm-encode", help="apply a sentencepiece model")
    s.add_argument("--model", required=True)
    s.add_argument("-i", "--input", required=True)
    s.add_argument("-o", "--output", default="-")
    s.add_argument("--workers", type=int, default=1)
    s.set_defaults(func=cmd_spm_encode)

    s = sub.add_parser("spm-dict", help="fairseq dict.txt from a sentencepiece .vocab")
    s.add_argument("--vocab", required=True)
    s.add_argument("-o", "--output", required=True)
    s.set_defaults(func=cmd_spm_dict)

    s = sub.add_parser("check-deps", help="fail clearly when a module is missing")
    s.add_argument("modules", nargs="+")
    s.set_defaults(func=cmd_check_deps,
                   pip={"subword_nmt": "subword-nmt", "sentencepiece": "sentencepiece"})
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except PrepError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 2
    except BrokenPipeError:
        return 1
    return 0

"""Corpus preparation steps: the shared steps of scripts/prepare-{iwslt14,wmt14-en-de,opus100}.sh.

Standard library only (and the study library's error, :class:`residual_studies.runner.ToolError`), no import
of the plugin: the shell scripts run this file directly (``python scripts/prepare_corpus.py STEP ...``, a
fraction of a second per step, where importing the plugin would load fairseq and torch each time).

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
import contextlib
import itertools
import os
import random
import re
import shutil
import sys
import tarfile
import time
import urllib.request
import zlib

from residual_studies.runner import ToolError

PROG = "corpus"


class PrepError(ToolError):
    """A preparation step that cannot go on, with a message meant for the user (printed as 'ERROR: ...',
    exit code 2)."""


def info(msg):
    print(f"[{PROG}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# text I/O


@contextlib.contextmanager
def open_in(path):
    if path == "-":
        stream = open(sys.stdin.fileno(), encoding="utf-8", errors="replace", newline="\n",
                      closefd=False)
    else:
        if not os.path.isfile(path):
            raise PrepError(f"input file not found: {path}")
        stream = open(path, encoding="utf-8", errors="replace", newline="\n")
    try:
        yield stream
    finally:
        stream.close()


@contextlib.contextmanager
def open_out(path, append=False):
    if path == "-":
        stream = open(sys.stdout.fileno(), "w", encoding="utf-8", newline="\n", closefd=False)
    else:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        stream = open(path, "a" if append else "w", encoding="utf-8", newline="\n")
    try:
        yield stream
    finally:
        stream.close()


def iter_lines(stream):
    """Lines without their trailing newline (Perl chomp); only "\\n" ends a line."""
    for line in stream:
        yield line[:-1] if line.endswith("\n") else line


def iter_file_lines(paths):
    for path in paths:
        with open_in(path) as stream:
            yield from iter_lines(stream)


# --------------------------------------------------------------------------------------------
# archives


def _offline(args):
    return args.offline or os.environ.get("PREP_OFFLINE", "") not in ("", "0")


def _missing_message(name, archives, url, reason, hint):
    msg = (f"archive '{name}' not found in {archives} ({reason}).\n"
           f"  Get it from {url}\n"
           f"  and put it in {archives} (or pass --archives DIR naming the folder that holds it).")
    if hint:
        msg += f"\n  {hint}"
    return msg


def _download(url, dest, timeout):
    part = dest + ".part"
    info(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0)
            done, last = 0, 0.0
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
                done += len(chunk)
                now = time.time()
                if now - last > 10:
                    pct = f" ({100 * done / total:.0f}%)" if total else ""
                    info(f"  {done / 2**20:.0f} MiB{pct}")
                    last = now
    except Exception as exc:  # network errors come in many types (URLError, timeout, OSError)
        with contextlib.suppress(OSError):
            os.remove(part)
        return f"{type(exc).__name__}: {exc}"
    os.replace(part, dest)
    info(f"saved {dest}")
    return None


def _norm_member(name):
    while name.startswith("./"):
        name = name[2:]
    return name


def _matches(name, patterns):
    """A pattern ending in '/' is a folder prefix; any other pattern is an exact path."""
    return any(name.startswith(p) if p.endswith("/") else name == p for p in patterns)


def _safe_target(dest, name):
    target = os.path.normpath(os.path.join(dest, name))
    root = os.path.normpath(dest)
    if os.path.isabs(name) or not target.startswith(root + os.sep):
        raise PrepError(f"refusing to extract '{name}' outside {dest}")
    return target


def cmd_fetch(args):
    archives = os.path.abspath(args.archives)
    path = os.path.join(archives, args.name)
    if not os.path.isfile(path):
        if _offline(args):
            raise PrepError(_missing_message(args.name, archives, args.url,
                                             "offline mode: not downloading", args.hint))
        os.makedirs(archives, exist_ok=True)
        error = _download(args.url, path, args.timeout)
        if error is not None:
            raise PrepError(_missing_message(args.name, archives, args.url,
                                             f"download failed, {error}", args.hint))

    require = [_norm_member(p) for p in args.require]
    extract = [_norm_member(p) for p in (args.extract or args.require)]
    stat = os.stat(path)
    stamp_key = f"{stat.st_size} {stat.st_mtime_ns} {sorted(extract)}"
    stamp = os.path.join(args.dest, f".{args.name}.extracted")
    on_disk = all(os.path.isfile(os.path.join(args.dest, p)) for p in extract if not p.endswith("/"))
    if os.path.isfile(stamp) and on_disk:
        with open(stamp, encoding="utf-8") as f:
            if f.read() == stamp_key:
                info(f"{args.name}: already extracted into {args.dest}")
                return

    malformed = (f"archive '{path}' is malformed: {{}}.\n"
                 f"  Delete it and download it again from {args.url}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if args.name.endswith((".tgz", ".tar.gz")) and magic[:2] != b"\x1f\x8b":
        kind = "an HTML page" if magic.lstrip()[:1] == b"<" else "something else"
        raise PrepError(malformed.format(f"not a gzip-compressed tar file (it looks like {kind})"))

    info(f"{args.name}: checking and extracting into {args.dest}")
    os.makedirs(args.dest, exist_ok=True)
    seen, extracted = set(), 0
    try:
        with tarfile.open(path, mode="r|*") as tar:
            for member in tar:
                name = _norm_member(member.name)
                seen.add(name)
                if not member.isfile() or not _matches(name, extract):
                    continue
                target = _safe_target(args.dest, name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                src = tar.extractfile(member)
                with open(target + ".part", "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                os.replace(target + ".part", target)
                extracted += 1
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise PrepError(malformed.format(f"not a readable tar archive or truncated ({exc})"))

    missing = [p for p in require
               if not (any(n.startswith(p) for n in seen) if p.endswith("/") else p in seen)]
    if missing:
        listing = "\n".join(f"    {m}" for m in missing)
        raise PrepError(f"archive '{path}' does not contain the expected file(s):\n{listing}\n"
                        f"  Is it the right archive? The recipe expects the one from {args.url}")
    info(f"{args.name}: extracted {extracted} file(s)")
    with open(stamp, "w", encoding="utf-8") as f:
        f.write(stamp_key)


# --------------------------------------------------------------------------------------------
# IWSLT / WMT text extraction

IWSLT_DROP = ("<url>", "<talkid>", "<keywords>")
IWSLT_STRIP = re.compile(r"</?(?:title|description)>")


def iwslt_train_line(line):
    """None for a dropped line, else the line with <title>/<description> tags removed."""
    if any(tag in line for tag in IWSLT_DROP):
        return None
    return IWSLT_STRIP.sub("", line)


def cmd_iwslt_train(args):
    kept = dropped = 0
    with open_in(args.input) as src, open_out(args.output) as out:
        for line in iter_lines(src):
            line = iwslt_train_line(line)
            if line is None:
                dropped += 1
                continue
            out.write(line + "\n")
            kept += 1
    info(f"iwslt-train {args.input}: kept {kept} lines, dropped {dropped} metadata lines")


SEG_OPEN = re.compile(r'<seg id="?[^">]*"?[^>]*>\s*')
SEG_CLOSE = re.compile(r"\s*</seg>\s*")
WS = re.compile(r"\s+")


def seg_text(line, raw=False):
    """Text of one '<seg id="N"> ... </seg>' line (fairseq's grep/sed), or None."""
    if "<seg id" not in line:
        return None
    text = SEG_CLOSE.sub("", SEG_OPEN.sub("", line))
    if raw:
        text = WS.sub(" ", text.strip())
    return text


def cmd_segs(args):
    with open_out(args.output) as out:
        for path in args.input:  # several files: their segments concatenated in this order
            n = 0
            with open_in(path) as src:
                for line in iter_lines(src):
                    text = seg_text(line, args.raw)
                    if text is not None:
                        out.write(text + "\n")
                        n += 1
            if n == 0:
                raise PrepError(f"no <seg id=...> lines in {path}")
            info(f"segs {os.path.basename(path)}: {n} segments")


# --------------------------------------------------------------------------------------------
# Moses-style normalisation / tokenisation (sacremoses)

_WORKER = {}


def _init_worker(opts):
    import regex  # installed with sacremoses
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    _WORKER["opts"] = opts
    _WORKER["tok"] = MosesTokenizer(lang=opts["lang"])
    # perl_parity: the exact substitutions of normalize-punctuation.perl (which maps a
    # stand-alone right single quote to a double quote), as used by fairseq's WMT recipe
    _WORKER["norm"] = (MosesPunctNormalizer(lang=opts["lang"], perl_parity=True)
                       if opts["norm_punct"] else None)
    # remove-non-printing-char.perl: s/\p{C}/ /g
    _WORKER["nonprint"] = regex.compile(r"\p{C}") if opts["remove_nonprint"] else None


def _process_line(line):
    opts = _WORKER["opts"]
    if opts["fix_apostrophe"]:  # fairseq's sed "s/\’/\'/g" on the test sets
        line = line.replace("\u2019", "'")
    if _WORKER["norm"] is not None:
        line = _WORKER["norm"].normalize(line)
    if _WORKER["nonprint"] is not None:
        line = _WORKER["nonprint"].sub(" ", line)
    line = _WORKER["tok"].tokenize(line, aggressive_dash_splits=opts["aggressive"],
                                   return_str=True, escape=True)
    if opts["lower"]:
        line = line.lower()
    return line


def _process_chunk(lines):
    return [_process_line(line) for line in lines]


def _chunks(lines, size):
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def cmd_tokenize(args):
    opts = dict(lang=args.lang, aggressive=args.aggressive, norm_punct=args.norm_punct,
                remove_nonprint=args.remove_nonprint, lower=args.lower,
                fix_apostrophe=args.fix_apostrophe)
    n = 0
    start = time.time()
    chunks = _chunks(iter_file_lines(args.input), 2000)
    with open_out(args.output, append=args.append) as out:
        if args.workers > 1:
            import multiprocessing

            import regex  # noqa: F401  (imported once here, inherited by the forked workers)
            import sacremoses  # noqa: F401

            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(args.workers, initializer=_init_worker, initargs=(opts,)) as pool:
                while True:  # bounded batches: Pool.imap would queue the whole corpus in memory
                    batch = list(itertools.islice(chunks, 4 * args.workers))
                    if not batch:
                        break
                    for result in pool.map(_process_chunk, batch):
                        out.write("".join(line + "\n" for line in result))
                        n += len(result)
        else:
            _init_worker(opts)
            for chunk in chunks:
                out.write("".join(line + "\n" for line in _process_chunk(chunk)))
                n += len(chunk)
    names = ", ".join(os.path.basename(p) for p in args.input)
    info(f"tokenize [{args.lang}] {names}: {n} lines in {time.time() - start:.1f}s")


def cmd_lowercase(args):
    with open_in(args.input) as src, open_out(args.output) as out:
        for line in iter_lines(src):
            out.write(line.lower() + "\n")


# --------------------------------------------------------------------------------------------
# corpus cleaning and splitting


def clean_pair(f, e, min_len, max_len, ratio, strip_bars=True, max_word_length=1000):
    """Moses clean-corpus-n.perl on one sentence pair: the cleaned pair, or None if dropped."""
    if strip_bars:
        f, e = f.replace("|", ""), e.replace("|", "")
    f, e = WS.sub(" ", f).strip(" "), WS.sub(" ", e).strip(" ")
    if not f or not e:
        return None
    fc, ec = len(f.split(" ")), len(e.split(" "))
    if ec > max_len or fc > max_len or ec < min_len or fc < min_len:
        return None
    if ratio is not None and (ec / fc > ratio or fc / ec > ratio):
        return None
    if any(len(w) > max_word_length for w in f.split(" ") + e.split(" ")):
        return None
    return f, e


def cmd_clean(args):
    f_in, e_in = f"{args.corpus}.{args.l1}", f"{args.corpus}.{args.l2}"
    n_in = n_out = 0
    with open_in(f_in) as fs, open_in(e_in) as es, \
            open_out(f"{args.out}.{args.l1}") as fo, open_out(f"{args.out}.{args.l2}") as eo:
        f_lines, e_lines = iter_lines(fs), iter_lines(es)
        strip_bars = None
        for f in f_lines:
            e = next(e_lines, None)
            if e is None:
                raise PrepError(f"{e_in} has fewer lines than {f_in}")
            n_in += 1
            if strip_bars is None:  # Moses: a '|' in the first pair means factored input
                strip_bars = "|" not in f and "|" not in e
            pair = clean_pair(f, e, args.min, args.max, args.ratio, strip_bars)
            if pair is not None:
                fo.write(pair[0] + "\n")
                eo.write(pair[1] + "\n")
                n_out += 1
        if next(e_lines, None) is not None:
            raise PrepError(f"{e_in} has more lines than {f_in}")
    info(f"clean {os.path.basename(args.corpus)} (ratio {args.ratio}, length {args.min}.."
         f"{args.max}): {n_in} -> {n_out} pairs")


def cmd_split_every(args):
    n = kept = taken = 0
    with open_in(args.input) as src, open_out(args.nth) as nth, open_out(args.rest) as rest:
        for line in iter_lines(src):
            n += 1
            if n % args.n == 0:
                nth.write(line + "\n")
                taken += 1
            else:
                rest.write(line + "\n")
                kept += 1
    info(f"split-every {args.n} {os.path.basename(args.input)}: {kept} + {taken} lines")


# --------------------------------------------------------------------------------------------
# OPUS-100 and sentencepiece


def _pair_lang(entry):
    """'de', 'en-de' or 'de-en' -> 'de'."""
    parts = entry.strip().split("-")
    others = [p for p in parts if p != "en"]
    if len(parts) > 2 or len(others) != 1 or not others[0]:
        raise PrepError(f"bad language pair '{entry}': use 'xx', 'en-xx' or 'xx-en'")
    return others[0]


def parse_pairs(text):
    return [_pair_lang(e) for e in re.split(r"[,\s]+", text or "") if e.strip()]


def cmd_opus_pairs(args):
    if args.langs_only:
        langs = list(dict.fromkeys(parse_pairs(args.pairs)))
        if not langs:
            raise PrepError("empty --pairs list")
        print(" ".join(langs))
        return
    root = args.root
    if not root:
        raise PrepError("opus-pairs needs --root")
    found = {}
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        parts = name.split("-")
        if len(parts) != 2 or "en" not in parts or parts[0] == parts[1]:
            continue
        lang = parts[1] if parts[0] == "en" else parts[0]
        if all(os.path.isfile(os.path.join(root, name, f"opus.{name}-train.{l}"))
               for l in ("en", lang)):
            found[lang] = name
    wanted = parse_pairs(args.pairs) if args.pairs else sorted(found)
    missing = [l for l in wanted if l not in found]
    if missing:
        raise PrepError(f"language pair(s) not in {root}: {', '.join('en-' + l for l in missing)}"
                        f"\n  available: {' '.join(sorted(found)) or '(none)'}")
    if not wanted:
        raise PrepError(f"no OPUS-100 pair folders (opus.xx-en-train.xx ...) under {root}")
    for lang in dict.fromkeys(wanted):
        name = found[lang]
        for split in ("dev", "test"):
            if not all(os.path.isfile(os.path.join(root, name, f"opus.{name}-{split}.{l}"))
                       for l in ("en", lang)):
                info(f"warning: {name} has no {split} set (train only)")
        print(f"{name} {lang}")


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
        for chunk in _chunks(iter_file_lines([args.input]), 50000):
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


def cmd_check_deps(args):
    import importlib

    for module in args.modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise PrepError(f"Python module '{module}' is not importable by {sys.executable} "
                            f"({exc}); install it (pip install {args.pip.get(module, module)})")


# --------------------------------------------------------------------------------------------


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


if __name__ == "__main__":
    sys.exit(main())

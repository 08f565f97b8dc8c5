"""Text steps of the corpus preparation: IWSLT train.tags filtering and <seg> extraction (fairseq's grep and
sed), Moses normalisation and tokenisation (sacremoses), lower-casing, Moses clean-corpus-n.perl and fairseq's
every-N-th-line split.
"""
import itertools
import os
import re
import time

from .corpus_io import PrepError, chunks, info, iter_file_lines, iter_lines, open_in, open_out

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


def cmd_tokenize(args):
    opts = dict(lang=args.lang, aggressive=args.aggressive, norm_punct=args.norm_punct,
                remove_nonprint=args.remove_nonprint, lower=args.lower,
                fix_apostrophe=args.fix_apostrophe)
    n = 0
    start = time.time()
    batches = chunks(iter_file_lines(args.input), 2000)
    with open_out(args.output, append=args.append) as out:
        if args.workers > 1:
            import multiprocessing

            import regex  # noqa: F401  (imported once here, inherited by the forked workers)
            import sacremoses  # noqa: F401

            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(args.workers, initializer=_init_worker, initargs=(opts,)) as pool:
                while True:  # bounded batches: Pool.imap would queue the whole corpus in memory
                    batch = list(itertools.islice(batches, 4 * args.workers))
                    if not batch:
                        break
                    for result in pool.map(_process_chunk, batch):
                        out.write("".join(line + "\n" for line in result))
                        n += len(result)
        else:
            _init_worker(opts)
            for chunk in batches:
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


"""BLEU of fairseq-generate output, the way each benchmark's literature reports it.

Used by ``scripts/evaluate.sh``; every score is computed with sacreBLEU's library and stored with
its sacreBLEU signature and a description of what was scored:

* ``iwslt14`` -- ``tokenized_bleu``: tokenized, lowercased BLEU (Transformer-Clinic / fairseq's
  examples/translation convention): the ``H-`` hypotheses of ``fairseq-generate --remove-bpe``
  against the ``T-`` references (the tokenized, lowercased test set with BPE removed), scored with
  sacreBLEU ``--tokenize none --lowercase`` (the same count as ``fairseq-score`` /
  ``multi-bleu.perl``, apart from sacreBLEU's smoothing of zero n-gram counts).
* ``wmt14`` -- two scores, labelled:
  ``tokenized_bleu_compound_split``: tokenized BLEU after splitting hyphenated compounds into
  ``a ##AT##-##AT## b`` on both sides, as fairseq's ``scripts/compound_split_bleu.sh`` does
  (case-sensitive, ``--tokenize none``); and ``sacrebleu``: detokenized sacreBLEU (13a, mixed
  case) of the hypotheses detokenized with sacremoses' Moses detokenizer against the raw
  newstest2014 reference text (never against the tokenized references).
  With ``--newstest-generate`` also ``sacrebleu_newstest2010_2016_avg``: the B2T protocol
  (github.com/takase/b2t_connection, README): each of newstest2010..2016 decoded separately,
  detokenized the same way and scored with sacreBLEU against that year's official reference
  (sacreBLEU's ``wmt14/full`` for 2014, ``wmt10`` .. ``wmt16`` otherwise, or plain-text copies of
  them in a local directory), reported per year (``newstest_per_year``) and as the unweighted mean
  of the seven years (:func:`newstest_average`).
* ``opus100`` -- sacreBLEU per direction (hypotheses already decoded by
  ``--remove-bpe sentencepiece``) against the raw OPUS-100 test references, tokenizer ``13a`` except
  ``zh`` for a Chinese target; ``sacrebleu_en_xx_avg`` / ``sacrebleu_xx_en_avg`` are the unweighted
  means over the directions out of / into English.

Usage (one direction / one generate file)::

    python scripts/score_bleu.py --benchmark wmt14 --generate gen.txt --target-lang de \\
        --raw-ref wmt14/raw/newstest2014.de --expect 3003 --out result.json

WMT14 with the newstest2010-2016 average (one generate file per year; references from a folder of
``newstestYYYY.de`` files, or ``sacrebleu`` to take sacreBLEU's own test sets when online)::

    python scripts/score_bleu.py --benchmark wmt14 --generate gen-test.txt --target-lang de \\
        --raw-ref wmt14/raw/newstest2014.de --newstest-refs wmt14/raw \\
        --newstest-generate 2010=gen-2010.txt 2011=gen-2011.txt ... 2016=gen-2016.txt --out result.json
"""
import argparse
import json
import math
import os
import re
import sys

from sacrebleu.metrics import BLEU

from .logs import read_generate

BENCHMARKS = ("iwslt14", "wmt14", "opus100")

#: fairseq's compound_split_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
COMPOUND = re.compile(r"(\S)-(\S)")

#: sacreBLEU tokenizer per target language for OPUS-100 (13a otherwise)
OPUS_TOKENIZE = {"zh": "zh"}


#: newstest years of the B2T protocol (github.com/takase/b2t_connection): sacreBLEU per year and
#: the unweighted mean of the seven
NEWSTEST_YEARS = tuple(range(2010, 2017))
#: sacreBLEU test set holding each year's official reference; 2014 is wmt14/full, the 3003-sentence
#: newstest2014 of test-full.tgz (B2T: ``sacrebleu -t wmt14/full -l en-de``), not wmt14's filtered
#: 2737-sentence version
SACREBLEU_TESTSET = {2010: "wmt10", 2011: "wmt11", 2012: "wmt12", 2013: "wmt13",
                     2014: "wmt14/full", 2015: "wmt15", 2016: "wmt16"}


class GenerateOutputError(ValueError):
    """fairseq-generate output that cannot be scored (missing or dropped sentences)."""


class MissingReferenceError(FileNotFoundError):
    """A newstest year whose reference is neither in the reference folder nor available from
    sacreBLEU."""


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def ordered(gen, expect=None, path="", fill_missing=False):
    """Hypotheses and T- references as lists ordered by sentence id.

    Args:
        gen: ``read_generate`` output.
        expect: number of sentences in the test set; every id 0..expect-1 must have a hypothesis
            unless ``fill_missing``.
        fill_missing: give sentences without a hypothesis (skipped by fairseq-generate's
            ``--skip-invalid-size-inputs-valid-test``) an empty one.

    Returns:
        (hyps, refs, missing ids); refs has None where the T- line is missing.

    Raises:
        GenerateOutputError: hypotheses missing without ``fill_missing``.
    """
    n = expect if expect is not None else (max(gen["hyps"], default=-1) + 1)
    missing = [i for i in range(n) if i not in gen["hyps"]]
    extra = [i for i in gen["hyps"] if i >= n]
    if extra:
        raise GenerateOutputError(
            f"{path}: hypothesis ids up to {max(extra)} but the test set has {n} sentences: the "
            f"generate output does not belong to this test set"
        )
    if missing and not fill_missing:
        raise GenerateOutputError(
            f"{path}: {len(missing)} of {n} sentences have no hypothesis (e.g. ids {missing[:5]}). "
            f"fairseq drops the last batch unless its size is a multiple of "
            f"--required-batch-size-multiple: generate with --required-batch-size-multiple 1 "
            f"(scripts/evaluate.sh does)"
        )
    hyps = [gen["hyps"].get(i, "") for i in range(n)]
    refs = [gen["refs"].get(i) for i in range(n)]
    return hyps, refs, missing


def _score(metric, hyps, refs, description):
    result = metric.corpus_score(hyps, [refs])
    return {
        "score": float(result.score),
        "signature": str(metric.get_signature()),
        "description": description,
        "bp": float(result.bp),
        "sys_len": int(result.sys_len),
        "ref_len": int(result.ref_len),
    }


def tokenized_bleu(hyps, refs, lowercase=True):
    """Tokenized BLEU: sacreBLEU with ``--tokenize none`` on already tokenized text."""
    metric = BLEU(tokenize="none", lowercase=lowercase, force=True)
    case = "lowercased" if lowercase else "case-sensitive"
    return _score(metric, hyps, refs, f"tokenized {case} BLEU (sacreBLEU --tokenize none) on "
                  f"fairseq-generate --remove-bpe hypotheses vs the tokenized references")


def compound_split(line):
    """``a-b`` -> ``a ##AT##-##AT## b`` (fairseq's scripts/compound_split_bleu.sh)."""
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def compound_split_bleu(hyps, refs):
    """Tokenized, case-sensitive BLEU after compound splitting (WMT14 En-De convention)."""
    metric = BLEU(tokenize="none", force=True)
    out = _score(metric, [compound_split(h) for h in hyps], [compound_split(r) for r in refs],
                 "tokenized case-sensitive BLEU with compound splitting (##AT##-##AT##, as fairseq's "
                 "scripts/compound_split_bleu.sh), sacreBLEU --tokenize none")
    return out


def detokenize(lines, lang):
    """Moses-detokenize tokenized hypotheses (sacremoses; also undoes @-@ and &amp; escapes)."""
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=lang)
    return [md.detokenize(line.split()) for line in lines]


def detok_sacrebleu(hyps_detok, raw_refs, tokenize="13a"):
    """sacreBLEU of detokenized hypotheses against raw reference text."""
    metric = BLEU(tokenize=tokenize)
    return _score(metric, hyps_detok, raw_refs,
                  "detokenized sacreBLEU against the raw reference text")


def _check_refs(refs, path):
    if any(r is None for r in refs):
        raise GenerateOutputError(f"{path}: T- reference lines are missing for some sentences")


def score_bilingual(benchmark, generate, target_lang, raw_ref=None, expect=None):
    """Scores of one IWSLT14 or WMT14 generate file (see the module docstring)."""
    gen = read_generate(generate)
    hyps, refs, _ = ordered(gen, expect, generate)
    _check_refs(refs, generate)
    metrics = {}
    if benchmark == "iwslt14":
        metrics["tokenized_bleu"] = tokenized_bleu(hyps, refs, lowercase=True)
        primary = "tokenized_bleu"
    else:
        metrics["tokenized_bleu_compound_split"] = compound_split_bleu(hyps, refs)
        if raw_ref is None:
            raise GenerateOutputError(
                "wmt14 needs --raw-ref (the detokenized newstest2014 reference, e.g. "
                "wmt14_en_de/raw/newstest2014.de from scripts/prepare-wmt14-en-de.sh): sacreBLEU "
                "must not be computed against tokenized references"
            )
        raw = read_lines(raw_ref)
        if len(raw) != len(hyps):
            raise GenerateOutputError(
                f"{raw_ref} has {len(raw)} lines but the test set has {len(hyps)} sentences"
            )
        metrics["sacrebleu"] = detok_sacrebleu(detokenize(hyps, target_lang), raw)
        metrics["sacrebleu"]["description"] += f" {os.path.basename(raw_ref)} (sacremoses detok)"
        primary = "sacrebleu"
    out = {"metrics": metrics, "primary_metric": primary, "num_sentences": len(hyps),
           "fairseq_generate_bleu": gen["bleu_line"]}
    return out


def newstest_metric_name(years):
    """``sacrebleu_newstest2010_2016_avg`` for 2010..2016 (a contiguous range of years)."""
    years = sorted(years)
    if not years or years != list(range(years[0], years[-1] + 1)):
        raise ValueError(f"newstest years must be a contiguous range, got {years}")
    return f"sacrebleu_newstest{years[0]}_{years[-1]}_avg"


def _how_to_get(year, source_lang, target_lang, path):
    testset = SACREBLEU_TESTSET.get(year, f"wmt{year % 100}")
    return (f"on an online machine run `sacrebleu -t {testset} -l {source_lang}-{target_lang} "
            f"--echo ref > {path}` (or scripts/prepare-wmt14-en-de.sh --newstest-years "
            f"{NEWSTEST_YEARS[0]}-{NEWSTEST_YEARS[-1]}, which writes OUT/raw/newstestYYYY."
            f"{target_lang})")


def sacrebleu_reference(year, source_lang="en", target_lang="de"):
    """The reference lines of newstest``year`` from sacreBLEU's own test set (downloaded into
    ``~/.sacrebleu`` by sacreBLEU when not cached; needs the network then).

    Returns:
        (lines, description of the source)
    """
    from sacrebleu import DATASETS

    testset = SACREBLEU_TESTSET.get(year)
    langpair = f"{source_lang}-{target_lang}"
    if testset not in DATASETS or langpair not in DATASETS[testset].langpairs:
        raise MissingReferenceError(f"newstest{year}: sacreBLEU has no {langpair} test set for it")
    try:
        files = DATASETS[testset].get_reference_files(langpair)
    except Exception as e:  # noqa: BLE001 (offline: urllib errors, sacreBLEU's own)
        raise MissingReferenceError(
            f"newstest{year}: no reference folder given and sacreBLEU could not get its test set "
            f"{testset} {langpair} ({type(e).__name__}: {e}). Offline, pass a folder holding "
            f"newstest{year}.{target_lang}: " + _how_to_get(year, source_lang, target_lang,
                                                              f"newstest{year}.{target_lang}")
        ) from e
    return read_lines(files[0]), f"sacreBLEU -t {testset} -l {langpair}"


def newstest_reference(year, ref_dir=None, source_lang="en", target_lang="de"):
    """Reference lines of newstest``year``: ``ref_dir/newstestYYYY.<target_lang>`` (plain text, one
    segment per line), or sacreBLEU's test set when ``ref_dir`` is None.

    Returns:
        (lines, description of the source)

    Raises:
        MissingReferenceError: the file is not in ``ref_dir`` (naming the year, the file and how
            to get it), or, without ``ref_dir``, sacreBLEU cannot provide it (offline).
    """
    if ref_dir is None:
        return sacrebleu_reference(year, source_lang, target_lang)
    path = os.path.join(ref_dir, f"newstest{year}.{target_lang}")
    if not os.path.isfile(path):
        raise MissingReferenceError(
            f"newstest{year}: reference {path} not found; the newstest average needs every year "
            f"{NEWSTEST_YEARS[0]}-{NEWSTEST_YEARS[-1]} and is never taken over fewer. To get it, "
            + _how_to_get(year, source_lang, target_lang, path)
        )
    return read_lines(path), path


def newstest_average(generate, target_lang="de", source_lang="en", ref_dir=None,
                     years=NEWSTEST_YEARS, reference=newstest_reference):
    """sacreBLEU per newstest year and their unweighted mean (the B2T protocol).

    Each year's ``H-`` hypotheses (fairseq-generate ``--remove-bpe`` output) are Moses-detokenized
    with sacremoses (as for the ``sacrebleu`` metric) and scored with sacreBLEU (13a, mixed case)
    against that year's raw official reference.

    Args:
        generate: {year (int): fairseq-generate output file}; every year of ``years`` is needed.
        ref_dir: folder of plain-text references ``newstestYYYY.<target_lang>``; None: sacreBLEU's
            own test sets (wmt10 .. wmt16, wmt14/full for 2014; needs the network unless cached).
        years: the years to average (default 2010..2016).
        reference: ``(year, ref_dir, source_lang, target_lang) -> (lines, source)``.

    Returns:
        (metrics, per_year): ``{"sacrebleu_newstest2010_2016_avg": {...}}`` and
        ``{"newstest2010": {score, signature, description, ...}, ...}``.

    Raises:
        GenerateOutputError: a year without generate output, or output not matching its test set.
        MissingReferenceError: references of one or more years not found (all of them named).
    """
    years = sorted(int(y) for y in years)
    name = newstest_metric_name(years)
    generate = {int(y): path for y, path in generate.items()}
    no_gen = [y for y in years if y not in generate]
    if no_gen:
        raise GenerateOutputError(
            f"{name}: no generate output for " + ", ".join(f"newstest{y}" for y in no_gen)
            + "; the average is never taken over fewer years"
        )
    extra = sorted(set(generate) - set(years))
    if extra:
        raise GenerateOutputError(f"{name}: generate output for years outside {years}: {extra}")
    refs, errors = {}, []
    for y in years:  # every reference first: one error naming every missing year
        try:
            refs[y] = reference(y, ref_dir, source_lang, target_lang)
        except MissingReferenceError as e:
            errors.append(str(e))
    if errors:
        raise MissingReferenceError("\n".join(errors))
    per_year = {}
    for y in years:
        raw, source = refs[y]
        gen = read_generate(generate[y])
        hyps, _, _ = ordered(gen, len(raw), generate[y])
        res = detok_sacrebleu(detokenize(hyps, target_lang), raw)
        res["description"] = (f"detokenized sacreBLEU of newstest{y} (sacremoses detok) against "
                              f"its official reference ({source})")
        res["num_sentences"] = len(raw)
        res["generate"] = generate[y]
        per_year[f"newstest{y}"] = res
    scores = [v["score"] for v in per_year.values()]
    signatures = sorted({v["signature"] for v in per_year.values()})
    metrics = {name: {
        "score": sum(scores) / len(scores),
        "signature": f"unweighted mean over {len(years)} years of sacreBLEU {' / '.join(signatures)}",
        "description": (f"sacreBLEU averaged over newstest{years[0]}-{years[-1]}, B2T protocol "
                        f"(github.com/takase/b2t_connection: each year decoded separately, Moses "
                        f"detokenized, sacreBLEU against the official reference; per year in "
                        f"newstest_per_year)"),
        "years": years,
    }}
    return metrics, per_year


def score_direction(generate, src, tgt, raw_ref=None, expect=None):
    """sacreBLEU of one OPUS-100 direction; raw reference text when given, else the T- lines."""
    gen = read_generate(generate)
    if raw_ref is not None:
        raw = read_lines(raw_ref)
        n = len(raw) if expect is None else expect
        if len(raw) != n:
            raise GenerateOutputError(f"{raw_ref} has {len(raw)} lines, the test set {n}")
        hyps, _, missing = ordered(gen, n, generate, fill_missing=True)
        refs = raw
    else:
        hyps, refs, missing = ordered(gen, expect, generate, fill_missing=True)
        keep = [i for i, r in enumerate(refs) if r is not None]
        hyps, refs = [hyps[i] for i in keep], [refs[i] for i in keep]
    tokenize = OPUS_TOKENIZE.get(tgt, "13a")
    result = _score(BLEU(tokenize=tokenize), hyps, refs,
                    f"sacreBLEU {src}->{tgt} against "
                    + ("the raw reference" if raw_ref else "the T- lines (no raw reference given)"))
    result["num_sentences"] = len(hyps)
    result["missing"] = len(missing)
    return result


def opus_averages(per_direction):
    """Unweighted mean sacreBLEU over en->xx and over xx->en directions."""
    out_en = [v["score"] for k, v in per_direction.items() if k.split("-")[0] == "en"]
    into_en = [v["score"] for k, v in per_direction.items() if k.split("-")[1] == "en"]
    metrics = {}
    for key, vals, what in (("sacrebleu_en_xx_avg", out_en, "en->xx"),
                            ("sacrebleu_xx_en_avg", into_en, "xx->en")):
        if vals:
            metrics[key] = {
                "score": sum(vals) / len(vals),
                "signature": "mean of per-direction sacreBLEU (see per_direction)",
                "description": f"unweighted mean sacreBLEU over {len(vals)} {what} directions",
                "directions": len(vals),
            }
    return metrics


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmark", choices=BENCHMARKS, required=True)
    parser.add_argument("--generate", nargs="+", required=True,
                        help="fairseq-generate output; for opus100 one file per direction, each "
                        "named with SRC-TGT matching --directions order")
    parser.add_argument("--target-lang", help="target language (iwslt14 / wmt14; for detok)")
    parser.add_argument("--raw-ref", nargs="*", default=None,
                        help="raw reference text: wmt14 one file; opus100 one per direction "
                        "('-' for none)")
    parser.add_argument("--directions", nargs="*", help="opus100: SRC-TGT per --generate file")
    parser.add_argument("--expect", type=int, nargs="*", default=None,
                        help="number of test sentences (per --generate file)")
    parser.add_argument("--newstest-generate", nargs="+", default=None, metavar="YEAR=FILE",
                        help="wmt14: fairseq-generate output of each newstest year (2010..2016, "
                        "e.g. 2010=gen-newstest2010.txt): adds sacreBLEU per year and its average "
                        "over the years (B2T protocol), which becomes the primary metric")
    parser.add_argument("--newstest-refs", default=None, metavar="DIR|sacrebleu",
                        help="with --newstest-generate: folder of the raw references "
                        "newstestYYYY.<target-lang>, or 'sacrebleu' for sacreBLEU's own test "
                        "sets (needs the network unless cached)")
    parser.add_argument("--meta", default=None, help="JSON object merged into the output")
    parser.add_argument("--out", required=True, help="result JSON")
    args = parser.parse_args(argv)

    expect = args.expect or [None] * len(args.generate)
    if len(expect) != len(args.generate):
        parser.error("--expect needs one number per --generate file")
    if args.benchmark in ("iwslt14", "wmt14"):
        if len(args.generate) != 1:
            parser.error(f"{args.benchmark}: one --generate file")
        raw = args.raw_ref[0] if args.raw_ref else None
        result = score_bilingual(args.benchmark, args.generate[0], args.target_lang, raw, expect[0])
        if args.newstest_generate:
            if args.benchmark != "wmt14":
                parser.error("--newstest-generate is for wmt14")
            if not args.newstest_refs:
                parser.error("--newstest-generate needs --newstest-refs DIR (or 'sacrebleu')")
            gens = {}
            for item in args.newstest_generate:
                year, sep, path = item.partition("=")
                year = year.removeprefix("newstest")
                if not sep or not year.isdigit() or not path:
                    parser.error(f"--newstest-generate takes YEAR=FILE, got '{item}'")
                gens[int(year)] = path
            refs = None if args.newstest_refs == "sacrebleu" else args.newstest_refs
            metrics, per_year = newstest_average(gens, args.target_lang or "de",
                                                 ref_dir=refs)
            result["metrics"].update(metrics)
            result["newstest_per_year"] = per_year
            result["primary_metric"] = next(iter(metrics))
    else:
        dirs = args.directions or []
        if len(dirs) != len(args.generate):
            parser.error("opus100: --directions needs one SRC-TGT per --generate file")
        raws = args.raw_ref or ["-"] * len(dirs)
        if len(raws) != len(dirs):
            parser.error("opus100: --raw-ref needs one file (or '-') per direction")
        per = {}
        for d, g, r, e in zip(dirs, args.generate, raws, expect):
            src, tgt = d.split("-")
            per[d] = score_direction(g, src, tgt, None if r == "-" else r, e)
        metrics = opus_averages(per)
        result = {"metrics": metrics, "primary_metric": "sacrebleu_en_xx_avg" if
                  "sacrebleu_en_xx_avg" in metrics else "sacrebleu_xx_en_avg",
                  "per_direction": per,
                  "num_sentences": sum(v["num_sentences"] for v in per.values()),
                  "missing": sum(v["missing"] for v in per.values())}
        if result["missing"]:
            print(f"score_bleu.py: WARNING: {result['missing']} sentences had no hypothesis "
                  f"(skipped as too long) and count as empty", file=sys.stderr)
    if args.meta:
        meta = json.loads(args.meta)
        meta.update(result)
        result = meta
    for name, m in result["metrics"].items():
        if not math.isfinite(m["score"]):
            raise GenerateOutputError(f"{name} is not finite")
        print(f"{name}: {m['score']:.2f}  ({m['signature']})")
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, args.out)
    return result


def cli():
    """``scripts/score_bleu.py``: :func:`main`, its errors as one line."""
    try:
        main()
    except (GenerateOutputError, FileNotFoundError) as e:
        sys.exit(f"score_bleu.py: error: {e}")


if __name__ == "__main__":
    cli()

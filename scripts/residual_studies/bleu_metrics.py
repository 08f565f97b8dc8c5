"""The BLEU metrics of the benchmarks, on sacreBLEU's library: fairseq-generate hypotheses and ``T-``
references in sentence order (:func:`ordered`), tokenized BLEU (plain and with fairseq's compound splitting),
detokenized sacreBLEU against raw references, and the B2T protocol's sacreBLEU averaged over newstest2010-2016
(:func:`newstest_average`, with the official references from a folder or from sacreBLEU). :mod:`.bleu`
scores each benchmark with them.
"""
import os
import re

from sacrebleu.metrics import BLEU

from .logs import read_generate
from .runner import ToolError

#: fairseq's compound_split_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
COMPOUND = re.compile(r"(\S)-(\S)")

#: newstest years of the B2T protocol (github.com/takase/b2t_connection): sacreBLEU per year and
#: the unweighted mean of the seven
NEWSTEST_YEARS = tuple(range(2010, 2017))
#: sacreBLEU test set holding each year's official reference; 2014 is wmt14/full, the 3003-sentence
#: newstest2014 of test-full.tgz (B2T: ``sacrebleu -t wmt14/full -l en-de``), not wmt14's filtered
#: 2737-sentence version
SACREBLEU_TESTSET = {2010: "wmt10", 2011: "wmt11", 2012: "wmt12", 2013: "wmt13",
                     2014: "wmt14/full", 2015: "wmt15", 2016: "wmt16"}


class GenerateOutputError(ToolError):
    """fairseq-generate output that cannot be scored (missing or dropped sentences)."""


class MissingReferenceError(ToolError):
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


def metric_score(metric, hyps, refs, description):
    """A sacreBLEU ``metric`` of ``hyps`` against one reference per line: score, signature, ``description``,
    brevity penalty and lengths."""
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
    return metric_score(metric, hyps, refs, f"tokenized {case} BLEU (sacreBLEU --tokenize none) on "
                  f"fairseq-generate --remove-bpe hypotheses vs the tokenized references")


def compound_split(line):
    """``a-b`` -> ``a ##AT##-##AT## b`` (fairseq's scripts/compound_split_bleu.sh)."""
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def compound_split_bleu(hyps, refs):
    """Tokenized, case-sensitive BLEU after compound splitting (WMT14 En-De convention)."""
    metric = BLEU(tokenize="none", force=True)
    out = metric_score(metric, [compound_split(h) for h in hyps], [compound_split(r) for r in refs],
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
    return metric_score(metric, hyps_detok, raw_refs,
                  "detokenized sacreBLEU against the raw reference text")


def check_refs(refs, path):
    if any(r is None for r in refs):
        raise GenerateOutputError(f"{path}: T- reference lines are missing for some sentences")


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

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
import sys

from sacrebleu.metrics import BLEU

from .bleu_metrics import (GenerateOutputError, check_refs, compound_split_bleu, detok_sacrebleu, detokenize,
                           metric_score, newstest_average, ordered, read_lines, tokenized_bleu)
from .logs import read_generate
from .runner import ToolError

BENCHMARKS = ("iwslt14", "wmt14", "opus100")

#: sacreBLEU tokenizer per target language for OPUS-100 (13a otherwise)
OPUS_TOKENIZE = {"zh": "zh"}


def score_bilingual(benchmark, generate, target_lang, raw_ref=None, expect=None):
    """Scores of one IWSLT14 or WMT14 generate file (see the module docstring)."""
    gen = read_generate(generate)
    hyps, refs, _ = ordered(gen, expect, generate)
    check_refs(refs, generate)
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
    result = metric_score(BLEU(tokenize=tokenize), hyps, refs,
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
    except (ToolError, FileNotFoundError) as e:  # GenerateOutputError, MissingReferenceError; a missing file
        sys.exit(f"score_bleu.py: error: {e}")


if __name__ == "__main__":
    cli()

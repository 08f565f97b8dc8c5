"""Build a small German-English sentence corpus from the Ding dictionary.

Source: the Debian package ``trans-de-en`` (version 1.9-6), which ships the
Ding dictionary of TU Chemnitz (https://dict.tu-chemnitz.de/, GPL-2+) as the
text file ``usr/share/trans/de-en``. Each non-comment line has the form::

    DE-1 | DE-2 | ... :: EN-1 | EN-2 | ...

where the ``|``-separated sub-entries are aligned by position. Many sub-entries
are example sentences; this script extracts those and writes a parallel corpus
with train/valid/test splits. The corpus files are derived from GPL-2+ data and
keep that license.

Pipeline (all deterministic, stdlib only):

1. Read the text, either from the ``.deb`` (an ``ar`` archive whose
   ``data.tar.{xz,gz,bz2}`` member holds ``usr/share/trans/de-en``) or from the
   already extracted ``de-en`` file.
2. For every entry whose two sides have the same number of sub-entries, pair
   sub-entry *i* of the German side with sub-entry *i* of the English side.
   Entries with a different number of sub-entries per side are skipped.
3. In each sub-entry, remove bracketed annotations ``[...]`` and ``{...}``,
   NFC-normalise, and collapse whitespace.
4. Reject a pair if either side still contains ``/``, ``;`` or ``(``
   (alternatives / parenthesised variants) or a stray bracket, or if either
   side is not a sentence: it must end in ``.``, ``?`` or ``!``, start with an
   upper-case letter or an opening quote, and have at least 3 words.
5. Deduplicate: drop exact duplicate pairs, then keep only the first English
   translation (in file order) of each German sentence, so that every German
   source line is unique in the corpus.
6. Split: union-find groups pairs that share a German or an English sentence
   (compared after case-folding and removing punctuation, so near-duplicates
   such as "..., but ..." / "... but ..." are grouped too). Whole groups are
   assigned to a split, so no sentence (of either language) occurs in two
   splits. Groups are visited in the order of a salted SHA-256 of their
   content; test and valid are filled first-fit up to their target sizes and
   everything else goes to train. Within each split, lines are ordered by a
   differently salted SHA-256 of the pair (so line order is independent of
   the split assignment), so any prefix of a file is a fair sample.
7. Write ``{train,valid,test}.{de,en}`` (UTF-8, ``\\n`` line ends) and print
   counts and SHA-256 sums.

Example::

    apt-get download trans-de-en
    python scripts/build_ding_corpus.py trans-de-en_1.9-6_all.deb data/ding-de-en
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import unicodedata
from collections import Counter
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from .data import SPLITS
from .ding_input import DING_MEMBER, FIX_HINT, CorpusInputError, read_ding_text

Pair = Tuple[str, str]

#: Default salt for the split hash; changing it gives a different split.
DEFAULT_SEED = "ding-de-en-v1"
LANGS = ("de", "en")

_BRACKETS = re.compile(r"\[[^\[\]]*\]|\{[^{}]*\}")
_ALTERNATIVE_CHARS = ("/", ";", "(")
_STRAY_BRACKETS = ("[", "]", "{", "}", ")")
_SENTENCE_END = (".", "?", "!")
#: Characters accepted as an opening quote at the start of a sentence.
OPENING_QUOTES = "\"'„“‚‘»«"
_MIN_WORDS = 3


# --------------------------------------------------------------------------
# Filtering
# --------------------------------------------------------------------------

def iter_entries(text: str) -> Iterator[Tuple[int, List[str], List[str]]]:
    """Yield ``(line_number, german_subentries, english_subentries)``.

    Comment lines (``#``), blank lines and lines without exactly one
    ``' :: '`` separator are skipped.
    """
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        if line.count(" :: ") != 1:
            continue
        de, en = line.split(" :: ")
        yield (lineno, [s.strip() for s in de.split("|")],
               [s.strip() for s in en.split("|")])


def clean(text: str) -> str:
    """Remove ``[...]`` and ``{...}`` annotations; normalise Unicode/whitespace."""
    text = unicodedata.normalize("NFC", text)
    text = _BRACKETS.sub(" ", text)
    return " ".join(text.split())


def has_alternatives(text: str) -> bool:
    """True if *text* contains ``/``, ``;`` or ``(`` (alternative variants)."""
    return any(c in text for c in _ALTERNATIVE_CHARS)


def is_sentence(text: str) -> bool:
    """True if *text* looks like a full sentence.

    It must end in ``.``, ``?`` or ``!``, start with an upper-case letter or an
    opening quote (see :data:`OPENING_QUOTES`) and have at least 3
    whitespace-separated words.
    """
    if not text or not text.endswith(_SENTENCE_END):
        return False
    if not (text[0].isupper() or text[0] in OPENING_QUOTES):
        return False
    return len(text.split()) >= _MIN_WORDS


def reject_reason(text: str) -> Optional[str]:
    """Return why a cleaned sub-entry is rejected, or ``None`` if it is kept."""
    if not text:
        return "empty"
    if has_alternatives(text):
        return "alternatives"
    if any(c in text for c in _STRAY_BRACKETS):
        return "stray_bracket"
    if not is_sentence(text):
        return "not_sentence"
    return None


def extract_pairs(text: str, stats: Optional[Counter] = None) -> List[Pair]:
    """Extract aligned sentence pairs (in file order, duplicates included).

    *stats*, if given, is updated with counts of entries and rejections.
    """
    if stats is None:
        stats = Counter()
    pairs: List[Pair] = []
    for _lineno, de_subs, en_subs in iter_entries(text):
        stats["entries"] += 1
        if len(de_subs) != len(en_subs):
            stats["entries_misaligned"] += 1
            continue
        for de_raw, en_raw in zip(de_subs, en_subs):
            stats["subentry_pairs"] += 1
            de, en = clean(de_raw), clean(en_raw)
            reason = reject_reason(de) or reject_reason(en)
            if reason is not None:
                stats["rejected_" + reason] += 1
                continue
            pairs.append((de, en))
    stats["candidate_pairs"] = len(pairs)
    return pairs


def deduplicate(pairs: Iterable[Pair], stats: Optional[Counter] = None) -> List[Pair]:
    """Drop exact duplicate pairs and keep one English per German sentence.

    The first occurrence in input order wins (Ding lists its main translation
    first). Different German sentences may still share an English sentence;
    :func:`split_pairs` keeps such pairs in the same split.
    """
    if stats is None:
        stats = Counter()
    seen_pairs = set()
    seen_de = set()
    out: List[Pair] = []
    for pair in pairs:
        if pair in seen_pairs:
            stats["dropped_duplicate_pair"] += 1
            continue
        seen_pairs.add(pair)
        if pair[0] in seen_de:
            stats["dropped_german_variant"] += 1
            continue
        seen_de.add(pair[0])
        out.append(pair)
    return out


# --------------------------------------------------------------------------
# Splitting
# --------------------------------------------------------------------------

_NON_WORD = re.compile(r"[\W_]+")


def match_key(text: str) -> str:
    """Key under which two sentences count as "the same" for splitting.

    Case-folded, with every run of non-alphanumeric characters (punctuation,
    quotes, apostrophes, whitespace) replaced by one space.
    """
    return " ".join(_NON_WORD.sub(" ", text.casefold()).split())


class UnionFind:
    """Minimal union-find (disjoint set) over ``0 .. n-1``."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        """Return the representative of *x* (with path halving)."""
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        """Merge the sets containing *a* and *b*."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def components(pairs: Sequence[Pair]) -> List[List[int]]:
    """Group pair indices that share a German or an English sentence.

    Sentences are compared by :func:`match_key`. Returns the groups (each a
    sorted list of indices), ordered by their smallest index.
    """
    uf = UnionFind(len(pairs))
    first_owner: Dict[Tuple[str, str], int] = {}
    for i, (de, en) in enumerate(pairs):
        for key in (("de", match_key(de)), ("en", match_key(en))):
            if key in first_owner:
                uf.union(first_owner[key], i)
            else:
                first_owner[key] = i
    groups: Dict[int, List[int]] = {}
    for i in range(len(pairs)):
        groups.setdefault(uf.find(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def _stable_hash(seed: str, text: str) -> str:
    """Salted SHA-256 hex digest, independent of PYTHONHASHSEED/platform."""
    return hashlib.sha256(f"{seed}\n{text}".encode("utf-8")).hexdigest()


def split_pairs(pairs: Sequence[Pair], valid_size: int = 1000,
                test_size: int = 1000, seed: str = DEFAULT_SEED
                ) -> Dict[str, List[Pair]]:
    """Split *pairs* into train/valid/test without sentence overlap.

    Whole :func:`components` are assigned to one split. Components are visited
    in order of the SHA-256 of ``seed + ":split"`` and their sorted
    ``de\\ten`` lines; each goes to test if it still fits into *test_size*,
    else to valid if it fits into *valid_size*, else to train. Each split is
    then ordered by the SHA-256 of ``seed + ":order"`` and each pair (a
    different salt, so line order is independent of the split assignment).
    The result depends only on the pairs and *seed*.
    """
    groups = components(pairs)

    def group_hash(group: List[int]) -> str:
        body = "\n".join(sorted(f"{pairs[i][0]}\t{pairs[i][1]}" for i in group))
        return _stable_hash(seed + ":split", body)

    order = sorted(groups, key=lambda g: (group_hash(g), g[0]))
    out: Dict[str, List[Pair]] = {name: [] for name in SPLITS}
    for group in order:
        members = [pairs[i] for i in group]
        if len(out["test"]) + len(members) <= test_size:
            out["test"].extend(members)
        elif len(out["valid"]) + len(members) <= valid_size:
            out["valid"].extend(members)
        else:
            out["train"].extend(members)
    for name in SPLITS:
        out[name].sort(
            key=lambda p: (_stable_hash(seed + ":order", f"{p[0]}\t{p[1]}"), p))
    return out


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------

def write_splits(splits: Dict[str, List[Pair]], outdir: str
                 ) -> Dict[str, Tuple[int, str]]:
    """Write ``{split}.{de,en}`` into *outdir*.

    Returns ``{filename: (line_count, sha256_hex)}``.
    """
    os.makedirs(outdir, exist_ok=True)
    result: Dict[str, Tuple[int, str]] = {}
    for name in SPLITS:
        for li, lang in enumerate(LANGS):
            fname = f"{name}.{lang}"
            data = "".join(p[li] + "\n" for p in splits[name]).encode("utf-8")
            with open(os.path.join(outdir, fname), "wb") as f:
                f.write(data)
            result[fname] = (len(splits[name]), hashlib.sha256(data).hexdigest())
    return result


def words_per_line(sentences: Sequence[str]) -> float:
    """Mean number of whitespace-separated words per sentence."""
    return sum(len(s.split()) for s in sentences) / max(1, len(sentences))


def build(input_path: str, outdir: str, valid_size: int = 1000,
          test_size: int = 1000, seed: str = DEFAULT_SEED,
          out=None) -> Dict[str, Tuple[int, str]]:
    """Run the whole pipeline; print a report to *out*; return file sums.

    *out* defaults to the current ``sys.stdout``.
    """
    if out is None:
        out = sys.stdout
    text = read_ding_text(input_path)
    stats: Counter = Counter()
    pairs = deduplicate(extract_pairs(text, stats), stats)
    if len(pairs) < valid_size + test_size + 1:
        raise CorpusInputError(
            f"{input_path}: only {len(pairs)} sentence pairs extracted, too few "
            f"for valid={valid_size} test={test_size}. Is this the full "
            f"trans-de-en dictionary? {FIX_HINT}")
    splits = split_pairs(pairs, valid_size, test_size, seed)
    sums = write_splits(splits, outdir)
    n_groups = len(components(pairs))

    print(f"input: {input_path}", file=out)
    for key in sorted(stats):
        print(f"  {key}: {stats[key]}", file=out)
    print(f"  pairs_after_dedup: {len(pairs)} (in {n_groups} groups)", file=out)
    print(f"  words_per_line: de {words_per_line([p[0] for p in pairs]):.2f}, "
          f"en {words_per_line([p[1] for p in pairs]):.2f}", file=out)
    for name in SPLITS:
        print(f"  {name}: {len(splits[name])} pairs", file=out)
    print(f"output: {outdir}", file=out)
    for fname, (count, digest) in sums.items():
        print(f"{digest}  {fname}  ({count} lines)", file=out)
    return sums


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", help="trans-de-en_*.deb, or the de-en text file "
                        f"extracted from it ({DING_MEMBER})")
    parser.add_argument("outdir", help="output directory (created if needed)")
    parser.add_argument("--valid-size", type=int, default=1000,
                        help="target number of valid pairs (default: 1000)")
    parser.add_argument("--test-size", type=int, default=1000,
                        help="target number of test pairs (default: 1000)")
    parser.add_argument("--seed", default=DEFAULT_SEED,
                        help=f"salt of the split hash (default: {DEFAULT_SEED})")
    args = parser.parse_args(argv)
    try:
        build(args.input, args.outdir, args.valid_size, args.test_size, args.seed)
    except CorpusInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

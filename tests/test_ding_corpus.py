"""Tests for the shipped Ding German-English corpus and its build script.

The builder is :mod:`residual_studies.ding_corpus` (``scripts/build_ding_corpus.py`` runs it).
All tests are offline and fast.
"""

import hashlib
import io
import lzma
import os
import re
import tarfile
from collections import Counter

import pytest

from residual_studies import ding_corpus as bdc
from residual_studies.data import SPLITS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = os.path.join(ROOT, "data", "ding-de-en")
README = os.path.join(ROOT, "data", "README.md")


# ---------------------------------------------------------------------------
# (1) the shipped corpus
# ---------------------------------------------------------------------------

def _read_lines(path):
    with open(path, "rb") as f:
        data = f.read()
    text = data.decode("utf-8")  # must be valid UTF-8
    assert text.endswith("\n"), f"{path}: missing final newline"
    assert "\r" not in text, f"{path}: has CR line ends"
    return text[:-1].split("\n")


@pytest.fixture(scope="module")
def shipped():
    out = {}
    for split in SPLITS:
        for lang in ("de", "en"):
            out[split, lang] = _read_lines(os.path.join(DATA_DIR, f"{split}.{lang}"))
    return out


def test_shipped_files_aligned_and_clean(shipped):
    for split in SPLITS:
        de, en = shipped[split, "de"], shipped[split, "en"]
        assert len(de) == len(en), split
        for lang in ("de", "en"):
            for i, line in enumerate(shipped[split, lang], 1):
                assert line.strip(), f"{split}.{lang}:{i} is empty"
                assert line == line.strip() and "\t" not in line, f"{split}.{lang}:{i}"
                assert bdc.is_sentence(line), f"{split}.{lang}:{i}: {line!r}"
                assert not bdc.has_alternatives(line), f"{split}.{lang}:{i}"
                assert not re.search(r"[\[\]{}]", line), f"{split}.{lang}:{i}"


def test_shipped_counts_in_expected_range(shipped):
    n = {split: len(shipped[split, "de"]) for split in SPLITS}
    assert 12000 <= n["train"] <= 14500
    assert 900 <= n["valid"] <= 1100
    assert 900 <= n["test"] <= 1100
    assert 14000 <= sum(n.values()) <= 16500
    for lang in ("de", "en"):
        lines = [s for split in SPLITS for s in shipped[split, lang]]
        words = sum(len(s.split()) for s in lines) / len(lines)
        assert 6.0 <= words <= 10.0, (lang, words)


def test_shipped_splits_share_no_sentence(shipped):
    for lang in ("de", "en"):
        for key in (lambda s: s, bdc.match_key):  # exact and near-duplicate
            seen = {}
            for split in SPLITS:
                for s in set(map(key, shipped[split, lang])):
                    assert seen.setdefault(s, split) == split, (
                        f"{lang} sentence {s!r} in {seen[s]} and {split}")


def test_shipped_german_unique(shipped):
    de = [s for split in SPLITS for s in shipped[split, "de"]]
    assert len(de) == len(set(de))


def test_readme_sha256_matches_files():
    with open(README, encoding="utf-8") as f:
        readme = f.read()
    listed = dict((name, digest) for digest, name in re.findall(
        r"\b([0-9a-f]{64})\s+(?:\S*/)?((?:train|valid|test)\.(?:de|en))\b", readme))
    assert set(listed) == {f"{s}.{l}" for s in SPLITS for l in ("de", "en")}
    for name, digest in listed.items():
        with open(os.path.join(DATA_DIR, name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, name


# ---------------------------------------------------------------------------
# (2) filter and split functions on a synthetic de-en file
# ---------------------------------------------------------------------------

SYNTHETIC = """\
# Version :: test
# License :: GPL Version 2 or later; GNU General Public License
Haus {n} | Das Haus {n} ist sehr groß. [ugs.] :: house | The house is very big. [coll.]
Er kommt morgen nach Hause. :: He is coming home tomorrow.
Er kommt morgen nach Hause. :: He is coming home tomorrow.
Ich gehe jetzt nach Hause. :: I am going home now.
Ich gehe jetzt nach Hause. :: I'm off home now.
Sie kam/ging nach Hause. :: She came home.
Sie kam spät nach Hause. :: She came home late.; She got home late.
Sie blieb (lange) zu Hause. :: She stayed at home.
das ist gut so. :: That is good.
Zwei Wörter. :: Two words.
Das ist kein Satz :: This is not a sentence
Das Wetter ist schön. | Die Sonne scheint hell. :: The weather is nice.
„Komm her“, rief er. :: "Come here," he called.
Das geht zu weit. :: That's going too far.
Das geht mir über die Hutschnur. :: That’s going too far.
"""


@pytest.fixture()
def synthetic_file(tmp_path):
    path = tmp_path / "de-en"
    path.write_text(SYNTHETIC, encoding="utf-8")
    return path


def test_clean_and_sentence_rules():
    assert bdc.clean("Das Haus {n}  ist  groß. [ugs.]") == "Das Haus ist groß."
    assert bdc.has_alternatives("Er kam/ging.")
    assert bdc.has_alternatives("Er kam.; Er ging.")
    assert bdc.has_alternatives("Er kam (spät).")
    assert bdc.is_sentence("Er kommt heute.")
    assert bdc.is_sentence("Kommst du heute?")
    assert bdc.is_sentence("„Komm her“, rief er.")
    assert not bdc.is_sentence("er kommt heute.")  # lower-case start
    assert not bdc.is_sentence("Er kommt heute")  # no end punctuation
    assert not bdc.is_sentence("Komm!")  # 1 word
    assert not bdc.is_sentence("Komm her!")  # 2 words


def test_extract_pairs_filters(synthetic_file):
    stats = Counter()
    text = bdc.read_ding_text(str(synthetic_file))
    pairs = bdc.extract_pairs(text, stats)
    assert pairs == [
        ("Das Haus ist sehr groß.", "The house is very big."),  # brackets gone
        ("Er kommt morgen nach Hause.", "He is coming home tomorrow."),
        ("Er kommt morgen nach Hause.", "He is coming home tomorrow."),
        ("Ich gehe jetzt nach Hause.", "I am going home now."),
        ("Ich gehe jetzt nach Hause.", "I'm off home now."),
        ("„Komm her“, rief er.", '"Come here," he called.'),
        ("Das geht zu weit.", "That's going too far."),
        ("Das geht mir über die Hutschnur.", "That’s going too far."),
    ]
    assert stats["entries_misaligned"] == 1  # 2 DE sub-entries vs 1 EN
    assert stats["rejected_alternatives"] == 3  # '/', ';' and '('
    # 'Haus'/'house', lower-case start, 2 words, no final punctuation
    assert stats["rejected_not_sentence"] == 4


def test_deduplicate(synthetic_file):
    pairs = bdc.extract_pairs(bdc.read_ding_text(str(synthetic_file)))
    stats = Counter()
    out = bdc.deduplicate(pairs, stats)
    assert out.count(("Er kommt morgen nach Hause.", "He is coming home tomorrow.")) == 1
    # only the first English variant of a German sentence is kept
    assert ("Ich gehe jetzt nach Hause.", "I am going home now.") in out
    assert ("Ich gehe jetzt nach Hause.", "I'm off home now.") not in out
    assert stats["dropped_duplicate_pair"] == 1
    assert stats["dropped_german_variant"] == 1
    assert len(out) == len({de for de, _ in out}) == 6


def test_components_group_shared_sentences():
    pairs = [
        ("Das geht zu weit.", "That's going too far."),
        ("Eins zwei drei.", "One two three."),
        ("Das geht mir über die Hutschnur.", "That’s going too far."),  # ’ vs '
        ("Das geht auf keine Kuhhaut.", "That is beyond the pale."),
        ("Das geht auf keine Kuhhaut!", "It is too much."),  # German near-dup
    ]
    groups = bdc.components(pairs)
    assert sorted(map(sorted, groups)) == [[0, 2], [1], [3, 4]]


def _synthetic_pairs(n):
    return [(f"Satz Nummer {i} hier.", f"Sentence number {i} here.") for i in range(n)]


@pytest.mark.parametrize("seed", ["ding-de-en-v1", "a", "b", "c", "d", "e"])
def test_shared_sentence_forces_same_split(seed):
    pairs = _synthetic_pairs(60)
    shared_en = [("Das geht zu weit.", "That's going too far."),
                 ("Das geht mir über die Hutschnur.", "That’s going too far."),
                 ("Das geht auf keine Kuhhaut.", "That's going too far!")]
    shared_de = [("Ich gehe jetzt nach Hause.", "I am going home now."),
                 ("Ich gehe jetzt nach Hause!", "I'm off home now.")]
    pairs = pairs[:20] + shared_en + pairs[20:40] + shared_de + pairs[40:]
    splits = bdc.split_pairs(pairs, valid_size=10, test_size=10, seed=seed)
    assert sorted(p for s in splits.values() for p in s) == sorted(pairs)
    assert len(splits["valid"]) == 10 and len(splits["test"]) == 10
    where = {p: name for name, ps in splits.items() for p in ps}
    assert len({where[p] for p in shared_en}) == 1
    assert len({where[p] for p in shared_de}) == 1
    # deterministic
    assert bdc.split_pairs(pairs, 10, 10, seed) == splits


def test_split_independent_of_input_order():
    pairs = _synthetic_pairs(50)
    a = bdc.split_pairs(pairs, 5, 5)
    b = bdc.split_pairs(list(reversed(pairs)), 5, 5)
    assert a == b


def _make_deb(path, de_en_text, member=bdc.DING_MEMBER):
    """Write a minimal .deb (ar archive with data.tar.xz) for testing."""
    tar_buf = io.BytesIO()
    with tarfile.open(fileobj=tar_buf, mode="w") as tar:
        data = de_en_text.encode("utf-8")
        info = tarfile.TarInfo("./" + member)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    members = [("debian-binary", b"2.0\n"),
               ("control.tar.xz", lzma.compress(b"")),
               ("data.tar.xz", lzma.compress(tar_buf.getvalue()))]
    with open(path, "wb") as f:
        f.write(b"!<arch>\n")
        for name, blob in members:
            f.write(f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(blob):<10}`\n"
                    .encode("ascii"))
            f.write(blob + (b"\n" if len(blob) % 2 else b""))


def test_build_end_to_end_from_deb(tmp_path, capsys):
    lines = [f"Wort{i} {{n}} | Ich sehe Nummer {i} hier. :: word{i} | "
             f"I see number {i} here." for i in range(40)]
    deb = tmp_path / "fake.deb"
    _make_deb(deb, "# comment\n" + "\n".join(lines) + "\n")
    out1, out2 = tmp_path / "o1", tmp_path / "o2"
    assert bdc.main([str(deb), str(out1), "--valid-size", "5", "--test-size", "5"]) == 0
    txt = tmp_path / "de-en"
    txt.write_text("# comment\n" + "\n".join(lines) + "\n", encoding="utf-8")
    assert bdc.main([str(txt), str(out2), "--valid-size", "5", "--test-size", "5"]) == 0
    report = capsys.readouterr().out
    assert "train: 30 pairs" in report and "test: 5 pairs" in report
    for split in SPLITS:
        for lang in ("de", "en"):
            b1 = (out1 / f"{split}.{lang}").read_bytes()
            assert b1 == (out2 / f"{split}.{lang}").read_bytes()
            assert hashlib.sha256(b1).hexdigest() in report


# ---------------------------------------------------------------------------
# (3) clear errors for missing or garbage input
# ---------------------------------------------------------------------------

def test_missing_input(tmp_path, capsys):
    missing = tmp_path / "nope.deb"
    with pytest.raises(bdc.CorpusInputError) as exc:
        bdc.read_ding_text(str(missing))
    msg = str(exc.value)
    assert str(missing) in msg and "not found" in msg
    assert "apt-get download trans-de-en" in msg
    assert bdc.main([str(missing), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "apt-get download trans-de-en" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", [
    b"\x00\xff\xfe binary garbage \x80\x81",  # not UTF-8
    "Hallo Welt\nnur Text ohne Trenner\n".encode("utf-8"),  # no ' :: '
    b"# only a comment\n",  # no entries
    b"",  # empty
])
def test_garbage_input(tmp_path, content):
    bad = tmp_path / "garbage.txt"
    bad.write_bytes(content)
    with pytest.raises(bdc.CorpusInputError) as exc:
        bdc.read_ding_text(str(bad))
    msg = str(exc.value)
    assert str(bad) in msg
    assert "trans-de-en" in msg and "dpkg-deb -x" in msg


def test_deb_without_dictionary(tmp_path):
    deb = tmp_path / "other.deb"
    _make_deb(deb, "irrelevant\n", member="usr/share/doc/other/README")
    with pytest.raises(bdc.CorpusInputError) as exc:
        bdc.read_ding_text(str(deb))
    assert str(deb) in str(exc.value) and bdc.DING_MEMBER in str(exc.value)


def test_truncated_deb(tmp_path):
    deb = tmp_path / "broken.deb"
    deb.write_bytes(b"!<arch>\n" + b"x" * 80)
    with pytest.raises(bdc.CorpusInputError) as exc:
        bdc.read_ding_text(str(deb))
    assert str(deb) in str(exc.value) and "corrupt" in str(exc.value)

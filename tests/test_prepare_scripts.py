"""End-to-end tests of scripts/prepare-{iwslt14,wmt14-en-de,opus100}.sh.

Each test builds tiny archives in the real formats and layouts (IWSLT14 de-en.tgz with
train.tags + XML sets, the WMT14 statmt tarballs with their inner paths and SGM test sets, the
OPUS-100 release tree) under tmp_path, runs a script offline with tiny BPE/vocabulary sizes and
checks what the recipe promises: split sizes, cleaning, tag removal, lower-casing, aggressive
hyphen splitting, shared dictionaries, binarized files, and the error messages for missing or
broken archives.
"""

import io
import os
import random
import re
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import cli_env

# ---------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="session")
def repo_root():
    root = Path(__file__).resolve().parents[1]
    assert (root / "scripts" / "prepare_corpus.py").is_file()
    return root


@pytest.fixture(scope="session")
def script_env():
    """The suite's subprocess environment (:func:`conftest.cli_env`), offline, with the scripts' own choice
    of Python (``python`` on PATH: the venv's)."""
    env = cli_env()
    env["PREP_OFFLINE"] = "1"
    env.pop("PYTHON", None)
    if shutil.which("fairseq-preprocess", path=env["PATH"]) is None:
        pytest.skip("fairseq-preprocess is not installed in the environment")
    return env


@pytest.fixture(scope="session")
def run_script(repo_root, script_env):
    def run(name, *args, expect_ok=True, timeout=240):
        proc = subprocess.run(
            ["bash", str(repo_root / "scripts" / name), "--offline", "--workers", "2", *map(str, args)],
            env=script_env, cwd=repo_root, capture_output=True, text=True, timeout=timeout,
        )
        output = proc.stdout + proc.stderr
        if expect_ok:
            assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{output[-6000:]}"
        else:
            assert proc.returncode != 0, f"{name} unexpectedly succeeded:\n{output[-3000:]}"
        return output

    return run


# ---------------------------------------------------------------------------------------------
# helpers


def make_tgz(path, members):
    """members: {inner path: text}; written as a gzip-compressed tar like the real releases."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        dirs = set()
        for name in members:
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        for d in sorted(dirs):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for name, text in members.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def lines(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1]


def debpe(path):
    return [line.replace("@@ ", "") for line in lines(path)]


def idx_len(prefix):
    """Number of sentences in a fairseq mmap dataset (header: magic, version, dtype, length)."""
    with open(f"{prefix}.idx", "rb") as f:
        header = f.read(26)
    assert header[:9] == b"MMIDIDX\x00\x00", f"{prefix}.idx is not a fairseq mmap index"
    assert os.path.getsize(f"{prefix}.bin") > 0
    return struct.unpack("<Q", header[18:26])[0]


WORDS_EN = ("time people year way day man thing woman life child world school state family "
            "student group country problem hand part place case week company system program "
            "question work government number night point home water room mother area money "
            "story fact month lot right study book eye job word business issue side kind head "
            "house service friend father power hour game line end member law car city").split()
WORDS_DE = ("zeit leute jahr weg tag mann ding frau leben kind welt schule staat familie "
            "student gruppe land problem hand teil ort fall woche firma system programm "
            "frage arbeit regierung nummer nacht punkt haus wasser raum mutter gebiet geld "
            "geschichte tatsache monat menge recht studie buch auge beruf wort geschaeft thema "
            "seite art kopf gebaeude dienst freund vater macht stunde spiel linie ende mitglied "
            "gesetz auto stadt").split()


def sentence_pair(i, n_words=None):
    """A parallel pair with the same number of words; 'mNNN' marks the pair in both languages."""
    n = n_words or 6 + i % 7
    en = [WORDS_EN[(i * 7 + k * 3) % len(WORDS_EN)] for k in range(n)]
    de = [WORDS_DE[(i * 7 + k * 3) % len(WORDS_DE)] for k in range(n)]
    return (f"M{i:03d} " + " ".join(de).capitalize() + " .",
            f"M{i:03d} " + " ".join(en).capitalize() + " .")


# ---------------------------------------------------------------------------------------------
# IWSLT14

IWSLT_TEST_SETS = {  # set name -> number of segments
    "IWSLT14.TED.dev2010": 3, "IWSLT14.TEDX.dev2012": 2, "IWSLT14.TED.tst2010": 2,
    "IWSLT14.TED.tst2011": 2, "IWSLT14.TED.tst2012": 2,
}


def iwslt_members(drop=()):
    """Members of a tiny de-en.tgz and the train lines the recipe must keep, in order."""
    train = {"de": [], "en": []}
    expected = []  # (de marker/text, en) pairs that survive filtering and cleaning
    n = 0
    for talk in (1, 2):
        header = [
            ("<url>http://www.ted.com/talks/talk_%d.html</url>" % talk,) * 2,
            ("<keywords>talks, science, Technik</keywords>", "<keywords>talks, science, technology</keywords>"),
            ("<talkid>%d</talkid>" % talk,) * 2,
            ("<title>Jane Doe: Eine Idee Nummer %d</title>" % talk,
             "<title>Jane Doe: An Idea Number %d</title>" % talk),
            ("<description>TED Talk Untertitel: Zusammenfassung Zwei Drei Vier</description>",
             "<description>TED Talk Subtitles: Summary Two Three Four</description>"),
        ]
        for de, en in header:
            train["de"].append(de)
            train["en"].append(en)
        expected += [f"jane doe : eine idee nummer {talk}",
                     "ted talk untertitel : zusammenfassung zwei drei vier"]
        for _ in range(32):
            de, en = sentence_pair(n)
            if n == 10:  # over-long German side: 180 tokens > 175 -> dropped by cleaning
                de = de[:-2] + " lang" * 175 + " ."
            elif n == 20:  # length ratio 12/3 > 1.5 -> dropped
                en = f"M{n:03d} Short ."
            elif n == 30:  # empty pair -> dropped
                de = en = ""
            else:
                expected.append(de.lower())
            train["de"].append(de)
            train["en"].append(en)
            n += 1
    members = {
        "de-en/train.tags.de-en.de": "\n".join(train["de"]) + "\n",
        "de-en/train.tags.de-en.en": "\n".join(train["en"]) + "\n",
        "de-en/README": "IWSLT 2014 German-English\n",
    }
    for si, (name, nseg) in enumerate(IWSLT_TEST_SETS.items(), 1):
        for lang in ("de", "en"):
            kind = "srcset" if lang == "de" else "refset"
            segs = []
            for k in range(1, nseg + 1):
                de, en = sentence_pair(500 + 10 * si + k)  # marker T5<set><k>
                text = (de if lang == "de" else en).replace("M", "T", 1)
                if name == "IWSLT14.TEDX.dev2012" and k == 1 and lang == "en":
                    text = "It\u2019s " + text  # right single quote -> ' like fairseq's sed
                segs.append(f'<seg id="{k}"> {text} </seg>')
            members[f"de-en/{name}.de-en.{lang}.xml"] = "\n".join([
                '<?xml version="1.0" encoding="UTF-8"?>',
                "<mteval>",
                f'<{kind} setid="{name}" srclang="german" trglang="english">',
                '<doc docid="535" genre="lectures">',
                "<url>http://www.ted.com/talks/x.html</url>",
                "<description>TED Talk Subtitles and Transcript: something</description>",
                "<keywords>talks, science</keywords>",
                "<talkid>535</talkid>",
                "<title>Some Title</title>",
                *segs,
                "</doc>",
                f"</{kind}>",
                "</mteval>",
            ]) + "\n"
    for member in drop:
        del members[member]
    return members, expected


@pytest.mark.slow
def test_iwslt14_end_to_end(tmp_path, run_script):
    members, expected = iwslt_members()
    make_tgz(tmp_path / "archives" / "de-en.tgz", members)
    out, bin_dir = tmp_path / "iwslt", tmp_path / "iwslt" / "data-bin"
    log = run_script("prepare-iwslt14.sh", "--archives", tmp_path / "archives", "--out", out,
                     "--bpe-size", 60)
    assert "step 5/5" in log and "done" in log

    # 2 talks x (2 header lines + 32 pairs) minus 3 dropped pairs by cleaning
    n_clean = 2 * 2 + 64 - 3
    assert len(expected) == n_clean
    valid = expected[22::23]  # awk 'NR%23 == 0'
    train = [line for k, line in enumerate(expected, 1) if k % 23 != 0]
    assert debpe(out / "valid.de") == valid
    assert debpe(out / "train.de") == train
    assert len(lines(out / "train.en")) == len(train)
    n_test = sum(IWSLT_TEST_SETS.values())
    assert len(lines(out / "test.de")) == len(lines(out / "test.en")) == n_test

    text = "\n".join(debpe(out / "train.de") + debpe(out / "train.en") + debpe(out / "valid.en"))
    for gone in ("url", "ted.com", "talkid", "keywords", "technology", "<", "&lt;", "lang lang"):
        assert gone not in text
    assert not re.search(r"\b(title|description)\b", text)
    assert "jane doe : an idea number 1" in text  # <title> tags stripped, text kept
    assert text == text.lower()  # lower-cased
    test_en = debpe(out / "test.en")
    # fairseq's order: dev2010, TEDX.dev2012, tst2010, tst2011, tst2012
    order = [f"t5{si}{k}" for si, n in enumerate(IWSLT_TEST_SETS.values(), 1)
             for k in range(1, n + 1)]
    assert [re.search(r"t5\d\d", line).group() for line in test_en] == order
    assert test_en[0] == "t511 " + " ".join(sentence_pair(511)[1].lower().split()[1:])
    assert test_en[3].startswith("it &apos;s t521 ")  # U+2019 -> ' -> Moses escape
    assert all(line == line.lower() for line in test_en)
    assert debpe(out / "test.de")[0] == "t511 " + " ".join(sentence_pair(511)[0].lower().split()[1:])

    # joined dictionary, binarized splits with the right sizes
    assert (bin_dir / "dict.de.txt").read_text() == (bin_dir / "dict.en.txt").read_text()
    assert (bin_dir / "code").is_file()
    for split, n in (("train", len(train)), ("valid", len(valid)), ("test", n_test)):
        for lang in ("de", "en"):
            assert idx_len(bin_dir / f"{split}.de-en.{lang}") == n


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "not-gzip", "truncated", "missing-member"])
def test_iwslt14_archive_errors(tmp_path, run_script, case):
    archives = tmp_path / "archives"
    archives.mkdir()
    archive = archives / "de-en.tgz"
    if case == "not-gzip":
        archive.write_text("<html><body>404 Not Found</body></html>\n")
    elif case == "truncated":
        members, _ = iwslt_members()
        rng = random.Random(0)
        members["de-en/padding.txt"] = "".join(rng.choice("abcdefgh \n") for _ in range(200000))
        make_tgz(archive, members)
        data = archive.read_bytes()
        archive.write_bytes(data[: len(data) // 2])
    elif case == "missing-member":
        members, _ = iwslt_members(drop=["de-en/IWSLT14.TED.tst2012.de-en.en.xml"])
        make_tgz(archive, members)
    log = run_script("prepare-iwslt14.sh", "--archives", archives, "--out", tmp_path / "out",
                     expect_ok=False)
    assert "ERROR" in log
    if case == "missing":
        assert "archive 'de-en.tgz' not found in" in log
        assert "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz" in log
    elif case == "not-gzip":
        assert "de-en.tgz' is malformed: not a gzip-compressed tar file" in log
        assert "HTML" in log
    elif case == "truncated":
        assert "de-en.tgz' is malformed: not a readable tar archive or truncated" in log
    else:
        assert "does not contain the expected file(s)" in log
        assert "de-en/IWSLT14.TED.tst2012.de-en.en.xml" in log


@pytest.mark.slow
def test_help_and_bad_options(repo_root, script_env):
    for name in ("prepare-iwslt14.sh", "prepare-wmt14-en-de.sh", "prepare-opus100.sh"):
        script = repo_root / "scripts" / name
        assert os.access(script, os.X_OK), f"{name} is not executable"
        proc = subprocess.run([str(script), "--help"], env=script_env, capture_output=True,
                              text=True, timeout=30)
        assert proc.returncode == 0
        for option in ("--archives", "--out", "--bpe-size", "--workers", "--offline"):
            assert option in proc.stdout, f"{name} --help lacks {option}"
        proc = subprocess.run([str(script), "--bogus"], env=script_env, capture_output=True,
                              text=True, timeout=30)
        assert proc.returncode != 0 and "unknown option '--bogus'" in proc.stderr


# ---------------------------------------------------------------------------------------------
# WMT14 en-de


def wmt_corpus(start, count, special=None):
    special = special or {}
    en, de = [], []
    for i in range(start, start + count):
        d, e = special.get(i, sentence_pair(i))
        de.append(d)
        en.append(e)
    return "\n".join(en) + "\n", "\n".join(de) + "\n"


def sgm(setid, lang, segs, kind):
    """A newstest SGM file: one <seg id="N"> per line inside <doc>/<p>."""
    body = "\n".join(f'<seg id="{k}">{text}</seg>' for k, text in enumerate(segs, 1))
    trglang = f' trglang="{lang}"' if kind == "refset" else ""
    return (f'<{kind} setid="{setid}" srclang="any"{trglang}>\n'
            '<doc sysid="ref" docid="1012-bbc" genre="news" origlang="en">\n'
            f"<p>\n{body}\n</p>\n</doc>\n</{kind}>\n")


WMT_TEST = [  # (en, de) newstest2014-like segments
    ("A state-of-the-art system for pedestrians.", "Ein hochmodernes System für Fußgänger."),
    ("He said: \u201cIt\u2019s fine.\u201d", "Er sagte: \u201eEs ist gut.\u201c"),
    ("Gutach: more safety for pedestrians", "Gutach: Noch mehr Sicherheit für Fußgänger"),
]


WMT_DEV = [("The well-known rule\u2019s fine.", "Die bekannte Regel ist gut."),
           ("Two cats.", "Zwei Katzen.")]


def newstest_dir(folder, years=(2010, 2011, 2012, 2013, 2015, 2016), skip=()):
    """Raw newstestYYYY.{en,de} as `sacrebleu -t wmtYY -l en-de --echo src/ref` writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = {}
    for y in years:
        en = [f"News of {y}: the state-of-the-art rule\u2019s fine.", f"Year {y} ended."]
        de = [f"Nachrichten von {y}: die hochmoderne Regel ist gut.", f"Das Jahr {y} endete."]
        if y == 2013:  # the plain-text newstest2013 of dev.tgz
            en, de = [e for e, _ in WMT_DEV], [d for _, d in WMT_DEV]
        texts[y] = (en, de)
        for lang, text in (("en", en), ("de", de)):
            if (y, lang) not in skip:
                (folder / f"newstest{y}.{lang}").write_text("".join(t + "\n" for t in text))
    (folder / "newstest2014.de").write_text("decoy: 2014 is the test split of test-full.tgz\n")
    return texts


def wmt_archives(archives, skip=()):
    special = {
        # in commoncrawl: German punctuation to normalise, a zero-width space to remove,
        # an over-long pair (300 tokens > 250) and an empty pair for the cleaning step
        105: ("M105 Er sagte \u201eHallo Welt\u201c und ging nach Hause .",
              "M105 He said \u201cHello world\u201d and went home ."),
        106: ("M106 Ein\u200bzwei drei state-of-the-art Wort Beispiel .",
              "M106 One\u200btwo three state-of-the-art word example ."),
        150: ("M150 " + "lang " * 300 + ".", "M150 " + "long " * 300 + "."),
        160: ("", ""),
    }
    ep_en, ep_de = wmt_corpus(0, 100)
    cc_en, cc_de = wmt_corpus(100, 80, special)
    nc_en, nc_de = wmt_corpus(180, 70)
    tgz = {
        "training-parallel-europarl-v7.tgz": {
            "training/europarl-v7.de-en.en": ep_en, "training/europarl-v7.de-en.de": ep_de,
            "training/europarl-v7.fr-en.en": "decoy\n", "training/europarl-v7.fr-en.fr": "leurre\n",
        },
        "training-parallel-commoncrawl.tgz": {
            "commoncrawl.de-en.en": cc_en, "commoncrawl.de-en.de": cc_de,
            "commoncrawl.de-en.annotation": "x\n" * 80, "commoncrawl.fr-en.fr": "leurre\n",
        },
        "training-parallel-nc-v9.tgz": {
            "training/news-commentary-v9.de-en.en": nc_en,
            "training/news-commentary-v9.de-en.de": nc_de,
            "training/news-commentary-v9.cs-en.cs": "navnada\n",
        },
        "test-full.tgz": {
            "test-full/newstest2014-deen-src.en.sgm": sgm("newstest2014", "en", [e for e, _ in WMT_TEST], "srcset"),
            "test-full/newstest2014-deen-ref.de.sgm": sgm("newstest2014", "de", [d for _, d in WMT_TEST], "refset"),
            "test-full/newstest2014-deen-src.de.sgm": sgm("newstest2014", "de", ["decoy"], "srcset"),
            "test-full/newstest2014-fren-src.en.sgm": sgm("newstest2014", "en", ["decoy"], "srcset"),
        },
        "dev.tgz": {  # plain-text newstest2013, used only with --newstest2013
            "dev/newstest2013.en": "".join(e + "\n" for e, _ in WMT_DEV),
            "dev/newstest2013.de": "".join(d + "\n" for _, d in WMT_DEV),
            "dev/newstest2013.cs": "decoy\n",
            "dev/newstest2013-src.en.sgm": sgm("newstest2013", "en", ["decoy"], "srcset"),
        },
    }
    for name, members in tgz.items():
        if name not in skip:
            make_tgz(archives / name, members)


@pytest.mark.slow
def test_wmt14_end_to_end(tmp_path, run_script):
    wmt_archives(tmp_path / "archives")
    years = newstest_dir(tmp_path / "newstest")
    out, bin_dir = tmp_path / "wmt", tmp_path / "wmt" / "data-bin"
    log = run_script("prepare-wmt14-en-de.sh", "--archives", tmp_path / "archives", "--out", out,
                     "--bpe-size", 80, "--newstest2013", "--newstest-years", "2010-2016",
                     "--newstest-dir", tmp_path / "newstest")
    assert "step 7/7" in log and "done" in log

    # 250 tokenized pairs: lines 100 and 200 -> valid; 248 train minus the over-long and the
    # empty pair removed by cleaning after BPE
    valid_en = debpe(out / "valid.en")
    assert [v.split()[0] for v in valid_en] == ["M099", "M199"]
    train_en, train_de = debpe(out / "train.en"), debpe(out / "train.de")
    assert len(train_en) == len(train_de) == 248 - 2
    markers = [t.split()[0] for t in train_en]
    assert "M150" not in markers and "M099" not in markers and "M199" not in markers
    assert len(lines(out / "tmp" / "train.en")) == 248  # before cleaning

    by_marker = dict(zip(markers, train_de))
    assert by_marker["M105"] == "M105 Er sagte &quot; Hallo Welt &quot; und ging nach Hause ."
    assert by_marker["M106"] == "M106 Ein zwei drei state @-@ of @-@ the @-@ art Wort Beispiel ."
    assert "\u200b" not in "".join(train_en + train_de)
    assert any(t.startswith("M000 ") and t[5].isupper() for t in train_en)  # case kept

    test_en, test_de = debpe(out / "test.en"), debpe(out / "test.de")
    assert test_en[0] == "A state @-@ of @-@ the @-@ art system for pedestrians ."
    assert test_de[0] == "Ein hochmodernes System für Fußgänger ."
    assert test_en[1] == "He said : “ It &apos;s fine . ”"
    # detokenized reference kept for sacreBLEU, exactly the SGM text
    assert lines(out / "raw" / "newstest2014.de") == [d for _, d in WMT_TEST]
    assert lines(out / "raw" / "newstest2014.en") == [e for e, _ in WMT_TEST]

    assert (bin_dir / "dict.en.txt").read_text() == (bin_dir / "dict.de.txt").read_text()
    assert (bin_dir / "code").is_file()
    for split, n in (("train", 246), ("valid", 2), ("test", len(WMT_TEST)), ("test1", 2)):
        for lang in ("en", "de"):
            assert idx_len(bin_dir / f"{split}.en-de.{lang}") == n
    # --newstest2013: extra test split 'test1', tokenized like newstest2014, raw text kept
    assert debpe(out / "test1.en") == ["The well @-@ known rule &apos;s fine .", "Two cats ."]
    assert lines(out / "raw" / "newstest2013.en") == [e for e, _ in WMT_DEV]

    # --newstest-years 2010-2016: each year but 2014 (the test split) as a split newstestYYYY,
    # tokenized like the test set, binarized with the training dictionary; raw text in OUT/raw/
    for y, (en, de) in years.items():
        assert lines(out / "raw" / f"newstest{y}.de") == de and lines(out / "raw" / f"newstest{y}.en") == en
        assert debpe(out / f"newstest{y}.en")[0] == (
            "The well @-@ known rule &apos;s fine ." if y == 2013 else
            f"News of {y} : the state @-@ of @-@ the @-@ art rule &apos;s fine .")
        for lang in ("en", "de"):
            assert idx_len(bin_dir / f"newstest{y}.en-de.{lang}") == 2
    assert lines(out / "raw" / "newstest2014.de") == [d for _, d in WMT_TEST]  # not the decoy
    assert not (bin_dir / "newstest2014.en-de.en.idx").exists()
    assert sorted(p.name for p in bin_dir.glob("test*.en-de.en.idx")) == ["test.en-de.en.idx", "test1.en-de.en.idx"]
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(str(bin_dir / "dict.de.txt"))
    data = data_utils.load_indexed_dataset(str(bin_dir / "newstest2016.en-de.de"), d)
    assert d.string(data[1], "@@ ") == "Das Jahr 2016 endete ."


@pytest.mark.slow
def test_wmt14_newstest_year_missing(tmp_path, run_script):
    wmt_archives(tmp_path / "archives")
    newstest_dir(tmp_path / "newstest", skip={(2015, "de")})
    log = run_script("prepare-wmt14-en-de.sh", "--archives", tmp_path / "archives", "--out",
                     tmp_path / "out", "--newstest-years", "2010-2016", "--newstest-dir",
                     tmp_path / "newstest", expect_ok=False)
    assert f"newstest2015: {tmp_path / 'newstest'}/newstest2015.de not found" in log
    assert "sacrebleu -t wmt15 -l en-de --echo ref > newstest2015.de" in log
    assert "step 2/7" not in log  # stopped before any work
    # offline without a folder: the same advice
    log = run_script("prepare-wmt14-en-de.sh", "--archives", tmp_path / "archives", "--out",
                     tmp_path / "out", "--newstest-years", "2016", expect_ok=False)
    assert "newstest2016: offline and no --newstest-dir" in log
    assert "sacrebleu -t wmt16 -l en-de --echo src > newstest2016.en" in log
    # --newstest2013 and 2013 from the folder must be the same text
    (tmp_path / "newstest" / "newstest2013.de").write_text("Etwas anderes.\nNoch etwas.\n")
    log = run_script("prepare-wmt14-en-de.sh", "--archives", tmp_path / "archives", "--out",
                     tmp_path / "out", "--newstest-years", "2013", "--newstest2013", "--newstest-dir",
                     tmp_path / "newstest", expect_ok=False)
    assert "newstest2013.de of dev.tgz differs from the one taken for --newstest-years" in log
    log = run_script("prepare-wmt14-en-de.sh", "--out", tmp_path / "out", "--newstest-years", "2010-20",
                     expect_ok=False)
    assert "--newstest-years takes years like 2010-2016" in log


@pytest.mark.slow
def test_wmt14_missing_archives_are_named_at_once(tmp_path, run_script):
    wmt_archives(tmp_path / "archives", skip=("training-parallel-commoncrawl.tgz", "test-full.tgz"))
    log = run_script("prepare-wmt14-en-de.sh", "--archives", tmp_path / "archives",
                     "--out", tmp_path / "out", expect_ok=False)
    assert (f"offline mode, and 2 archive(s) are not in {tmp_path / 'archives'}: training-parallel-commoncrawl.tgz "
            "(http://statmt.org/wmt13/training-parallel-commoncrawl.tgz); test-full.tgz "
            "(http://statmt.org/wmt14/test-full.tgz); put them there") in log, log


@pytest.mark.slow
def test_wmt14_wrong_inner_layout(tmp_path, run_script):
    wmt_archives(tmp_path / "archives")
    # a test-full.tgz without the newstest2014 de-en SGM files (e.g. another year's archive)
    make_tgz(tmp_path / "archives" / "test-full.tgz",
             {"test-full/newstest2013-src.en.sgm": sgm("newstest2013", "en", ["x"], "srcset")})
    log = run_script("prepare-wmt14-en-de.sh", "--archives", tmp_path / "archives",
                     "--out", tmp_path / "out", expect_ok=False)
    assert "test-full.tgz' does not contain the expected file(s)" in log
    assert "test-full/newstest2014-deen-src.en.sgm" in log


# ---------------------------------------------------------------------------------------------
# OPUS-100

OPUS_ROOT = "opus-100-corpus/v1.0/supervised"
OPUS_SIZES = {"train": 60, "dev": 6, "test": 5}


def opus_text(lang, i):
    base = {"en": WORDS_EN, "de": WORDS_DE,
            "fr": "temps gens annee chemin jour homme chose femme vie enfant monde ecole".split(),
            "an": "tiempo chent anyo camin diya ombre cosa muller vida ninno mundo escuela".split()}[lang]
    words = [base[(i * 5 + k * 3) % len(base)] for k in range(4 + i % 6)]
    return " ".join(words).capitalize() + f" {i}."


def opus_archive(path, with_pairs=("de-en", "en-fr")):
    members = {}
    for folder in with_pairs:
        a, b = folder.split("-")
        splits = ("train",) if folder == "an-en" else ("train", "dev", "test")  # like an, dz, hy
        for split in splits:
            for lang in (a, b):
                offset = {"train": 0, "dev": 1000, "test": 2000}[split]
                text = [opus_text(lang, offset + i) for i in range(OPUS_SIZES[split])]
                members[f"{OPUS_ROOT}/{folder}/opus.{folder}-{split}.{lang}"] = "\n".join(text) + "\n"
    members["opus-100-corpus/v1.0/zeroshot/de-fr/opus.de-fr-test.de"] = "decoy\n"
    members["opus-100-corpus/README"] = "OPUS-100\n"
    make_tgz(path, members)
    return members


@pytest.mark.slow
def test_opus100_end_to_end(tmp_path, run_script):
    members = opus_archive(tmp_path / "archives" / "opus-100-corpus-v1.0.tar.gz")
    out, bin_dir = tmp_path / "opus", tmp_path / "opus" / "data-bin"
    log = run_script("prepare-opus100.sh", "--archives", tmp_path / "archives", "--out", out,
                     "--bpe-size", 150, "--character-coverage", 1.0)
    assert "pairs: 2 (de fr)" in log and "done" in log

    dict_txt = (bin_dir / "dict.txt").read_text()
    assert len(dict_txt.splitlines()) > 50
    for lang in ("en", "de", "fr"):
        assert (bin_dir / f"dict.{lang}.txt").read_text() == dict_txt  # one shared dictionary
    assert (bin_dir / "langs.txt").read_text().strip() == "en,de,fr"
    assert (bin_dir / "lang_pairs.txt").read_text().strip() == "en-de,de-en,en-fr,fr-en"
    assert (bin_dir / "spm.model").is_file()

    for lang in ("de", "fr"):
        for split, n in (("train", 60), ("valid", 6), ("test", 5)):
            for side in ("en", lang):
                assert idx_len(bin_dir / f"{split}.en-{lang}.{side}") == n
        folder = "de-en" if lang == "de" else "en-fr"
        for side in ("en", lang):  # raw text kept for per-direction sacreBLEU
            raw = (out / "raw" / f"test.en-{lang}.{side}").read_text()
            assert raw == members[f"{OPUS_ROOT}/{folder}/opus.{folder}-test.{side}"]

    # the binarized test set decodes back to the raw text (no <unk>, one dictionary for all)
    import sentencepiece as spm
    from fairseq.data import Dictionary, data_utils

    sp = spm.SentencePieceProcessor(model_file=str(bin_dir / "spm.model"))
    dictionary = Dictionary.load(str(bin_dir / "dict.txt"))
    for lang in ("de", "fr"):
        data = data_utils.load_indexed_dataset(str(bin_dir / f"test.en-{lang}.{lang}"), dictionary)
        raw = lines(out / "raw" / f"test.en-{lang}.{lang}")
        decoded = [sp.decode(dictionary.string(data[i]).split()) for i in range(len(data))]
        assert decoded == raw

    # the layout is the one fairseq's translation_multi_simple_epoch task reads, all directions
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(bin_dir), "--task", "translation_multi_simple_epoch", "--arch", "transformer",
        "--langs", (bin_dir / "langs.txt").read_text().strip(),
        "--lang-pairs", (bin_dir / "lang_pairs.txt").read_text().strip(),
        "--encoder-langtok", "tgt", "--decoder-langtok",
    ])
    args.max_source_positions = args.max_target_positions = 1024
    task = tasks.setup_task(args)
    for split, n in (("train", 60), ("valid", 6), ("test", 5)):
        task.load_dataset(split)
        assert len(task.dataset(split)) == 4 * n  # en-de, de-en, en-fr, fr-en


@pytest.mark.slow
def test_opus100_pair_selection_and_errors(tmp_path, run_script):
    archives = tmp_path / "archives"
    opus_archive(archives / "opus-100-corpus-v1.0.tar.gz", with_pairs=("de-en", "en-fr", "an-en"))
    out = tmp_path / "opus"
    log = run_script("prepare-opus100.sh", "--archives", archives, "--out", out, "--pairs", "an-en",
                     "--bpe-size", 100)
    # only the requested pair; 'an' has no dev/test sets in OPUS-100 v1.0: train only
    assert "warning: an-en has no dev set" in log
    bin_dir = out / "data-bin"
    assert idx_len(bin_dir / "train.en-an.an") == idx_len(bin_dir / "train.en-an.en") == 60
    assert not (bin_dir / "valid.en-an.an.idx").exists()
    assert sorted(p.name for p in bin_dir.glob("*.idx")) == ["train.en-an.an.idx", "train.en-an.en.idx"]
    assert not (out / "orig" / OPUS_ROOT / "de-en").exists()  # other pairs not even extracted
    assert (bin_dir / "langs.txt").read_text().strip() == "en,an"
    assert (bin_dir / "lang_pairs.txt").read_text().strip() == ""  # no pair with a dev set

    log = run_script("prepare-opus100.sh", "--archives", archives, "--out", tmp_path / "o2",
                     "--pairs", "en-xh", expect_ok=False)
    assert "language pair(s) not in" in log and "en-xh" in log
    assert "the archive holds: an de fr" in log  # not only the pairs extracted

    log = run_script("prepare-opus100.sh", "--archives", tmp_path / "empty", "--out",
                     tmp_path / "o3", expect_ok=False)
    assert "archive 'opus-100-corpus-v1.0.tar.gz' not found in" in log
    assert "https://object.pouta.csc.fi/OPUS-100/v1.0/opus-100-corpus-v1.0.tar.gz" in log

    make_tgz(tmp_path / "bad" / "opus-100-corpus-v1.0.tar.gz", {"something/else.txt": "x\n"})
    log = run_script("prepare-opus100.sh", "--archives", tmp_path / "bad", "--out",
                     tmp_path / "o4", expect_ok=False)
    assert "does not contain the expected file(s)" in log
    assert "opus-100-corpus/v1.0/supervised/" in log


# ---------------------------------------------------------------------------------------------
# the shared steps on their own (residual_studies.corpus_*, run by scripts/prepare_corpus.py)


@pytest.fixture(scope="session")
def prep_utils(repo_root):
    import types

    from residual_studies import corpus_archive, corpus_io, corpus_steps, corpus_text

    return types.SimpleNamespace(
        clean_pair=corpus_text.clean_pair, iwslt_train_line=corpus_text.iwslt_train_line,
        seg_text=corpus_text.seg_text, parse_pairs=corpus_archive.parse_pairs, PrepError=corpus_io.PrepError,
        main=corpus_steps.main)


def test_clean_pair_follows_moses(prep_utils):
    clean = prep_utils.clean_pair
    assert clean("a  b\tc ", " x y z", 1, 175, 1.5) == ("a b c", "x y z")
    assert clean("a b c", "", 1, 175, 1.5) is None  # empty side
    assert clean("a " * 176, "b " * 176, 1, 175, 1.5) is None  # too long
    assert clean("a " * 175, "b " * 175, 1, 175, 1.5) is not None  # limit is inclusive
    assert clean("a b", "x y z", 1, 175, 1.5) == ("a b", "x y z")  # 1.5 is allowed
    assert clean("a b", "w x y z", 1, 175, 1.5) is None  # ratio 2
    assert clean("a|b c", "x y", 1, 175, 1.5) == ("ab c", "x y")  # '|' removed (not factored)


def test_text_extraction(prep_utils):
    assert prep_utils.iwslt_train_line("<url>http://x</url>") is None
    assert prep_utils.iwslt_train_line("<talkid>7</talkid>") is None
    assert prep_utils.iwslt_train_line("<keywords>a, b</keywords>") is None
    assert prep_utils.iwslt_train_line("<title>T: A</title>") == "T: A"
    assert prep_utils.iwslt_train_line("<description>D</description>") == "D"
    assert prep_utils.iwslt_train_line("Plain text.") == "Plain text."
    assert prep_utils.seg_text('<seg id="12"> Hallo  Welt </seg>') == "Hallo  Welt"
    assert prep_utils.seg_text('<seg id="12"> Hallo  Welt </seg>', raw=True) == "Hallo Welt"
    assert prep_utils.seg_text("<doc docid=\"1\">") is None
    assert prep_utils.parse_pairs("de, en-fr fr-en,xh-en") == ["de", "fr", "fr", "xh"]
    with pytest.raises(prep_utils.PrepError):
        prep_utils.parse_pairs("de-fr")


def test_fetch_downloads_when_online(tmp_path, prep_utils, capsys, monkeypatch):
    """The download path, with a local file:// URL standing in for the official one."""
    source = make_tgz(tmp_path / "mirror" / "de-en.tgz", {"de-en/a.txt": "A\n", "de-en/b.txt": "B\n"})
    archives, dest = tmp_path / "archives", tmp_path / "orig"
    monkeypatch.delenv("PREP_OFFLINE", raising=False)
    argv = ["fetch", "--archives", str(archives), "--name", "de-en.tgz", "--dest", str(dest),
            "--require", "de-en/a.txt"]
    assert prep_utils.main(argv + ["--url", source.as_uri()]) == 0
    assert (archives / "de-en.tgz").read_bytes() == source.read_bytes()
    assert (dest / "de-en" / "a.txt").read_text() == "A\n"
    assert not (dest / "de-en" / "b.txt").exists()  # only the wanted members
    assert prep_utils.main(argv + ["--url", source.as_uri()]) == 0
    assert "already extracted" in capsys.readouterr().err

    (archives / "de-en.tgz").unlink()
    url = "http://127.0.0.1:9/de-en.tgz"  # nothing listens there: fails at once
    # without the archive, its files already extracted (in the destination, or in the archives folder) are used
    assert prep_utils.main(argv + ["--url", url]) == 0
    assert f"using its files already extracted in {dest}" in capsys.readouterr().err
    shutil.move(dest / "de-en", archives / "de-en")
    assert prep_utils.main(argv + ["--url", url]) == 0
    assert f"using its files already extracted in {archives}" in capsys.readouterr().err
    assert (dest / "de-en" / "a.txt").read_text() == "A\n"
    shutil.rmtree(dest / "de-en")
    shutil.rmtree(archives / "de-en")
    assert prep_utils.main(argv + ["--url", url]) == 2
    err = capsys.readouterr().err
    assert "archive 'de-en.tgz' not found" in err and "download failed" in err and url in err
    assert f"(or extract it: de-en/a.txt and the other files it needs in {dest} or {archives})" in err
    # a required folder (OPUS-100's tree) counts when it is extracted in the destination, not empty
    folder = ["fetch", "--archives", str(archives), "--name", "de-en.tgz", "--dest", str(dest), "--require", "de-en/",
              "--url", url]
    assert prep_utils.main(folder) == 2
    assert f"(or extract it into {dest}: its de-en/ there)" in capsys.readouterr().err
    (dest / "de-en").mkdir(parents=True)
    assert prep_utils.main(folder) == 2  # empty
    (dest / "de-en" / "a.txt").write_text("A\n")
    assert prep_utils.main(folder) == 0
    assert f"using its files already extracted in {dest}" in capsys.readouterr().err

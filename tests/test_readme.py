"""The generated tables of README.md, docs/schemes.md and docs/usage.md match the registry, and the documentation's references
point at real files.

Fast: no process starts (the tables are built in-process by ``fairseq_residual.schemes.docs``).
"""
import glob
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
#: every Markdown page whose references are checked: README.md and docs/**/*.md (the ranking's generated
#: pages under docs/results/2026-12-04-ranking/ included)
PAGES = [README] + sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))

#: [text](target) and ![alt](target), target without a scheme (http:, mailto:, ...) or a bare #anchor
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
#: `path/to/file.py:LINE` (optionally :LINE-LINE)
FILE_LINE = re.compile(r"([\w./-]+\.(?:py|sh|md|yaml|json)):(\d+)(?:-(\d+))?")
#: tests/... paths
TESTS_PATH = re.compile(r"(?<![\w./-])(tests/[\w./-]*\w)")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_readme_generated_blocks_match_the_registry():
    from fairseq_residual.schemes.docs import WRITE_COMMAND, pages, stale_blocks

    checked = 0
    for path, names in pages(README):
        stale = stale_blocks(_read(path), names)
        assert not stale, (f"{os.path.relpath(path, REPO)}'s generated blocks {', '.join(stale)} differ from what "
                           f"the scheme registry generates: run {WRITE_COMMAND}")
        checked += len(names)
    assert checked == 5  # the scheme, options, recipes, compat and presets tables


def test_every_scheme_and_norm_option_is_in_the_options_table():
    from fairseq_residual.norms import NORM_OPTIONS
    from fairseq_residual.schemes import SCHEMES

    page = _read(os.path.join(REPO, "docs", "usage.md"))  # the options table's page
    for option in [o for scheme in SCHEMES for o in scheme.OPTIONS] + list(NORM_OPTIONS):
        assert f"`{option.flag}" in page and f"`model.{option.dest}`" in page, option.flag


def _targets(path):
    text = _read(path)
    text_no_code = re.sub(r"```.*?```", "", text, flags=re.S)
    for m in LINK.finditer(text_no_code):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        yield "link", target.split("#")[0], None
    for m in FILE_LINE.finditer(text):
        yield "line", m.group(1), int(m.group(3) or m.group(2))
    for m in TESTS_PATH.finditer(text):
        yield "tests", m.group(1), None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, REPO))
def test_references_point_at_existing_files(page):
    """Every relative link, every ``file.py:LINE`` (the file has that many lines) and every ``tests/...`` path of
    README.md and docs/**/*.md names a file or folder of the checkout."""
    here = os.path.dirname(page)
    missing = []
    for kind, target, line in _targets(page):
        if kind == "link":
            path = os.path.normpath(os.path.join(here, target))
        else:  # file.py:LINE and tests/... are written relative to the repository root
            path = os.path.join(REPO, target)
            if not os.path.exists(path) and kind == "line":
                path = os.path.normpath(os.path.join(here, target))
        if not os.path.exists(path):
            missing.append(f"{target} ({kind}): no such file")
        elif line is not None and os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                n = sum(1 for _ in f)
            if line > n:
                missing.append(f"{target}:{line}: the file has {n} lines")
    assert not missing, f"{os.path.relpath(page, REPO)}: " + "; ".join(missing)


def test_ranking_tables_are_the_archived_rankings(capsys):
    """README.md's "Which scheme" table and the ranking page's rows are made from
    docs/results/2026-12-04-ranking/ranking.json (scripts/readme_ranking.py --write); a changed number in either
    makes them differ."""
    import json

    from residual_studies import readme_ranking
    from residual_studies.ranking import readme_table

    assert readme_ranking.main([]) == 0, capsys.readouterr().out
    with open(readme_ranking.RANKING_JSON, encoding="utf-8") as f:
        data = json.load(f)
    with open(readme_ranking.README, encoding="utf-8") as f:
        text = f.read()
    data["rows"][0]["text"]["valid_nll"] = "0.00 ± 0.00"
    assert readme_ranking.render(text, readme_table(data)) != text
    data["rows"] = [r for r in data["rows"] if r["row"] != "pre_ln"]
    with pytest.raises(ValueError, match="Pre-LN has fewer than 3 seeds"):
        readme_table(data)

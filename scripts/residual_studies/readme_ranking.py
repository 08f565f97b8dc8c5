"""The tables that restate the ranking's archived ``ranking.json`` (the one home of its numbers), made from it:
README.md's "Which scheme should I use?" table (:func:`.ranking.readme_table`) and the results page's rows
(:func:`.ranking.rows_table`)::

    python scripts/readme_ranking.py           # exit status 1 and the tables that differ
    python scripts/readme_ranking.py --write   # rewrite them

Each block is the lines between ``<!-- BEGIN generated: NAME -->`` and ``<!-- END generated: NAME -->``, indented
as the BEGIN line is (the tables sit in list items). tests/test_readme.py fails when they differ.
"""
import argparse
import json
import os

from . import REPO
from .ranking import readme_table, rows_table

#: the archived ranking the tables restate
RANKING_JSON = os.path.join(REPO, "docs", "results", "2026-12-04-ranking", "ranking.json")
README = os.path.join(REPO, "README.md")
#: each page, its block's name and the function making the block's table from ``ranking.json``
BLOCKS = [(README, "ranking", readme_table),
          (os.path.join(REPO, "docs", "results", "2026-12-04-ranking.md"), "ranking-rows", rows_table)]


def render(text: str, table: str, name: str = "ranking") -> str:
    """``text`` with its block ``name`` replaced by ``table``, each line indented as the BEGIN marker.

    Raises:
        ValueError: no BEGIN ... END block of that name, or more than one.
    """
    begin, end = f"<!-- BEGIN generated: {name} -->", f"<!-- END generated: {name} -->"
    lines = text.split("\n")
    begins = [i for i, line in enumerate(lines) if line.strip() == begin]
    ends = [i for i, line in enumerate(lines) if line.strip() == end]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise ValueError(f"the page needs one '{begin}' line and, after it, one '{end}' line")
    indent = lines[begins[0]][:len(lines[begins[0]]) - len(lines[begins[0]].lstrip())]
    body = [indent + line for line in table.rstrip("\n").split("\n")]
    return "\n".join(lines[:begins[0] + 1] + body + lines[ends[0]:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the blocks that differ")
    args = parser.parse_args(argv)
    with open(RANKING_JSON, encoding="utf-8") as f:
        data = json.load(f)
    stale = 0
    for page, name, make in BLOCKS:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        table = make(data)
        new = render(text, table, name)
        if new == text:
            continue
        if args.write:
            with open(page, "w", encoding="utf-8") as f:
                f.write(new)
            print(f"rewrote the table '{name}' of {os.path.relpath(page, REPO)}")
            continue
        stale += 1
        print(f"{os.path.relpath(page, REPO)}'s table '{name}' differs from {os.path.relpath(RANKING_JSON, REPO)}; "
              f"--write rewrites it:\n\n{table}")
    return 1 if stale else 0

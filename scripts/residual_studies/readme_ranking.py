"""README.md's "Which scheme should I use?" table, made from the ranking's archived ``ranking.json`` (the one home of
its numbers; :func:`.ranking.readme_table`)::

    python scripts/readme_ranking.py           # exit status 1 and the table when README.md differs
    python scripts/readme_ranking.py --write   # rewrite README.md's block

The block is the lines between ``<!-- BEGIN generated: ranking -->`` and ``<!-- END generated: ranking -->``,
indented as the BEGIN line is (the table sits in a list item). tests/test_readme.py fails when they differ.
"""
import argparse
import json
import os

from . import REPO
from .ranking import readme_table

#: the archived ranking the README summarises
RANKING_JSON = os.path.join(REPO, "docs", "results", "2026-12-04-ranking", "ranking.json")
README = os.path.join(REPO, "README.md")
BEGIN, END = "<!-- BEGIN generated: ranking -->", "<!-- END generated: ranking -->"


def render(text: str, table: str) -> str:
    """``text`` with its ranking block replaced by ``table``, each line indented as the BEGIN marker.

    Raises:
        ValueError: no BEGIN ... END block, or more than one.
    """
    lines = text.split("\n")
    begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise ValueError(f"README.md needs one '{BEGIN}' line and, after it, one '{END}' line")
    indent = lines[begins[0]][:len(lines[begins[0]]) - len(lines[begins[0]].lstrip())]
    body = [indent + line for line in table.rstrip("\n").split("\n")]
    return "\n".join(lines[:begins[0] + 1] + body + lines[ends[0]:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite README.md's block")
    args = parser.parse_args(argv)
    with open(RANKING_JSON, encoding="utf-8") as f:
        table = readme_table(json.load(f))
    with open(README, encoding="utf-8") as f:
        text = f.read()
    new = render(text, table)
    if new == text:
        return 0
    if args.write:
        with open(README, "w", encoding="utf-8") as f:
            f.write(new)
        print(f"rewrote the ranking table of {README}")
        return 0
    print(f"README.md's ranking table differs from {os.path.relpath(RANKING_JSON, REPO)}; --write rewrites it:\n")
    print(table)
    return 1

"""Bring the results page's status line and selection table up to the archived report.

    python docs/results/2026-12-05-later-schemes-ranking/update-page.py

Reads ``ranking.md`` beside this script (the report the study's ``--report-only --archive`` step writes) and rewrites,
in ``../2026-12-05-later-schemes-ranking.md``, the counts and CPU-hours of the bold status line (this run's cells:
the report's less Pre-LN's reused ones, 3 selection cells, 1 final cell and 0.91 CPU-hours; the report's projection of
the measured rows' final cells; once every cell has finished, the paragraph's finished form) and the table between
``<!-- selection -->`` and ``<!-- /selection -->``. The prose under the table is the author's, not touched. Prints
what it wrote.
"""
import datetime
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = os.path.join(os.path.dirname(HERE), "2026-12-05-later-schemes-ranking.md")
#: Pre-LN's cells, the ranking's own, reused (the plan): in the report's counts, not this run's
REUSED_SELECTION, REUSED_FINAL, REUSED_CPU_HOURS = 3, 1, 0.91
#: the plan's cost arithmetic, CPU-hours in all, low and high
PLANNED = (9.9, 11.0)
SELECTION_CELLS, FINAL_CELLS = 30, 10


def main():
    report = open(os.path.join(HERE, "ranking.md"), encoding="utf-8").read()
    progress = re.search(r"Selection cells finished: (\d+) of \d+; rows with a chosen rate: (\d+) of \d+; final cells "
                         r"finished: (\d+) .*?CPU-hours spent on finished cells \(training and translation\): ([\d.]+); "
                         r"the final cells of the rows measured so far, projected from each row's measured cost per "
                         r"update: ([\d.]+) CPU-hours", report)
    if not progress:
        sys.exit("ranking.md has no progress line: regenerate it with the report command of the page's 'Commands'")
    selection = int(progress.group(1)) - REUSED_SELECTION
    measured = int(progress.group(2)) - 1  # rows with a chosen rate, less Pre-LN
    final = int(progress.group(3)) - REUSED_FINAL
    total = float(progress.group(4))
    projected = float(progress.group(5))
    spent = total - REUSED_CPU_HOURS
    table = re.search(r"\| row \| selected at \|.*?\n(?=\n)", report, re.S)
    if not table:
        sys.exit("ranking.md has no selection table ('How each row's learning rate was chosen')")
    page = open(PAGE, encoding="utf-8").read()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    done = selection == SELECTION_CELLS and final == FINAL_CELLS
    status = (f"**Status ({now}): {selection} of {SELECTION_CELLS} selection cells, {final} of {FINAL_CELLS} final cells"
              + (": the run is complete.**" if done else ".**"))
    page, n = re.subn(r"\*\*Status \([^)]*\): \d+ of \d+ selection cells, \d+ of \d+ final cells"
                      r"(: the run is complete)?\.?\*\*", status, page)
    assert n == 1, "the page's status line is not where this script expects it"
    left = f"{max(PLANNED[0] - spent, 0):.1f}-{max(PLANNED[1] - spent, 0):.1f}"
    if done:  # the whole paragraph, status line first
        paragraph = (f"{status}\nCPU-hours on this run's cells: {spent:.2f} (the archived report's total, {total:.2f}, "
                     f"includes Pre-LN's reused\ncells' {REUSED_CPU_HOURS}), within the plan's {PLANNED[0]}-{PLANNED[1]}; "
                     "the CPU time of cells lost in flight between sittings is not\nrecorded and is not in this figure "
                     "(machine and restarts: [machines.txt](2026-12-04-ranking/machines.txt)).")
        page, n = re.subn(r"\*\*Status .*?(?=\n\n)", lambda _: paragraph, page, count=1, flags=re.S)
        assert n == 1, "the page's status paragraph is not where this script expects it"
    else:
        page = _in_progress(page, spent, total, left, projected, measured)
    page, n = re.subn(r"<!-- selection -->\n.*?<!-- /selection -->",
                      lambda _: f"<!-- selection -->\n{table.group(0)}<!-- /selection -->", page, flags=re.S)
    assert n == 1, "the page has no <!-- selection --> block"
    open(PAGE, "w", encoding="utf-8").write(page)
    print(f"{status} this run's CPU-hours {spent:.2f}, {'none' if done else 'about ' + left} left; selection table of "
          f"{table.group(0).count(chr(10)) - 2} rows")


def _in_progress(page, spent, total, left, projected, measured):
    """The status paragraph's CPU-hours sentence while cells remain."""
    page, n = re.subn(
        r"CPU-hours on this run's finished cells: [\d.]+ \(the archived report's total, [\d.]+, includes Pre-LN's "
        r"reused cells'\n?\s*[\d.]+\); about [\d.]+-[\d.]+ left(.*?)report projects [\d.]+ CPU-hours for the "
        r"final cells of the \d+ later rows",
        lambda m: f"CPU-hours on this run's finished cells: {spent:.2f} (the archived report's total, {total:.2f}, "
                  f"includes Pre-LN's reused cells'\n{REUSED_CPU_HOURS}); about {left} left{m.group(1)}report projects "
                  f"{projected} CPU-hours for the final cells of the {measured} later rows", page, flags=re.S)
    assert n == 1, "the page's CPU-hours sentence is not where this script expects it"
    return page


if __name__ == "__main__":
    main()

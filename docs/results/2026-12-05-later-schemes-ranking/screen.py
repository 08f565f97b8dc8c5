"""The later schemes' pre-registered screen, applied to their report's ranking.json (default: the one beside this
file): each row's seed-2 valid nll against Pre-LN's seed-2 cell, at 3,000 updates and at equal compute, named
candidate / level / behind by the rule of ../2026-12-05-later-schemes-ranking-plan.md ("What is reported, and what
it may claim"), which this script restates and does not change:

* candidate for a 3-seed run: more than MARGIN (0.1 bit) below Pre-LN's seed-2 valid nll at 3,000 updates, or in
  the equal-compute reading at Pre-LN's training CPU-seconds measured in this study (its one cell, seed 2);
* behind Pre-LN at this budget: more than MARGIN above it at 3,000 updates;
* level with Pre-LN within seed noise: otherwise.

A row whose cell diverged or failed has no valid nll: it is named so and not screened (the later plan is silent on
it; the ranking's plan says a diverged run never wins).

The second equal-compute reading, at the CPU-seconds the 3-seed ranking reads from Pre-LN's three cells
(RANKING_PRE_LN_CPU_S), is printed beside it, as the plan asks, and decides nothing. Equal compute is read as the
report reads it: on the row's validation curve (every 250 updates) at Pre-LN's CPU-seconds divided by the row's
training CPU-s per update, linear between validations, never extrapolated; a row cheaper than Pre-LN shows its
3,000-update value, an upper bound (marked '<=').

    python docs/results/2026-12-05-later-schemes-ranking/screen.py [ranking.json]

prints a Markdown table; the results page quotes it.
"""
import json
import os
import sys

MARGIN = 0.1  # bits; the plan's screen (about 1.4 sd of the difference of two single cells)
#: "more than MARGIN": fairseq logs valid nll to 3 decimals, so a difference of exactly 0.100 occurs, and in
#: binary floating point 5.482 - 5.382 is 0.09999999999999964 while 5.382 + 0.1 is 5.481999999999999; the
#: differences are compared, with this much slack, far below the logs' 0.0005
EPS = 1e-9
PLAN_PRE_LN_NLL = 5.382  # Pre-LN's seed-2 cell as the plan names it (pre_ln-L12-w64-6dd91afe)
RANKING_PRE_LN_CPU_S = 1363.5  # 3,000 updates at the 3-seed ranking's Pre-LN CPU-s per update


def at_cpu_seconds(row, cpu_s):
    """(valid nll, is an upper bound) on ``row``'s curve after ``cpu_s`` training CPU-seconds, or (None, False)
    before its first validation: the report's reading (``ranking.equal_compute``) at other CPU-seconds."""
    curve = sorted((int(u), v) for u, v in (row["equal_compute"].get("curve") or {}).items())
    if not curve or not row.get("cpu_per_update"):  # no validation, or no measured cost: not read
        return None, False
    updates = cpu_s / row["cpu_per_update"]
    if updates >= curve[-1][0]:
        return curve[-1][1], updates > curve[-1][0]
    for (u0, v0), (u1, v1) in zip(curve, curve[1:]):
        if u0 <= updates <= u1:
            return v0 + (v1 - v0) * (updates - u0) / (u1 - u0), False
    return None, False


def screen(report):
    """[(label, lr, nll, diff, equal-compute reading, its diff, the ranking's reading, verdict)] for every row of
    the study (``report["chosen_lr"]``, its selection's rows) but Pre-LN's, those with a final cell in the
    report's order, then the others, and Pre-LN's (nll, CPU-seconds)."""
    rows = {r["row"]: r for r in report["rows"]}
    pre = rows["pre_ln"]
    pre_nll = pre["valid_nll"][0]
    if abs(pre_nll - PLAN_PRE_LN_NLL) > 5e-4:
        sys.exit(f"Pre-LN's valid nll in this report is {pre_nll}, not the plan's {PLAN_PRE_LN_NLL}: another cell?")
    pre_cpu_s = pre["cpu_per_update"] * pre["equal_compute"]["updates"]
    table = []
    for name in [*rows, *(n for n in report.get("chosen_lr", {}) if n not in rows)]:
        if name == "pre_ln":
            continue
        if name not in rows:  # no final cell in the report
            lr = report["chosen_lr"][name]
            table.append((name, lr, None, None, None, None, None, "pending: no final cell yet" if lr is not None
                          else "no rate: selection pending, or every rate diverged or failed (see the selection)"))
            continue
        row = rows[name]
        if row["diverged"] or row["failed"] or row["broken"]:  # no valid nll: named so, not ranked (the plan's
            # rule says nothing of such a cell; this is the ranking plan's "a diverged run never wins")
            table.append((row["label"], row.get("lr"), None, None, None, None, None,
                          "diverged" if row["diverged"] else "failed"))
            continue
        if row.get("lr") is None or row["valid_nll"][0] is None:
            table.append((row["label"], row.get("lr"), None, None, None, None, None, "pending"))
            continue
        nll = row["valid_nll"][0]
        # the report's own equal-compute reading, at this study's Pre-LN CPU-seconds
        ec, ec_bound = (row["equal_compute"].get("nll") or [None])[0], row["equal_compute"].get("bound", False)
        ranking_ec, ranking_bound = at_cpu_seconds(row, RANKING_PRE_LN_CPU_S)
        if nll - pre_nll < -MARGIN - EPS or (ec is not None and ec - pre_nll < -MARGIN - EPS):
            verdict = "candidate"
        elif nll - pre_nll > MARGIN + EPS:
            verdict = "behind"
        else:
            verdict = "level"
        table.append((row["label"], row["lr"], nll, nll - pre_nll, (ec, ec_bound),
                      None if ec is None else ec - pre_nll, (ranking_ec, ranking_bound), verdict))
    return table, pre_nll, pre_cpu_s


def main(path):
    with open(path) as f:
        table, pre_nll, pre_cpu_s = screen(json.load(f))

    def num(value, bound=False, sign=False):
        return "-" if value is None else ("<= " if bound else "") + (f"{value:+.3f}" if sign else f"{value:.3f}")

    print(f"Pre-LN, seed 2: {pre_nll:.3f} bits at 3,000 updates, {pre_cpu_s:.1f} training CPU-seconds; "
          f"margin {MARGIN} bit\n")
    print(f"| scheme | lr | valid nll, 3,000 updates | vs Pre-LN | at Pre-LN's {pre_cpu_s:.0f} CPU-s | vs Pre-LN | "
          f"at the ranking's {RANKING_PRE_LN_CPU_S:.0f} CPU-s | screen |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for label, lr, nll, diff, ec, ec_diff, ranking_ec, verdict in table:
        print(f"| {label} | {'-' if lr is None else f'{lr:g}'} | {num(nll)} | {num(diff, sign=True)} | "
              f"{num(*ec) if ec else '-'} | {num(ec_diff, sign=True)} | {num(*ranking_ec) if ranking_ec else '-'} | "
              f"{verdict} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                             "ranking.json"))

"""The pre-registered reading of nGPT's three seeds against Pre-LN's at 12+12 (../2026-12-06-ngpt-seeds-plan.md).

    python docs/results/2026-12-06-ngpt-seeds/verdict.py

Reads the archived cells (``cells/*/settings.json``, ``budgets/u3000/result.json``, ``curve.json``) of nGPT and
Pre-LN at lr 4e-3, seeds 2-4, 3,000 updates, from this folder and the two ranking pages' archives, and prints per
seed the valid nll at 3,000 updates and at Pre-LN's CPU-seconds (3,000 updates at the training CPU-seconds per
update of Pre-LN's three cells together, the study's ``training_cost``, as the ranking reads it;
each nGPT seed's curve read at the updates its own CPU-seconds per update buy, linear between validations every
250 updates), then the two readings of the plan with the study's paired 95% t-interval
(``scripts/residual_studies/ranking.py``: ``paired_difference``; the curve read by its ``_at``) and the verdict by the plan's rule.
"""
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(RESULTS)), "scripts"))
from residual_studies.ranking import _at, paired_difference, training_cost  # noqa: E402

ARCHIVES = [HERE, os.path.join(RESULTS, "2026-12-05-later-schemes-ranking"), os.path.join(RESULTS, "2026-12-04-ranking")]
SEEDS, LR, UPDATES = (2, 3, 4), 0.004, 3000


def cells():
    """``{(scheme, seed): cell folder}`` of the warm12 cells at LR of nGPT and Pre-LN with a final result."""
    found = {}
    for archive in ARCHIVES:
        for folder in sorted(glob.glob(os.path.join(archive, "cells", "*-L12-w64-*"))):
            settings = json.load(open(os.path.join(folder, "settings.json")))
            key = (settings["scheme"], settings["seed"])
            done = os.path.exists(os.path.join(folder, "budgets", f"u{UPDATES}", "result.json"))
            if settings["scheme"] in ("ngpt", "pre_ln") and settings["lr"] == LR and key[1] in SEEDS and done:
                found.setdefault(key, folder)
    return found


def main():
    found = cells()
    missing = [f"{s} seed {k}" for s in ("ngpt", "pre_ln") for k in SEEDS if (s, k) not in found]
    if missing:
        sys.exit(f"cells not archived yet: {', '.join(missing)}")
    result = {key: json.load(open(os.path.join(f, "budgets", f"u{UPDATES}", "result.json"))) for key, f in found.items()}
    curve = {key: json.load(open(os.path.join(f, "curve.json"))) for key, f in found.items()}
    cost = {key: training_cost(f, result[key]) for key, f in found.items()}  # (CPU-s, updates they trained)
    budget = UPDATES * sum(cost["pre_ln", k][0] for k in SEEDS) / sum(cost["pre_ln", k][1] for k in SEEDS)
    final = {key: r["stats"]["valid_nll_loss"] for key, r in result.items()}
    equal = {("pre_ln", k): final["pre_ln", k] for k in SEEDS}
    print(f"Pre-LN's training CPU-seconds for {UPDATES} updates, at the rate of seeds {SEEDS}: {budget:.1f}")
    print("| seed | nGPT | Pre-LN | nGPT - Pre-LN | nGPT's CPU-s per update | nGPT at Pre-LN's CPU-s (updates) | - Pre-LN |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for k in SEEDS:
        rate = cost["ngpt", k][0] / cost["ngpt", k][1]
        updates = min(budget / rate, UPDATES)
        equal["ngpt", k] = _at(curve["ngpt", k], updates)
        print(f"| {k} | {final['ngpt', k]:.3f} | {final['pre_ln', k]:.3f} | {final['ngpt', k] - final['pre_ln', k]:+.3f} "
              f"| {rate:.3f} | {equal['ngpt', k]:.3f} ({updates:.0f}) | {equal['ngpt', k] - equal['pre_ln', k]:+.3f} |")
    for label, values in (("at 3,000 updates", final), ("at Pre-LN's CPU-seconds", equal)):
        every = paired_difference(values, "ngpt", "pre_ln")
        fresh = paired_difference({key: v for key, v in values.items() if key[1] != 2}, "ngpt", "pre_ln")
        both_below = all(values["ngpt", k] < values["pre_ln", k] for k in SEEDS if k != 2)
        lower, upper = every["mean"] - every["ci"], every["mean"] + every["ci"]
        call = ("ahead" if upper < 0 and both_below else "behind" if lower > 0 else "level (not told apart)")
        print(f"{label}: seeds 2-4 paired {every['mean']:+.3f} ± {every['ci']:.3f} (95% t, n = {every['n']}); "
              f"fresh seeds 3-4 {fresh['mean']:+.3f} ± {fresh['ci']:.3f} (n = {fresh['n']}), both below their "
              f"Pre-LN partner: {'yes' if both_below else 'no'}; by the plan's rule: nGPT {call}")


if __name__ == "__main__":
    main()

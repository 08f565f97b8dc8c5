"""The speed benchmark's reports: the table of medians, paired ratios, goals and A/A noise of one run, the JSON
file, and the summary of several runs (``scripts/gpu_check.sh``)."""
import json
import os

from .speed_compare import goals_text
from .speed_harness import MODELS


def _by_baseline(results):
    """``{stock baseline: [plugin models of ``results`` measured against it]}``."""
    out = {}
    for res in results["shapes"].values():
        for name in res["models"]:
            base = MODELS[name]["baseline"]
            if base and name not in out.get(base, []):
                out.setdefault(base, []).append(name)
    return out


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def format_table(results):
    """Plain-text table of medians and paired ratios, then the goals."""
    lines = []
    head = (f"{'shape':<8} {'model':<20} {'params':>11} {'train tok/s':>12} {'x stock':>8} "
            f"{'peak MiB':>9} {'x stock':>8} {'gen sent/s':>11} {'x stock':>8}")
    lines.append(head)
    lines.append("-" * len(head))
    for shape_name, res in results["shapes"].items():
        for name, m in res["models"].items():
            rat = res["ratios"].get(name, {})

            def ratio(metric):
                v = rat.get(metric)
                return "base" if not rat else _fmt(v and v["paired_median"], ".3f")

            tr, me, ge = m["train_tokens_per_s"], m["peak_train_mem_bytes"], m["gen_sentences_per_s"]
            lines.append(
                f"{shape_name:<8} {name:<20} {m['params']:>11,} {_fmt(tr and tr['median'], '12.0f')} "
                f"{ratio('train'):>8} {_fmt(me and me['median'] / 2**20, '9.1f')} {ratio('memory'):>8} "
                f"{_fmt(ge and ge['median'], '11.2f')} {ratio('generate'):>8}"
            )
    lines.append("")
    lines.append("ratios: median over repetitions of (model / its stock baseline in the same repetition); "
                 + "; ".join(f"{', '.join(names)} vs {base}" for base, names in _by_baseline(results).items()))
    lines.append(f"throughput clock: {results['meta']['clock']}")
    lines.append(f"memory: {results['meta']['memory_measure']}")
    lines.append(f"goals: {goals_text(results['meta'].get('goals'))}")
    for shape_name, res in results["shapes"].items():
        for name, g in res["goals"].items():
            if not g:
                lines.append(f"  {shape_name:<8} {name:<10} no goal (its ratios are in the table above)")
                continue
            parts = []
            for metric, d in g.items():
                if d["value"] is None:
                    parts.append(f"{metric} n/a")
                else:
                    mark = "ok" if d["met"] else "MISSED"
                    parts.append(f"{metric} {d['value']:.3f} {d['comparison']} {d['target']} {mark}")
            lines.append(f"  {shape_name:<8} {name:<10} " + "; ".join(parts))
    lines.append("A/A noise (post_ln and pre_ln run fairseq's own layer code, so |ratio - 1| is "
                 "measurement noise):")
    for shape_name, res in results["shapes"].items():
        noise = res["aa_noise"]
        lines.append(f"  {shape_name:<8} " + "; ".join(
            f"{metric} +-{_fmt(v, '.3f')}" for metric, v in noise.items()))
    return "\n".join(lines)


def write_json(results, path):
    """``results`` as indented JSON (no NaN), atomically."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1, allow_nan=False)
    os.replace(tmp, path)


def load_text(load):
    """The 1/5/15-minute load averages as ``a/b/c``, ``n/a`` without them."""
    return "n/a" if load is None else "/".join(f"{x:.2f}" for x in load)


def print_gpu_summary(out, dtypes):
    """One line per dtype x shape x plugin model of ``out/bench_<dtype>.json``: ratios to the matching
    stock transformer, whether each goal was met, the A/A noise; then ALL GOALS MET or the misses."""
    print("== summary: ratio to the matching stock transformer (paired median); goal; A/A noise")
    misses = []
    for dtype in dtypes:
        path = os.path.join(out, f"bench_{dtype}.json")
        if not os.path.exists(path):
            print(f"{dtype:<5} no results")
            misses.append(f"{dtype}: no results")
            continue
        with open(path) as f:
            res = json.load(f)
        if not res["meta"].get("complete"):
            print(f"{dtype:<5} INCOMPLETE run: only {', '.join(res['shapes'])}")
        for shape, r in res["shapes"].items():
            noise = r["aa_noise"]
            for name, goals in r["goals"].items():
                parts = []
                for metric, g in goals.items():
                    if g["value"] is None:
                        parts.append(f"{metric} n/a")
                        continue
                    parts.append(f"{metric} {g['value']:.3f}{'' if g['met'] else ' MISSED'}")
                    if not g["met"]:
                        misses.append(f"{dtype} {shape} {name} {metric} {g['value']:.3f} "
                                      f"(goal {g['comparison']} {g['target']})")
                print(f"{dtype:<5} {shape:<7} {name:<10} " + ("  ".join(parts) or "no goal"))
            print(f"{dtype:<5} {shape:<7} A/A noise: train +-{noise['train'] or 0:.3f}  "
                  f"generate +-{noise['generate'] or 0:.3f}")
    print(f"goals: {goals_text()}")
    print("ALL GOALS MET" if not misses else "MISSED:\n  " + "\n  ".join(misses))

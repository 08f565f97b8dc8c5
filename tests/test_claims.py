"""The claims study (scripts/claims_study.sh -> fairseq_residual.tools.claims).

* The verdict rule on paired differences: holds / does not hold / inconclusive from the 95% t-interval.
* The claims computed from a synthetic grid (no training): each claim's direction, the divergence count,
  the paper's number beside it, and a report that lists every registered scheme's cells.
* One real, tiny run through the entry point (one scheme, two conditions, one seed, 30 updates, a
  300-pair copy of the shipped corpus): cells trained, translated, analysed; a second run skips them.
"""
import json
import math
import os
import subprocess
import sys

import pytest

from fairseq_residual.schemes import SCHEME_NAMES
from fairseq_residual.tools import claims

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "diffs, sign, word",
    [
        ([1.0, 1.2, 0.9], +1, "holds"),
        ([1.0, 1.2, 0.9], -1, "does not hold"),
        ([1.0, -1.2, 0.3], +1, "inconclusive"),
        ([1.0], +1, "inconclusive"),  # one seed: no interval
        ([1.0, None, 1.1, 0.95], +1, "holds"),  # a missing seed (diverged) is dropped
    ],
)
def test_verdict(diffs, sign, word):
    v = claims.verdict(diffs, sign)
    assert v["verdict"] == word
    vals = [d for d in diffs if d is not None]
    assert v["n"] == len(vals)
    if len(vals) > 1:
        sd = math.sqrt(sum((d - sum(vals) / len(vals)) ** 2 for d in vals) / (len(vals) - 1))
        assert v["sd"] == pytest.approx(sd)
        assert v["ci"] == pytest.approx(claims.T95[len(vals) - 1] * sd / math.sqrt(len(vals)))


def fake_cell(scheme, condition, seed, nll=None, bleu=None, status="ok"):
    depth = claims.CONDITIONS[condition][0]
    return dict(
        scheme=scheme, condition=condition, seed=seed, status=status, cell=f"{scheme}-{condition}-{seed}",
        stats={"valid_nll_loss": nll}, scores={"bleu": bleu, "chrf": 20.0} if status == "ok" else None,
        diagnostics={"grad_low_top_enc": 0.5, "grad_low_top_dec": 0.1, "cos_top_enc": 0.9, "cos_top_dec": 0.8},
        train_cpu_s=100.0,
        settings=dict(depth=depth, width=64, ffn_dim=128, heads=4, dropout=0.1, lr=1e-3, max_tokens=2048,
                      updates=600, beam=4, bleu_sentences=200),
    )


def synthetic_grid():
    """Post-LN diverges without warm-up and at 12 layers; Pre-LN loses ~1 bit without warm-up;
    ResiDual is unaffected; at 12 layers ResiDual beats Pre-LN by ~0.3 bits."""
    cells = []
    for seed, jitter in ((1, 0.0), (2, 0.05), (3, -0.04)):
        cells += [
            fake_cell("post_ln", "warm6", seed, 6.0 + jitter, 5.0),
            fake_cell("post_ln", "nowarm6", seed, status="diverged"),
            fake_cell("post_ln", "warm12", seed, status="diverged"),
            fake_cell("pre_ln", "warm6", seed, 6.1 + jitter, 4.8),
            fake_cell("pre_ln", "nowarm6", seed, 7.1 + jitter, 2.0 + jitter),
            fake_cell("pre_ln", "warm12", seed, 6.3 + jitter, 4.0),
            fake_cell("resi_dual", "warm6", seed, 6.2 + jitter, 4.5),
            fake_cell("resi_dual", "nowarm6", seed, 6.2 + 1.5 * jitter, 4.5 + jitter),
            fake_cell("resi_dual", "warm12", seed, 6.0 + jitter, 4.9 - jitter),
        ]
    return cells


def test_claims_from_a_synthetic_grid():
    cells = synthetic_grid()
    by = {(r["scheme"], r["condition"], r["seed"]): r for r in cells}
    found = {c["claim"]: c for c in claims.claims(by, ["warm6", "nowarm6", "warm12"])}
    assert found["without warm-up, Post-LN fails (6+6)"]["verdict"] == "holds"
    assert found["without warm-up, Post-LN fails (6+6)"]["measured"] == "3/3 seeds diverged"
    pre = found["without warm-up, Pre-LN is worse (valid_nll, 6+6)"]
    assert pre["effect"]["verdict"] == "holds" and pre["effect"]["mean"] == pytest.approx(1.0)
    assert pre["paper"] == "35.12 -> 32.28 BLEU"  # the paper's own numbers, from paper_results.json
    res = found["without warm-up, ResiDual is unaffected (valid_nll, 6+6)"]
    assert res["effect"]["verdict"] == "no effect resolved"
    less = found["without warm-up, ResiDual loses less than Pre-LN (valid_nll, 6+6)"]
    assert less["effect"]["verdict"] == "holds" and less["effect"]["mean"] < -0.9
    assert found["at 12+12 layers, Post-LN fails"]["verdict"] == "holds"
    beats = found["at 12+12 layers, ResiDual beats Pre-LN (valid_nll)"]
    assert beats["effect"]["verdict"] == "holds" and beats["effect"]["mean"] == pytest.approx(-0.3)
    # the same grid with ResiDual clearly worse at 12 layers: the claim does not hold
    for seed in (1, 2, 3):
        by[("resi_dual", "warm12", seed)]["stats"]["valid_nll_loss"] = 7.0 + 0.01 * seed
    found = {c["claim"]: c for c in claims.claims(by, ["warm6", "nowarm6", "warm12"])}
    assert found["at 12+12 layers, ResiDual beats Pre-LN (valid_nll)"]["effect"]["verdict"] == "does not hold"


def test_report_lists_every_scheme_with_mean_and_sd(tmp_path):
    cells = synthetic_grid()
    # every other registered scheme gets cells too: the report must pick it up from the registry
    for scheme in SCHEME_NAMES:
        if scheme not in ("post_ln", "pre_ln", "resi_dual"):
            cells += [fake_cell(scheme, "warm6", s, 6.5, 3.0) for s in (1, 2, 3)]
    args = claims.build_parser().parse_args(["--out", str(tmp_path)])
    args.argv, args.out = ["--seeds", "1,2,3"], str(tmp_path)
    text = claims.write_report(args, cells, wall_s=60)
    for label in ("Post-LN", "Pre-LN", "ResiDual"):
        assert f"| warm6 | {label} | 3 |" in text
    for scheme in SCHEME_NAMES:
        from fairseq_residual.schemes import get_scheme

        assert f"| {get_scheme(scheme).label} |" in text
    assert "| nowarm6 | Post-LN | 3 | 3 | - | - |" in text  # diverged: counted, not averaged
    assert "6.10 ± 0.05" in text  # Pre-LN warm6 valid nll over the three seeds
    assert "as reported in arXiv 2304.14802" in text and "35.63" in text
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["cells"]) == len(cells)
    assert (tmp_path / "claims.png").stat().st_size > 10_000


def test_unknown_condition_is_refused():
    with pytest.raises(SystemExit):
        claims.build_parser().parse_args(["--conditions", "warm7"])


def test_a_tiny_real_run_trains_translates_analyses_and_resumes(tmp_path):
    data = tmp_path / "corpus"
    data.mkdir()
    for split, n in (("train", 300), ("valid", 20), ("test", 20)):
        for lang in ("de", "en"):
            with open(os.path.join(ROOT, "data", "ding-de-en", f"{split}.{lang}"), encoding="utf-8") as f:
                (data / f"{split}.{lang}").write_text("".join(next(f) for _ in range(n)), encoding="utf-8")
    out = tmp_path / "study"
    cmd = ["bash", os.path.join(ROOT, "scripts", "claims_study.sh"), "--data", str(data), "--out", str(out),
           "--schemes", "post_ln", "--conditions", "warm6,nowarm6", "--seeds", "1", "--updates", "30",
           "--warmup", "5", "--lr", "3e-3", "--width", "16", "--heads", "2", "--vocab-size", "200", "--bleu-sentences", "5",
           "--max-tokens", "512", "--log-interval", "1"]
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               PYTHON=sys.executable, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    saved = json.loads((out / "results.json").read_text())
    assert {(c["condition"], c["status"]) for c in saved["cells"]} == {("warm6", "ok"), ("nowarm6", "ok")}
    for cell in saved["cells"]:
        assert cell["scores"]["bleu"] is not None and cell["diagnostics"]["cos_top_dec"] is not None
        assert "--warmup-updates 1 " in cell["command"] if cell["condition"] == "nowarm6" else \
            "--warmup-updates 5 " in cell["command"]
    assert "without warm-up, Post-LN fails (6+6)" in (out / "results.md").read_text()
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0
    assert again.stdout.count("finished earlier (ok), skipped") + again.stderr.count(
        "finished earlier (ok), skipped") == 2

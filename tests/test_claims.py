"""The claims study (scripts/claims_study.sh -> residual_studies.claims_study, .claims, .claims_report).

* The verdict rule on paired differences: holds / does not hold / inconclusive from the 95% t-interval.
* The claims computed from a synthetic grid (no training): each claim's direction, the divergence count,
  the paper's number beside it, ablation rows, the claims at several budgets, and a report that lists
  every registered scheme's cells.
* The learning curve's plateau rule.
* One real, tiny run (one scheme, two conditions, one seed, 30 updates, a 300-pair head of the shipped
  corpus): started through the entry point and killed, resumed in-process: cells trained, translated,
  analysed; a second run skips them; a larger budget continues a cell; a learning curve of the same cell,
  whose uninterrupted model equals the killed and resumed one bit for bit.
"""
import json
import math
import os
import statistics
import subprocess

import pytest

import inprocess
from conftest import REPO, cli_env
from fairseq_residual.schemes import SCHEME_NAMES, colors
from residual_studies import claims, claims_report, claims_study, learning_curve, report, stats

ROOT = str(REPO)
TINY = ["--warmup", "5", "--lr", "3e-3", "--width", "16", "--heads", "2", "--vocab-size", "200",
        "--bleu-sentences", "5", "--max-tokens", "512", "--log-interval", "1"]


def study_in_process(capsys, *args):
    """The claims study (or its learning curves) on ``args`` in this process, as scripts/claims_study.py
    runs it; its printed output."""
    options = claims.parse_args([str(a) for a in args])
    main = learning_curve.main if options.learning_curve else claims_study.main
    code = main(options)
    out = capsys.readouterr()
    assert code == 0, out.out[-3000:] + out.err[-3000:]
    return out.out + out.err


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
    v = stats.verdict(diffs, sign)
    assert v["verdict"] == word
    vals = [d for d in diffs if d is not None]
    assert v["n"] == len(vals)
    if len(vals) > 1:
        sd = math.sqrt(sum((d - sum(vals) / len(vals)) ** 2 for d in vals) / (len(vals) - 1))
        assert v["sd"] == pytest.approx(sd)
        assert v["ci"] == pytest.approx(stats.t95(len(vals) - 1) * sd / math.sqrt(len(vals)))


@pytest.mark.parametrize("df, quantile", [(1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042), (120, 1.980)])
def test_t95_is_students_quantile(df, quantile):
    # two-sided 95% points of Student's t as printed in the NIST/SEMATECH e-Handbook, table 1.3.6.7.2
    assert stats.t95(df) == pytest.approx(quantile, abs=5e-4)


@pytest.mark.parametrize("df", [0, -1, 2.5, True])
def test_t95_refuses_bad_degrees_of_freedom(df):
    with pytest.raises(ValueError, match="positive integer"):
        stats.t95(df)


def test_mean_and_sd_text_never_prints_a_vanishing_mean_as_zero():
    assert stats.ms_text([5.20, 5.24, 5.16]) == "5.20 ± 0.04"
    assert stats.ms_text([2.8e-6, 4.4e-6]) == "3.6e-06 ± 1.1e-06"  # Post-LN's decoder gradient ratio, not 0.00
    assert stats.ms_text([0.0, 0.0]) == "0.00 ± 0.00" and stats.ms_text([0.004], 3) == "0.004"
    assert stats.ms_text([]) == "-"


def test_verdict_uses_t_beyond_ten_seeds():
    # eleven differences whose mean is 2.1 standard errors above zero: inside t(10)'s 2.228, outside 1.96
    z = [-1.5, -1.2, -0.9, -0.6, -0.3, 0.0, 0.3, 0.6, 0.9, 1.2, 1.5]
    unit = statistics.stdev(z)
    diffs = [2.1 / math.sqrt(11) + v / unit for v in z]
    v = stats.verdict(diffs, +1)
    assert v["mean"] / (v["sd"] / math.sqrt(11)) == pytest.approx(2.1)
    assert v["verdict"] == "inconclusive"
    assert stats.verdict([d + 0.2 for d in diffs], +1)["verdict"] == "holds"  # 2.76 standard errors: resolved


def test_the_scoring_sentence_names_every_signature_the_cells_were_scored_with():
    cells = [dict(settings=dict(beam=4, bleu_sentences=500),
                  scores=dict(bleu=1.0, bleu_signature=f"nrefs:1|tok:13a|version:{v}", chrf_signature="nc:6"))
             for v in ("2.6.0", "2.6.0", "2.4.0")] + [dict(settings=dict(beam=4, bleu_sentences=500), scores=None)]
    text = report.scoring_text(cells)
    assert text == ("sacreBLEU of beam-4 translations of the first 500 test sentences (detokenized, raw references); "
                    "BLEU signature `nrefs:1|tok:13a|version:2.4.0` / `nrefs:1|tok:13a|version:2.6.0`; "
                    "chrF signature `nc:6`.")
    assert report.scoring_text(cells[-1:]) == "No cell has been scored yet."
    del cells[0]["scores"]["chrf_signature"], cells[1]["scores"]["chrf_signature"], cells[2]["scores"]["chrf_signature"]
    assert report.scoring_text(cells).endswith("chrF signature not recorded.")


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
    assert less["paper"] == "-0.13 vs 2.84 BLEU"  # BLEU lost without warm-up, ResiDual vs Pre-LN, paper
    assert found["at 12+12 layers, Post-LN fails"]["verdict"] == "holds"
    beats = found["at 12+12 layers, ResiDual beats Pre-LN (valid_nll)"]
    assert beats["effect"]["verdict"] == "holds" and beats["effect"]["mean"] == pytest.approx(-0.3)
    assert beats["paper"] == "36.09 vs 35.18 BLEU" and found["at 12+12 layers, Post-LN fails"]["paper"] == "fail"
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
    text = claims_report.write_report(args, cells, wall_s=60)
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
    assert "Setup: shipped Ding de->en corpus (13,032 training pairs);" in text


def test_report_names_the_corpus_it_was_given(tmp_path, corpus_head):
    """A study on another corpus (--data) does not call it the shipped Ding corpus."""
    other = corpus_head(40, 8, 8)
    args = claims.build_parser().parse_args(["--out", str(tmp_path), "--data", str(other)])
    args.argv, args.out = ["--data", str(other)], str(tmp_path)
    text = claims_report.write_report(args, synthetic_grid(), wall_s=60)
    assert f"Setup: corpus {other} (40 training pairs);" in text and "Ding" not in text.split("## Cells")[0]


def test_ablation_rows_get_their_own_claims_label_and_cells():
    cells = synthetic_grid()
    row = claims.row_key("zeros")
    assert row == "resi_dual+zeros" and claims.resolve(row) == ("resi_dual", "--resi-dual-start-from zeros")
    for seed, jitter in ((1, 0.0), (2, 0.05), (3, -0.04)):  # x_d from zeros: 0.2 bits better than ResiDual
        cells.append(fake_cell(row, "warm6", seed, 6.0 + jitter, 4.6))
    by = {(r["scheme"], r["condition"], r["seed"]): r for r in cells}
    found = {c["claim"]: c for c in claims.claims(by, ["warm6", "nowarm6", "warm12"])}
    better = found["ablation: starting the dual stream from zeros instead of the embedding output improves "
                   "ResiDual (valid_nll, warm6)"]
    assert better["effect"]["verdict"] == "holds" and better["effect"]["mean"] == pytest.approx(-0.2)
    vs_pre = found["ablation: ResiDual, x_d from 0 beats Pre-LN (valid_nll, warm6)"]
    assert vs_pre["effect"]["mean"] == pytest.approx(-0.1) and vs_pre["effect"]["verdict"] == "holds"
    # the ablation's cell is ResiDual's cell with one more model option, in a folder of its own
    args = claims.build_parser().parse_args(["--ablations", "zeros"])
    assert claims.grid_rows(args) == ["post_ln", "pre_ln", "resi_dual", row]
    ns, depth = claims.cell_args(args, "warm6", 1, row)
    assert ns.extra_train_args == "--resi-dual-start-from zeros" and depth == 6
    assert claims.cell_args(args, "warm6", 1, "resi_dual")[0].extra_train_args == ""
    # every row of a figure has a colour of its own: the ablations' are none of the schemes'
    ablation_colors = [claims.row_color(claims.row_key(a)) for a in claims.ABLATIONS]
    assert len(set(ablation_colors)) == len(ablation_colors)
    assert not set(ablation_colors) & set(colors().values())


def test_claims_by_budget_table_has_one_column_per_budget():
    early = {(r["scheme"], r["condition"], r["seed"]): r for r in synthetic_grid()}
    late_cells = synthetic_grid()
    for r in late_cells:  # later, ResiDual falls behind Pre-LN at 12 layers
        if r["scheme"] == "resi_dual" and r["condition"] == "warm12":
            r["stats"]["valid_nll_loss"] = 6.8 + 0.01 * r["seed"]
    late = {(r["scheme"], r["condition"], r["seed"]): r for r in late_cells}
    table = claims_report.claims_by_budget({1000: early, 4000: late}, ["warm6", "nowarm6", "warm12"])
    header, _, *rows = table.splitlines()
    assert header == "| claim | 1000 updates | 4000 updates |"
    beats = next(r for r in rows if r.startswith("| at 12+12 layers, ResiDual beats Pre-LN (valid_nll)"))
    assert "| holds: -0.30" in beats and "| does not hold: +0.52" in beats
    fails = next(r for r in rows if r.startswith("| at 12+12 layers, Post-LN fails |"))
    assert fails.count("holds (3/3 seeds diverged)") == 2


def test_unknown_condition_or_ablation_is_refused():
    with pytest.raises(SystemExit):
        claims.build_parser().parse_args(["--conditions", "warm7"])
    with pytest.raises(SystemExit):
        claims.build_parser().parse_args(["--ablations", "ones"])


@pytest.mark.parametrize("values, tol, higher, expected", [
    ([1.0, 2.0, 3.0, 3.9, 4.0, 4.1, 4.0], 0.5, True, 400),   # rises, then flat within 0.5 from update 400
    ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], 0.5, True, None),  # still rising at the end: no plateau
    ([8.0, 7.0, 6.5, 6.3, 6.31, 6.29, 6.3], 0.05, False, 500),  # a loss: lower is better
    ([1.0, None, 3.0, 3.1, 3.0, 3.05, 3.0], 0.5, True, 400),  # a missing point is skipped
    ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 6.1], 0.5, True, None),  # near the best for two points only
    ([1.0, 2.0], 0.5, True, None),  # fewer than three points
])
def test_plateau(values, tol, higher, expected):
    updates = [100 * (i + 1) for i in range(len(values))]
    assert learning_curve.plateau(updates, values, tol, higher)[0] == expected


def test_running_mean():
    assert learning_curve.running_mean([1.0, 2.0, 6.0, None]) == [1.5, 3.0, 4.0, 6.0]


def _model(path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def _same_weights(a, b):
    wa, wb = _model(a), _model(b)
    return wa.keys() == wb.keys() and all(bool((wa[k] == wb[k]).all()) for k in wa)


@pytest.mark.slow
def test_a_tiny_real_run_killed_resumes_trains_translates_analyses_skips_and_continues(tmp_path, corpus_head,
                                                                                       capsys, monkeypatch):
    """One scheme, two conditions, one seed, 30 updates, through the entry point (the shell script, Python,
    fairseq-train): SIGKILL the whole study once its first cell has saved an intermediate checkpoint
    (--checkpoint-every 10); the same command (without --checkpoint-every, not a setting of the cell) resumes
    that cell from the checkpoint, not from update 0, and trains, translates and analyses both cells; again,
    it skips both; 40 updates continue the warm6 cell from its checkpoint; a learning curve of the same cell,
    trained at once from scratch, has its checkpoints, and its model at 30 updates is the killed and resumed
    cell's at 30, bit for bit (exact by construction: the same operations in the same order, one thread,
    MKL's alignment-independent mode, tests/conftest.py). After the kill, the study runs in-process and so do
    its cells' fairseq tools (tests/inprocess.py: the same commands, the functions their console scripts call);
    the killed run started fairseq-train as a process, through the same runner."""
    import glob
    import re
    import signal
    import time

    data = corpus_head(300, 20, 20)
    out = tmp_path / "study"
    base = ["--data", data, "--schemes", "post_ln", "--seeds", "1", *TINY]
    cmd = base + ["--out", out, "--conditions", "warm6,nowarm6", "--updates", "30"]

    # the entry point, one cell at a time, killed inside the first cell's training
    proc = subprocess.Popen(["bash", os.path.join(ROOT, "scripts", "claims_study.sh"), *map(str, cmd),
                             "--checkpoint-every", "10", "--jobs", "1"], env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while not glob.glob(str(out / "cells" / "*" / "checkpoint_*_*.pt")):
        assert proc.poll() is None and time.time() < deadline, "no intermediate checkpoint before the end"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    (killed,) = glob.glob(str(out / "cells" / "*"))
    assert not os.path.exists(os.path.join(killed, "train_state.json"))  # killed inside its first segment

    monkeypatch.setattr("residual_studies.cell.run_logged", inprocess.run_logged)
    study_in_process(capsys, *cmd)
    saved = json.loads((out / "results.json").read_text())
    assert {(c["condition"], c["status"]) for c in saved["cells"]} == {("warm6", "ok"), ("nowarm6", "ok")}
    assert os.path.basename(killed) in {c["cell"] for c in saved["cells"]}  # resumed in its own folder
    for cell in saved["cells"]:
        assert cell["scores"]["bleu"] is not None and cell["diagnostics"]["cos_top_dec"] is not None
        assert "--warmup-updates 1 " in cell["command"] if cell["condition"] == "nowarm6" else \
            "--warmup-updates 5 " in cell["command"]
    with open(os.path.join(killed, "train-u30.log"), encoding="utf-8") as f:
        loaded = [int(n) for n in re.findall(r"Loaded checkpoint .*\(epoch \d+ @ (\d+) updates\)", f.read())]
    assert loaded and loaded[-1] > 0  # the second fairseq-train started from the killed run's checkpoint
    assert "without warm-up, Post-LN fails (6+6)" in (out / "results.md").read_text()
    assert study_in_process(capsys, *cmd).count("finished earlier (ok), skipped") == 2

    # a larger budget continues the cell from its checkpoint at 30 updates
    text = study_in_process(capsys, *base, "--out", out, "--conditions", "warm6", "--updates", "40")
    assert "training on from 30 updates to 40 updates" in text
    (cell,) = json.loads((out / "results.json").read_text())["cells"]
    cell_dir = out / "cells" / cell["cell"]
    assert str(cell_dir) == killed  # warm6, the first cell, was the one killed
    assert cell["budget"] == 40 and [g["updates"] for g in json.loads(
        (cell_dir / "train_state.json").read_text())["segments"]] == [30, 40]
    assert (cell_dir / "budgets" / "u30" / "result.json").exists()  # the earlier budget is kept
    # (that a continued run is the run trained at once, bit for bit, is the killed cell's comparison below: the
    # same fairseq resume from a cell's checkpoint_last.pt)

    # the learning curve of the same cell, trained from scratch without a kill: a checkpoint every 10
    # updates, each scored; at 30 updates, the killed and resumed cell's model
    curve_args = [*base, "--out", out, "--conditions", "warm6", "--updates", "30", "--learning-curve",
                  "--curve-every", "10"]
    before = sorted(os.listdir(out / "cells"))
    dry = study_in_process(capsys, *curve_args, "--dry-run")  # names the cell, trains nothing
    assert sorted(os.listdir(out / "cells")) == before
    assert learning_curve.main(claims.parse_args([str(a) for a in curve_args + ["--report-only"]])) != 0
    assert "--report-only does not apply to --learning-curve" in capsys.readouterr().err
    study_in_process(capsys, *curve_args)
    (curve,) = json.loads((out / "learning_curve.json").read_text())["curves"]
    assert f"a checkpoint every 10: {out / 'cells' / curve['cell']}" in dry
    assert [p["updates"] for p in curve["points"]] == [10, 20, 30]
    assert all(p["bleu"] is not None and p["valid_nll"] is not None for p in curve["points"])
    assert curve["cell"] != cell["cell"]
    assert _same_weights(out / "cells" / curve["cell"] / "budgets" / "u30" / "checkpoint.pt",
                         cell_dir / "budgets" / "u30" / "checkpoint.pt")
    assert "Where each metric stops moving" in (out / "learning_curve.md").read_text()

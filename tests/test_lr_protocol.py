"""The claims study's per-row learning-rate protocol (``--lr-grid``), its ranking mode (``--rank``) and the
plateau rule of its budgets.

The selection rule and the ranking are checked on synthetic cells; the study's flow (selection, then the
fresh seeds at each row's chosen rate, the two protocols side by side) on the real cell logic with a
stand-in for fairseq-train whose valid nll depends on the scheme and the learning rate; one tiny real run
trains it all with fairseq.
"""
import json
import math
import os
import re
import shlex

import pytest

import inprocess
from residual_studies import cell, claims, claims_report, claims_study, grid, lr_protocol, ranking


def _result(scheme, condition, seed, nll, status="ok", lr=2e-3, bleu=1.0, updates=1000):
    depth = claims.CONDITIONS[condition][0]
    return dict(scheme=scheme, condition=condition, seed=seed, status=status, reason="", cell=f"{scheme}-{seed}",
                stats={"valid_nll_loss": nll}, scores={"bleu": bleu, "chrf": 10.0 * bleu},
                diagnostics=dict(grad_low_top_enc=1.0, grad_low_top_dec=2.0, cos_top_enc=0.5, cos_top_dec=0.6),
                train_cpu_s=10.0, budget=updates, reached=updates, train_s=10.0,
                settings=dict(scheme=scheme, depth=depth, width=64, ffn_dim=128, heads=4, dropout=0.1, lr=lr,
                              max_tokens=2048, updates=updates, beam=4, bleu_sentences=5, warmup=300,
                              clip_norm=0.0, seed=seed))


# --------------------------------------------------------------------------------------------------------------
# the selection rule


@pytest.mark.parametrize("nll_by_lr, chosen", [
    ({5e-4: ("ok", 6.2), 1e-3: ("ok", 6.0), 2e-3: ("ok", 6.1)}, 1e-3),      # the lowest valid nll
    ({1e-3: ("ok", 6.0), 2e-3: ("ok", 6.0), 4e-3: ("ok", 6.3)}, 1e-3),      # a tie: the smaller rate
    ({1e-3: ("ok", 6.5), 4e-3: ("diverged", 3.0)}, 1e-3),                   # a diverged run never wins
    ({1e-3: ("failed", None), 2e-3: ("ok", math.nan), 4e-3: ("ok", 7.0)}, 4e-3),  # nor a failed or NaN one
    ({1e-3: ("diverged", None), 2e-3: ("failed", None)}, None),             # nothing trained: no choice
])
def test_choose_takes_the_lowest_valid_nll_of_a_run_that_trained(nll_by_lr, chosen):
    lr, why = lr_protocol.choose(nll_by_lr)
    assert lr == chosen
    assert ("no learning rate" in why) == (chosen is None)


def test_selection_on_a_synthetic_grid_chooses_per_row_and_depth():
    """Post-LN is best at the smallest rate, Pre-LN at the largest, ResiDual in between; at 12 layers
    Pre-LN's best moves down; a no-warm-up condition takes its depth's choice."""
    nll = {("post_ln", 5e-4): 6.0, ("post_ln", 1e-3): 6.2, ("post_ln", 2e-3): 6.9, ("post_ln", 4e-3): None,
           ("pre_ln", 5e-4): 6.5, ("pre_ln", 1e-3): 6.3, ("pre_ln", 2e-3): 6.1, ("pre_ln", 4e-3): 5.9,
           ("resi_dual", 5e-4): 6.4, ("resi_dual", 1e-3): 6.0, ("resi_dual", 2e-3): 6.2, ("resi_dual", 4e-3): 6.6}
    grid_lrs = [5e-4, 1e-3, 2e-3, 4e-3]
    cells = {}
    for (row, lr), v in nll.items():
        cells[row, "warm6", lr] = _result(row, "warm6", 1, v, "ok" if v else "diverged", lr)
        deep = None if v is None else (v + 0.5 if (row, lr) == ("pre_ln", 4e-3) else v)
        cells[row, "warm12", lr] = _result(row, "warm12", 1, deep, "ok" if v else "diverged", lr)
    table, choices = lr_protocol.selection_table(["post_ln", "pre_ln", "resi_dual"], ["warm6", "nowarm6", "warm12"],
                                              grid_lrs, cells)
    assert {k: v[0] for k, v in choices.items()} == {
        ("post_ln", "warm6"): 5e-4, ("pre_ln", "warm6"): 4e-3, ("resi_dual", "warm6"): 1e-3,
        ("post_ln", "warm12"): 5e-4, ("pre_ln", "warm12"): 2e-3, ("resi_dual", "warm12"): 1e-3}
    assert lr_protocol.selection_conditions(["nowarm6", "warm12", "warm6"]) == ["warm6", "warm12"]
    assert "| Post-LN | warm6 | **6.000** | 6.200 | 6.900 | diverged | 0.0005 |" in table


# --------------------------------------------------------------------------------------------------------------
# the study's flow, on a stand-in for fairseq-train


#: valid nll by (scheme, learning rate): Post-LN learns best at 1e-3 and diverges at 4e-3, Pre-LN is best at
#: 4e-3; the seed and the warm-up move it a little
FAKE_NLL = {("post_ln", 1e-3): 6.0, ("post_ln", 4e-3): "nan", ("pre_ln", 1e-3): 6.4, ("pre_ln", 4e-3): 5.8}


class FakeTrain:
    """fairseq-train for ``run_logged``: the log lines of a run to ``--max-update`` and a checkpoint, with the
    valid nll of :data:`FAKE_NLL` (+0.01 x seed, +0.2 without warm-up)."""

    def __init__(self):
        self.calls = []

    def __call__(self, cmd, log_path, threads, append=False):
        opt = lambda name: cmd[cmd.index(name) + 1]  # noqa: E731
        scheme, lr, seed, updates = opt("--residual-scheme"), float(opt("--lr")), int(opt("--seed")), \
            int(opt("--max-update"))
        self.calls.append((scheme, lr, seed, int(opt("--warmup-updates")), updates))
        outcome = FAKE_NLL[scheme, lr]
        with open(log_path, "a" if append else "w", encoding="utf-8") as log:
            log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
            if outcome == "nan":
                log.write('| train_inner | {"num_updates": "1", "loss": "nan"}\n')
                log.write("FloatingPointError: gradients are Nan/Inf\n")
                return 1, 1.0
            nll = outcome + 0.01 * seed + (0.2 if opt("--warmup-updates") == "1" else 0.0)
            for u in range(1, updates + 1):
                log.write(f'| train_inner | {{"num_updates": "{u}", "loss": "{nll + 1}", '
                          f'"nll_loss": "{nll - 1 + u}"}}\n')
            log.write(f'| valid | {{"valid_loss": "{nll + 0.5}", "valid_nll_loss": "{nll}", '
                      f'"valid_ppl": "{2 ** nll}", "valid_num_updates": "{updates}"}}\n')
        with open(os.path.join(opt("--save-dir"), "checkpoint_last.pt"), "w") as f:
            f.write(str(updates))
        return 0, 1.0


@pytest.fixture
def fake_study(tmp_path, monkeypatch):
    """The claims study on :class:`FakeTrain`, without data preparation, translation or analysis."""
    fake = FakeTrain()
    monkeypatch.setattr(cell, "run_logged", fake)
    monkeypatch.setattr(cell, "translate_and_score", lambda *a, **k: {"bleu": 1.0, "chrf": 10.0})
    monkeypatch.setattr(cell, "analyze", lambda *a, **k: None)

    def start(args, log):
        args.out = os.path.abspath(args.out)
        os.makedirs(args.out, exist_ok=True)
        return dict(bin="bin", fingerprint="f", bleu_sentences=5, vocab=200)

    monkeypatch.setattr(grid, "start", start)

    def run(*argv):
        args = claims.parse_args(["--out", str(tmp_path / "study"), "--updates", "4", "--select-updates", "4",
                                  "--jobs", "1", *map(str, argv)])
        assert claims_study.study(args) == 0
        return tmp_path / "study"

    return fake, run


def test_each_row_trains_fresh_seeds_at_its_own_chosen_rate(fake_study):
    fake, run = fake_study
    out = run("--schemes", "post_ln,pre_ln", "--conditions", "warm6,nowarm6", "--seeds", "1,2",
              "--lr-grid", "1e-3,4e-3", "--tune-seeds", "2,3", "--lr", "1e-3")
    selection = [c for c in fake.calls if c[2] == 1 and c[3] == 300]
    assert sorted(selection) == [("post_ln", 1e-3, 1, 300, 4), ("post_ln", 4e-3, 1, 300, 4),
                                 ("pre_ln", 1e-3, 1, 300, 4), ("pre_ln", 4e-3, 1, 300, 4)]
    # the chosen rates differ per scheme; the no-warm-up condition uses warm6's choice; seed 2 at the fixed
    # rate 1e-3 is Post-LN's chosen cell too, trained once
    tuned = {(s, lr, seed, w) for s, lr, seed, w, _ in fake.calls if seed in (2, 3)}
    assert tuned == {("post_ln", 1e-3, 2, 300), ("post_ln", 1e-3, 3, 300), ("post_ln", 1e-3, 2, 1),
                     ("post_ln", 1e-3, 3, 1), ("pre_ln", 4e-3, 2, 300), ("pre_ln", 4e-3, 3, 300),
                     ("pre_ln", 4e-3, 2, 1), ("pre_ln", 4e-3, 3, 1), ("pre_ln", 1e-3, 2, 300), ("pre_ln", 1e-3, 2, 1)}
    assert len(fake.calls) == len(set(fake.calls))
    saved = json.loads((out / "results.json").read_text())
    assert saved["protocol"]["choices"]["post_ln warm6"][0] == 1e-3
    assert saved["protocol"]["choices"]["pre_ln warm6"][0] == 4e-3
    assert {(c["scheme"], c["settings"]["lr"]) for c in saved["protocol"]["cells"]} == {("post_ln", 1e-3),
                                                                                         ("pre_ln", 4e-3)}
    text = (out / "results.md").read_text()
    assert "## Each row at its own learning rate" in text and "## The claims under both protocols" in text
    assert "| Post-LN | warm6 | **6.010** | diverged | 0.001 |" in text
    # the fixed protocol's cells are the report's main grid, as without --lr-grid
    assert {(c["scheme"], c["settings"]["lr"]) for c in saved["cells"]} == {("post_ln", 1e-3), ("pre_ln", 1e-3)}

    # --report-only rebuilds the same report from the finished cells, training nothing
    n = len(fake.calls)
    run("--schemes", "post_ln,pre_ln", "--conditions", "warm6,nowarm6", "--seeds", "1,2", "--lr-grid",
        "1e-3,4e-3", "--tune-seeds", "2,3", "--lr", "1e-3", "--report-only")
    assert len(fake.calls) == n and json.loads((out / "results.json").read_text())["protocol"]["choices"] == \
        saved["protocol"]["choices"]


def test_dry_run_lists_the_selection_cells_and_trains_nothing(fake_study, capsys):
    fake, run = fake_study
    run("--schemes", "post_ln", "--conditions", "nowarm6,warm12", "--lr-grid", "1e-3,4e-3", "--dry-run")
    out = capsys.readouterr().out
    assert "post_ln warm6 seed 1 lr 0.004 (selection, 4 updates)" in out
    assert "post_ln warm12 seed 1 lr 0.001 (selection, 4 updates)" in out
    assert "then seeds 2,3,4 of every row and condition at the row's chosen learning rate" in out
    # the claims' grid at --lr is trained too (the report shows both protocols): its cells are listed and counted
    assert re.search(r"^post_ln nowarm6 seed 3: ", out, re.M) and re.search(r"^post_ln warm12 seed 1: ", out, re.M)
    assert ("6 cells at lr 0.002, 4 selection cells of 4 updates, then 6 at the chosen rates of 4 updates (a cell "
            "already finished under --out is skipped)") in out, out
    run("--schemes", "post_ln", "--rank", "warm12", "--lr-grid", "1e-3,4e-3", "--dry-run")
    out = capsys.readouterr().out
    assert not re.search(r"seed \d+: ", out)  # --rank trains no cell without a rate
    assert "2 selection cells of 4 updates, then 3 at the chosen rates" in out, out
    assert fake.calls == []


def test_rank_mode_ranks_every_row_at_its_chosen_rate(fake_study):
    fake, run = fake_study
    out = run("--schemes", "post_ln,pre_ln", "--rank", "warm6", "--lr-grid", "1e-3,4e-3", "--tune-seeds", "2,3")
    saved = json.loads((out / "ranking.json").read_text())
    assert [(r["row"], r["lr"], r["rank"]) for r in saved["rows"]] == [("pre_ln", 4e-3, 1), ("post_ln", 1e-3, 2)]
    assert all(c[3] == 300 for c in fake.calls)  # warm6 only, no fixed-protocol grid
    text = (out / "ranking.md").read_text()
    assert "How each row's learning rate was chosen" in text and (out / "ranking.png").exists()
    assert not (out / "results.md").exists()


def test_lr_from_trains_each_row_at_the_rate_another_ranking_chose(fake_study, tmp_path, capsys):
    """--lr-from: a second ranking (another width, a GPU) trains each row at the first ranking's chosen rate,
    read from its ranking.json (chosen_lr, also for rows not ranked yet), and refuses a row it has no rate for."""
    fake, run = fake_study
    first = run("--schemes", "post_ln,pre_ln", "--rank", "warm6", "--lr-grid", "1e-3,4e-3", "--tune-seeds", "2")
    saved = json.loads((first / "ranking.json").read_text())
    assert saved["chosen_lr"] == {"post_ln": 1e-3, "pre_ln": 4e-3}
    source = tmp_path / "first-ranking.json"
    source.write_text(json.dumps(saved))
    fake.calls.clear()
    args = claims.parse_args(["--out", str(tmp_path / "wide"), "--updates", "4", "--jobs", "1", "--width", "96",
                              "--schemes", "post_ln,pre_ln", "--rank", "warm6", "--seeds", "1",
                              "--lr-from", str(source)])
    assert claims_study.study(args) == 0
    assert sorted((s, lr, seed) for s, lr, seed, _, _ in fake.calls) == [("post_ln", 1e-3, 1), ("pre_ln", 4e-3, 1)]
    wide = json.loads((tmp_path / "wide" / "ranking.json").read_text())
    assert {r["row"]: r["lr"] for r in wide["rows"]} == wide["chosen_lr"] == {"post_ln": 1e-3, "pre_ln": 4e-3}
    assert {c["settings"]["width"] for c in wide["cells"]} == {96}
    assert f"Each row at the learning rate the ranking in {source} chose for it; seeds 1." in \
        (tmp_path / "wide" / "ranking.md").read_text()
    # a ranking written before chosen_lr existed: its ranked rows' rates
    del saved["chosen_lr"]
    source.write_text(json.dumps(saved))
    args = claims.parse_args(["--rank", "warm6", "--lr-from", str(source)])
    assert args.lr_by_row == {"post_ln": 1e-3, "pre_ln": 4e-3} and args.schemes == ["post_ln", "pre_ln"]
    args = claims.parse_args(["--rank", "warm6", "--sch", "pre_ln", "--lr-from", str(source)])  # abbreviated
    assert args.schemes == ["pre_ln"] and args.lr_by_row == {"pre_ln": 4e-3}
    for argv, message in [
        (["--schemes", "pre_ln,resi_dual", "--rank", "warm6"], "chose no rate for resi_dual (it has one for post_ln, "
                                                               "pre_ln): drop them from --schemes / --ablations"),
        (["--schemes", "pre_ln", "--rank", "warm6", "--ablations", "zeros"], "chose no rate for resi_dual+zeros"),
        (["--schemes", "pre_ln"], "--lr-from gives each row of a ranking the rate another ranking chose: add --rank"),
        (["--schemes", "pre_ln", "--rank", "warm6", "--lr-grid", "1e-3,2e-3"], "and drop --lr-grid and --lr"),
        (["--schemes", "pre_ln", "--rank", "warm6", "--lr", "1e-3"], "and drop --lr-grid and --lr"),
        (["--schemes", "pre_ln", "--rank", "warm12"], "chose its rates at warm6, not at --rank warm12: a rate chosen "
                                                      "at one depth or warm-up does not carry to another"),
    ]:
        with pytest.raises(SystemExit):
            claims.parse_args([*argv, "--lr-from", str(source)])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["--rank", "warm6", "--lr-from", str(tmp_path / "none.json")])
    assert "none.json: not a ranking's ranking.json (FileNotFoundError: no such file)" in capsys.readouterr().err
    # several rankings add up their rows (a later study's beside the first); they must agree on a shared row
    later = tmp_path / "later-ranking.json"
    later.write_text(json.dumps(dict(saved, chosen_lr={"pre_ln": 4e-3, "resi_dual": 2e-3, "b2t": None})))
    args = claims.parse_args(["--rank", "warm6", "--lr-from", f"{source},{later}"])
    assert args.lr_by_row == {"post_ln": 1e-3, "pre_ln": 4e-3, "resi_dual": 2e-3}
    assert args.schemes == ["post_ln", "pre_ln", "resi_dual"]
    later.write_text(json.dumps(dict(saved, chosen_lr={"pre_ln": 2e-3})))
    with pytest.raises(SystemExit):
        claims.parse_args(["--rank", "warm6", "--lr-from", f"{source},{later}"])
    assert (f"--lr-from: {source} chose 0.004 for pre_ln, {later} chose 0.002: drop one of the rankings, or those "
            "rows from --schemes / --ablations") in capsys.readouterr().err
    args = claims.parse_args(["--rank", "warm6", "--lr-from", f"{source},{later}", "--schemes", "post_ln"])
    assert args.lr_by_row == {"post_ln": 1e-3}  # a clash on a row not trained is no error


def test_a_report_read_while_the_selection_runs_chooses_nothing_and_says_what_has_finished(fake_study, capsys):
    """--report-only while selection cells are missing: a row without its whole grid has no rate yet (a choice
    on part of the grid would start its final cells at a rate the rest of the grid might beat), the progress
    section counts the cells and their measured cost, and no ranking is drawn before a final cell exists."""
    fake, run = fake_study
    out = run("--schemes", "post_ln,pre_ln", "--rank", "warm6", "--lr-grid", "1e-3,4e-3", "--tune-seeds", "2",
              "--dry-run")  # the study's folder, nothing trained
    study = ["--schemes", "post_ln,pre_ln", "--rank", "warm6", "--lr-grid", "1e-3,4e-3", "--tune-seeds", "2"]
    args = claims.parse_args(["--out", str(out), "--updates", "4", "--select-updates", "4", "--jobs", "1",
                              "--schemes", "post_ln", "--rank", "warm6", "--lr-grid", "1e-3,4e-3", "--tune-seeds",
                              "2"])
    assert claims_study.study(args) == 0  # Post-LN's selection and final cell only
    trained = list(fake.calls)
    args = claims.parse_args(["--out", str(out), "--updates", "4", "--select-updates", "4", *study,
                              "--report-only"])
    assert claims_study.study(args) == 0
    assert fake.calls == trained  # a report trains nothing
    text = (out / "ranking.md").read_text()
    assert "| Pre-LN | warm6 | - | - | - | pending: 0 of 2 selection cells finished |" in text
    assert "Selection cells finished: 2 of 4; rows with a chosen rate: 1 of 2; final cells finished: 1 of 1" in text
    # the stand-in reports 1 CPU-s per run: 4 updates (1e-3) and 1 update before NaN (4e-3), 0.625 s on average
    assert f"| Post-LN | 2 | 0.625 | 0.00 | {ranking.this_machine()} (2) |" in text


def test_the_archive_holds_each_finished_cells_small_files_and_resumes_the_study_elsewhere(fake_study, tmp_path):
    fake, run = fake_study
    archive = tmp_path / "archive"
    out = run("--schemes", "post_ln,pre_ln", "--rank", "warm6", "--lr-grid", "1e-3,4e-3", "--tune-seeds", "2",
              "--archive", archive)
    cells = sorted(os.listdir(out / "cells"))
    assert sorted(os.listdir(archive / "cells")) == cells and len(cells) == 6  # 4 selection + 2 final cells
    for name in cells:
        files = {os.path.relpath(os.path.join(d, f), archive / "cells" / name)
                 for d, _, fs in os.walk(archive / "cells" / name) for f in fs}
        assert not any(f.endswith((".pt", ".log")) for f in files), files
        assert {"settings.json", "train_state.json", "curve.json"} <= files
        if json.loads((archive / "cells" / name / "train_state.json").read_text())["status"] == "ok":
            assert json.loads((archive / "cells" / name / "curve.json").read_text())[-1][0] == 4
            # the training nll between validations: the stand-in logs nll - 1 + u at updates 1-4, validates at 4
            valid = json.loads((archive / "cells" / name / "curve.json").read_text())[-1][1]
            trained = json.loads((archive / "cells" / name / "train_curve.json").read_text())
            assert trained == [[4, pytest.approx(valid - 1 + 2.5)]]
        assert json.loads((archive / "cells" / name / "cost.json").read_text())["machine"] == ranking.this_machine()
    assert (archive / "ranking.md").read_text() == (out / "ranking.md").read_text()
    # a new machine: the archived cells in a new study folder, the same command trains nothing
    trained = len(fake.calls)
    moved = tmp_path / "elsewhere"
    (moved / "cells").mkdir(parents=True)
    for name in cells:
        import shutil

        shutil.copytree(archive / "cells" / name, moved / "cells" / name)
    args = claims.parse_args(["--out", str(moved), "--updates", "4", "--select-updates", "4", "--jobs", "1",
                              "--schemes", "post_ln,pre_ln", "--rank", "warm6", "--lr-grid", "1e-3,4e-3",
                              "--tune-seeds", "2"])
    assert claims_study.study(args) == 0
    assert len(fake.calls) == trained
    assert json.loads((moved / "ranking.json").read_text())["rows"] == json.loads(
        (out / "ranking.json").read_text())["rows"]
    # archived again from there (the cells have no logs now): every file as the first archive wrote it, the machine
    # a cell trained on included (a cell archived before the record has none, and gets none)
    for name, machine in ((cells[0], "Another CPU, 8 cores"), (cells[1], None)):
        cost = json.loads((moved / "cells" / name / "cost.json").read_text())
        cost.pop("machine")
        if machine:
            cost["machine"] = machine
        for folder in (moved, archive):
            (folder / "cells" / name / "cost.json").write_text(json.dumps(cost))
    again = tmp_path / "again"
    args = claims.parse_args(["--out", str(moved), "--updates", "4", "--select-updates", "4", "--jobs", "1",
                              "--schemes", "post_ln,pre_ln", "--rank", "warm6", "--lr-grid", "1e-3,4e-3",
                              "--tune-seeds", "2", "--report-only", "--archive", str(again)])
    assert claims_study.study(args) == 0
    for name in cells:
        for d, _, fs in os.walk(archive / "cells" / name):
            for f in fs:
                first = os.path.join(d, f)
                assert json.loads((again / os.path.relpath(first, archive)).read_text()) == json.load(open(first)), first


def test_a_second_study_in_the_same_folder_archives_its_own_cells_only(fake_study, tmp_path):
    """Rows added later to a study folder (the same data, Pre-LN's cells reused as the anchor) are archived
    apart: the second archive holds Pre-LN's and the new row's cells, not the first study's other rows'; the
    first study archived again afterwards holds its own cells, not the later rows'."""
    fake, run = fake_study
    first_archive, later = tmp_path / "first", tmp_path / "later"
    out = run("--schemes", "post_ln,pre_ln", "--rank", "warm6", "--lr-grid", "1e-3,4e-3", "--tune-seeds", "2")
    first = set(os.listdir(out / "cells"))
    trained = len(fake.calls)
    FAKE_NLL.update({("rezero", 1e-3): 6.2, ("rezero", 4e-3): 6.1})
    try:
        run("--schemes", "pre_ln,rezero", "--rank", "warm6", "--lr-grid", "1e-3,4e-3", "--tune-seeds", "2",
            "--archive", later)
        assert len(fake.calls) == trained + 3  # ReZero's two selection cells and seed 2; Pre-LN's are reused
        run("--schemes", "post_ln,pre_ln", "--rank", "warm6", "--lr-grid", "1e-3,4e-3", "--tune-seeds", "2",
            "--report-only", "--archive", first_archive)
    finally:
        del FAKE_NLL["rezero", 1e-3], FAKE_NLL["rezero", 4e-3]
    rezero = set(os.listdir(out / "cells")) - first
    pre_ln = {name for name in first if name.startswith("pre_ln-")}
    assert len(rezero) == 3 and len(pre_ln) == 3  # two selection cells and seed 2 each
    assert set(os.listdir(later / "cells")) == pre_ln | rezero
    assert set(os.listdir(first_archive / "cells")) == first
    assert "ReZero" not in (first_archive / "ranking.md").read_text()


def test_a_report_without_rows_leaves_no_plot_of_another_study(tmp_path):
    """ranking.write rewrites the Markdown and JSON always, the plots only when it has rows: a report without rows
    removes the plots another study left in the folder, so that they are not read or archived as its own."""
    for name in ("ranking.png", "ranking_curves.png"):
        (tmp_path / name).write_bytes(b"\x89PNG another study's")
    text = ranking.write(str(tmp_path), [], "warm12")
    assert "No row has a finished final cell yet" in text
    assert not (tmp_path / "ranking.png").exists() and not (tmp_path / "ranking_curves.png").exists()


@pytest.mark.parametrize("option", [["--tune-seeds", "2,3"], ["--select-seed=4"], ["--select-updates", "500"]])
def test_protocol_options_without_the_grid_are_refused_not_ignored(option, capsys):
    with pytest.raises(SystemExit):
        claims.parse_args(["--schemes", "pre_ln", *option])
    err = capsys.readouterr().err
    assert f"{option[0].split('=')[0]} belong(s) to the learning-rate protocol and would be ignored without " \
           "--lr-grid" in err


def test_a_selection_seed_among_the_fresh_seeds_is_refused(capsys):
    with pytest.raises(SystemExit):
        claims.parse_args(["--lr-grid", "1e-3,2e-3", "--tune-seeds", "1,2,3"])
    assert "must be fresh" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["--lr-grid", "1e-3,1e-3"])
    assert "twice" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------------------
# ranking


def test_ranking_orders_by_valid_nll_with_rows_diverged_in_most_seeds_last():
    results = [_result("pre_ln", "warm12", s, 6.0 + 0.01 * s) for s in (1, 2, 3)]
    results += [_result("resi_dual", "warm12", s, 5.9 + 0.01 * s) for s in (1, 2, 3)]
    results += [_result("post_ln", "warm12", s, 5.0, "diverged" if s > 1 else "ok") for s in (1, 2, 3)]
    rows = ranking.rank(results, "warm12")
    assert [(r["row"], r["rank"], r["diverged"]) for r in rows] == [("resi_dual", 1, 0), ("pre_ln", 2, 0),
                                                                    ("post_ln", 3, 2)]
    assert rows[0]["valid_nll"][0] == pytest.approx(5.92) and rows[0]["valid_nll"][2] == 3
    assert rows[0]["paper"] == 36.09 and rows[2]["paper"] == "fail"  # the paper's IWSLT14 12+12 numbers


# --------------------------------------------------------------------------------------------------------------
# the plateau rule of the budgets


@pytest.mark.parametrize("means, expected", [
    ({3000: 6.0, 4000: 5.99}, 4000),                 # less than 0.03 bits lower at 4000
    ({2000: 6.0, 3000: 5.99}, None),                 # never before 4000
    ({3000: 6.0, 4000: 5.9, 5000: 5.88}, 5000),      # still moving at 4000, stopped at 5000
    ({3000: 6.0, 4000: 6.1}, 4000),                  # above it: stopped
    ({3000: 6.0, 4000: 5.96, 5000: 5.93}, None),     # 0.03 or more below: moving
    ({3000: None, 4000: 5.99, 5000: None}, None),    # a budget without a number decides nothing
    ({2000: 6.0, 4000: 5.99}, None),                 # B - 1000 not measured
])
def test_plateau_rule(means, expected):
    assert claims_report.plateau(means) == expected


def test_the_report_shows_valid_nll_at_every_budget_with_the_plateau_column(tmp_path):
    by_budget = {}
    for b, nll in ((3000, 6.0), (4000, 5.99), (5000, 5.985)):
        by_budget[b] = {("pre_ln", "warm6", s): _result("pre_ln", "warm6", s, nll + 0.01 * s, updates=b)
                        for s in (1, 2, 3)}
        by_budget[b].update({("post_ln", "warm6", s): _result("post_ln", "warm6", s, nll - 0.1 * (b / 1000),
                                                             updates=b) for s in (1, 2, 3)})
    args = claims.parse_args(["--out", str(tmp_path), "--conditions", "warm6"])
    results = list(by_budget[5000].values())
    text = claims_report.write_report(args, results, wall_s=1, by_budget=by_budget)
    assert "| Pre-LN | warm6 | 6.020 | 6.010 | 6.005 | stopped at 4000 |" in text
    assert "| Post-LN | warm6 | 5.700 | 5.590 | 5.485 | moving |" in text
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["plateau"]["pre_ln warm6"]["plateau"] == 4000
    # one budget: no such table, the report as before
    assert "stopped moving" not in claims_report.write_report(args, results, wall_s=1,
                                                              by_budget={5000: by_budget[5000]})


# --------------------------------------------------------------------------------------------------------------
# one tiny real run


@pytest.mark.slow
def test_a_tiny_real_protocol_run(tmp_path, corpus_head, monkeypatch):
    """Pre-LN at two learning rates on a 300-pair corpus head, 6 updates each, then one fresh seed at the
    chosen rate: real fairseq training, translation and analysis (three cells); then the same cells ranked,
    training nothing more. The cells' fairseq tools run in-process (tests/inprocess.py: the same commands, the
    functions their console scripts call, one at a time; the killed study of tests/test_claims.py starts
    fairseq-train as a process, through the runner)."""
    monkeypatch.setattr(cell, "run_logged", inprocess.run_logged)
    data = corpus_head(300, 20, 20)
    base = ["--data", data, "--out", tmp_path / "study", "--schemes", "pre_ln", "--lr-grid", "1e-3,3e-3",
            "--tune-seeds", "2", "--updates", "6", "--select-updates", "6", "--warmup", "3", "--width", "16",
            "--heads", "2", "--vocab-size", "200", "--bleu-sentences", "5", "--max-tokens", "512",
            "--log-interval", "1", "--jobs", "2", "--lr", "1e-3"]  # the fixed protocol's cell is a selection cell
    args = claims.parse_args([str(a) for a in base + ["--conditions", "warm6", "--seeds", "1"]])
    assert claims_study.main(args) == 0
    saved = json.loads((tmp_path / "study" / "results.json").read_text())
    lr = saved["protocol"]["choices"]["pre_ln warm6"][0]
    assert lr in (1e-3, 3e-3)
    (tuned,) = saved["protocol"]["cells"]
    assert tuned["seed"] == 2 and tuned["settings"]["lr"] == lr and tuned["status"] == "ok"
    assert tuned["scores"]["bleu"] is not None and tuned["diagnostics"]["cos_top_dec"] is not None
    cells = sorted(os.listdir(tmp_path / "study" / "cells"))
    assert len(cells) == 3
    args = claims.parse_args([str(a) for a in base + ["--rank", "warm6"]])
    assert claims_study.main(args) == 0
    assert sorted(os.listdir(tmp_path / "study" / "cells")) == cells
    (row,) = json.loads((tmp_path / "study" / "ranking.json").read_text())["rows"]
    assert row["row"] == "pre_ln" and row["lr"] == lr and row["seeds"] == 1


# --------------------------------------------------------------------------------------------------------------
# equal compute, the curve's plateau and the paired differences


def test_a_cells_cost_counts_the_updates_its_recorded_process_trained(tmp_path):
    """A segment killed and run again records the CPU time of the process that finished it, which trained from
    where fairseq resumed (its log's "Loaded checkpoint ... @ 250 updates"), not from the segment's start; a
    "Loaded checkpoint" line of an earlier process in the same log does not count for a later one."""
    run_dir = tmp_path / "cell"
    run_dir.mkdir()
    (run_dir / "train_state.json").write_text(json.dumps({"segments": [
        {"start": 0, "updates": 1000, "train_cpu_s": 600.0, "log": "train-u1000.log"}]}))
    (run_dir / "train-u1000.log").write_text(
        "2026 | INFO | fairseq_cli.train | No existing checkpoint found /x/checkpoint_last.pt\n"
        '2026 | INFO | train_inner | {"num_updates": "25", "loss": "9.1"}\n'  # the killed process
        "2026 | INFO | fairseq.trainer | Loaded checkpoint /x/checkpoint_last.pt (epoch 3 @ 250 updates)\n")
    result = _result("pre_ln", "warm12", 2, 6.0)
    assert ranking.training_cost(str(run_dir), result) == (600.0, 750)
    log = (run_dir / "train-u1000.log").read_text()
    for starts, trained in (("$ fairseq-train a\n", 750), ("$ fairseq-train a\n$ fairseq-train b\n", 1000)):
        # each process the study starts writes its command line first: the one that finished the segment after
        # the resumed one started from scratch (its checkpoint gone) trained all 1,000 updates
        (run_dir / "train-u1000.log").write_text(starts[:starts.index("\n") + 1] + log + starts[starts.index("\n") + 1:]
                                                 + "2026 | INFO | fairseq_cli.train | No existing checkpoint found\n")
        assert ranking.training_cost(str(run_dir), result) == (600.0, trained), starts
    os.remove(run_dir / "train-u1000.log")  # an archive: its cost.json
    (run_dir / "cost.json").write_text(json.dumps({"train_cpu_s": 600.0, "trained_updates": 750}))
    assert ranking.training_cost(str(run_dir), result) == (600.0, 750)
    os.remove(run_dir / "cost.json")  # neither: the result's totals
    assert ranking.training_cost(str(run_dir), result) == (10.0, 1000)


def _cell_files(out, r, curve, cpu_per_update, train_curve=None):
    run_dir = out / "cells" / r["cell"]
    run_dir.mkdir(parents=True)
    (run_dir / "curve.json").write_text(json.dumps(curve))
    if train_curve is not None:
        (run_dir / "train_curve.json").write_text(json.dumps(train_curve))
    (run_dir / "cost.json").write_text(json.dumps({"train_cpu_s": cpu_per_update * r["reached"],
                                                   "trained_updates": r["reached"]}))


def test_the_report_names_rows_whose_cells_ran_on_other_machines_than_pre_lns():
    """CPU-seconds from different CPUs do not compare: the note names the rows not all on Pre-LN's one machine."""
    a, b = "AMD EPYC, 2 cores", "Intel Xeon, 2 cores"
    assert ranking.machine_note({"pre_ln": {"machines": [a]}, "resi_dual": {"machines": [a]}}) == ""
    note = ranking.machine_note({"pre_ln": {"machines": [a]}, "resi_dual": {"machines": [a]},
                                 "mhc": {"machines": [a, b]}, "t_fixup": {"machines": [b]}})
    assert note.startswith(f"The final cells trained on: {a}, {b}. Not all on Pre-LN's one recorded machine: mHC, "
                           "T-Fixup; their equal-compute reading at measured costs compares CPUs")
    assert "ResiDual" not in note and note.endswith("schemes.")
    note = ranking.machine_note({"pre_ln": {"machines": ["unrecorded"], "idle": {}}, "mhc": {"machines": [a]}})
    assert "unrecorded" in note and "mHC" in note and note.endswith("the reading at idle costs does not.")
    # an unrecorded machine is not Pre-LN's known one, even where Pre-LN's is unrecorded too
    note = ranking.machine_note({"pre_ln": {"machines": ["unrecorded"]}, "admin": {"machines": ["unrecorded"]},
                                 "mhc": {"machines": [a]}})
    assert "Not all on Pre-LN's one recorded machine: Admin, mHC;" in note


def test_a_cell_is_credited_to_this_machine_only_where_it_trained_here(tmp_path):
    """Its archived record, else this machine where its training logs are, else unrecorded."""
    cell = tmp_path / "cell"
    cell.mkdir()
    assert ranking.cell_machine(cell) is None  # no record, no logs: moved here without them
    (cell / "train-u1000.log").write_text("")
    assert ranking.cell_machine(cell) == ranking.this_machine()
    (cell / "cost.json").write_text(json.dumps({"train_cpu_s": 1.0, "trained_updates": 1, "machine": "Intel Xeon"}))
    assert ranking.cell_machine(cell) == "Intel Xeon"


def test_equal_compute_reads_each_row_at_pre_lns_cpu_seconds_and_the_curve_gives_the_plateau(tmp_path):
    """Pre-LN costs 0.5 CPU-s per update, hyper-connections 1.0 and ReZero 0.25: at Pre-LN's CPU-seconds for 3,000
    updates, hyper-connections are read at 1,500 updates (between two validations, linearly), ReZero at its 3,000
    (an upper bound: it would have trained 6,000). The plateau rule reads the seed-mean curve from 2,000."""
    updates = list(range(250, 3001, 250))
    results = []
    for row, rate, curve in (("pre_ln", 0.5, lambda u, s: 8 - u / 1000 + 0.01 * s),
                             ("hyper_connections", 1.0, lambda u, s: 9 - u / 500 + 0.01 * s),
                             ("rezero", 0.25, lambda u, s: 7.5 - min(u, 2000) / 1000 + 0.01 * s)):
        for seed in (2, 3, 4):
            r = _result(row, "warm12", seed, curve(3000, seed), updates=3000)
            # training nll 1 bit below the valid nll; ReZero's cells were archived before it was kept
            _cell_files(tmp_path, r, [[u, curve(u, seed)] for u in updates], rate,
                        None if row == "rezero" else [[u, curve(u, seed) - 1] for u in updates])
            results.append(r)
    found = ranking.equal_compute(str(tmp_path), results, 3000)
    assert found["pre_ln"]["train_nll"][0] == pytest.approx(4.03) and found["pre_ln"]["train_text"] == "4.030 ± 0.010"
    assert found["rezero"]["train_nll"] == (None, None, 0) and found["rezero"]["train_text"] == "-"
    assert found["pre_ln"]["updates"] == pytest.approx(3000) and not found["pre_ln"]["bound"]
    hc = found["hyper_connections"]
    assert hc["updates"] == pytest.approx(1500) and hc["nll"][0] == pytest.approx(9 - 3 + 0.03)
    assert hc["nll"][1] == pytest.approx(0.01) and hc["text"] == "6.030 ± 0.010"
    assert found["rezero"]["bound"] and found["rezero"]["updates"] == 3000
    assert found["rezero"]["nll"][0] == pytest.approx(5.53)
    assert found["rezero"]["plateau"] == 3000 and found["pre_ln"]["plateau"] is None  # 1 bit per 1,000: moving
    text = ranking.write(str(tmp_path), results, "warm12")
    assert "6.030 ± 0.010 at 1500 updates" in text and "an upper bound" in text
    assert "stopped at 3000" in text and "no plateau by 3000" in text
    # the lowest point of each seed-mean curve: Pre-LN's last validation, ReZero's first of its flat end
    assert found["pre_ln"]["lowest"] == (3000, pytest.approx(5.03), 0)
    assert found["rezero"]["lowest"] == (2000, pytest.approx(5.53), 0)
    assert "| 5.030 at 3000 | 4.030 ± 0.010 |" in text and "| 5.530 at 2000 | - |" in text
    assert (tmp_path / "ranking_curves.png").stat().st_size > 10_000
    assert "the same at idle costs" not in text
    # idle-machine ratios: hyper-connections 1.5x Pre-LN's time (idle ratio 1.0 for Pre-LN x 1.02 of noise), so
    # read at 1500 / (0.5 x 1.5 / 1.02) updates; no ratio for ReZero: no second reading
    idle = {"pre_ln": 1.02, "hyper_connections": 1.5 * 1.02}
    found = ranking.equal_compute(str(tmp_path), results, 3000, idle)
    hc = found["hyper_connections"]
    assert hc["updates"] == pytest.approx(1500) and hc["idle"]["updates"] == pytest.approx(2000)
    assert hc["idle"]["text"] == "5.030 ± 0.010" and found["pre_ln"]["idle"]["updates"] == pytest.approx(3000)
    assert found["rezero"]["idle"]["updates"] is None
    text = ranking.write(str(tmp_path), results, "warm12", idle=idle)
    assert "the same at idle costs" in text and "5.030 ± 0.010 at 2000 updates" in text


def test_a_cells_curves_are_its_validations_and_its_training_nll_between_them(tmp_path):
    """The mean of the train_inner records after each validation and up to the next; a resumed run's repeated
    updates count once, with the later record; a record without nll_loss is skipped."""
    lines = [f'| train_inner | {{"num_updates": "{u}", "nll_loss": "{10 - u / 100}"}}' for u in (25, 50, 75, 100)]
    lines += ['| valid | {"valid_nll_loss": "9.5", "valid_num_updates": "50"}',
              '| valid | {"valid_nll_loss": "9.0", "valid_num_updates": "100"}',
              '| train_inner | {"num_updates": "125", "loss": "8.0"}',
              '| train_inner | {"num_updates": "100", "nll_loss": "7.0"}',  # resumed from update 75
              '| train_inner | {"num_updates": "150", "nll_loss": "6.0"}',
              '| valid | {"valid_nll_loss": "8.5", "valid_num_updates": "150"}']
    (tmp_path / "train-u150.log").write_text("\n".join(lines) + "\n")
    valid, train = ranking.log_curves(str(tmp_path))
    assert valid == [[50, 9.5], [100, 9.0], [150, 8.5]]
    assert train == [[50, pytest.approx(9.625)], [100, pytest.approx(8.125)], [150, 6.0]]
    assert ranking.cell_curves(str(tmp_path)) == (valid, train)
    os.remove(tmp_path / "train-u150.log")  # an archived cell: its curve.json and train_curve.json
    assert ranking.cell_curves(str(tmp_path)) == ([], [])
    (tmp_path / "curve.json").write_text(json.dumps([[150, 8.5]]))
    (tmp_path / "train_curve.json").write_text(json.dumps([[150, 6.0]]))
    assert ranking.cell_curves(str(tmp_path)) == ([[150, 8.5]], [[150, 6.0]])
    # restored from that archive and trained on: the new segment's log adds its points, the archive keeps the rest
    (tmp_path / "train-u200.log").write_text('| train_inner | {"num_updates": "200", "nll_loss": "5.0"}\n'
                                             '| valid | {"valid_nll_loss": "8.0", "valid_num_updates": "200"}\n')
    assert ranking.cell_curves(str(tmp_path)) == ([[150, 8.5], [200, 8.0]], [[150, 6.0], [200, 5.0]])


def test_the_training_nll_column_averages_the_seeds_that_trained(tmp_path):
    """A diverged seed's training nll is left out, as its valid nll is; a seed archived without a training curve
    is missing, and the cell names how many seeds it averages; a row whose every seed diverged shows none."""
    results = []
    for row, seed, status, train in (("pre_ln", 2, "ok", 4.0), ("pre_ln", 3, "ok", 4.2), ("pre_ln", 4, "ok", None),
                                      ("rezero", 2, "ok", 4.5), ("rezero", 3, "diverged", 9.9),
                                      ("admin", 2, "diverged", 4.4), ("admin", 3, "diverged", 4.6)):
        r = _result(row, "warm12", seed, 5.0 if status == "ok" else None, status=status, updates=3000)
        _cell_files(tmp_path, r, [[3000, 5.0]], 0.5, None if train is None else [[3000, train]])
        results.append(r)
    found = ranking.equal_compute(str(tmp_path), results, 3000)
    assert found["pre_ln"]["train_text"] == "4.100 ± 0.141 (n = 2)"
    assert found["rezero"]["train_text"] == "4.500"
    assert found["admin"]["train_nll"] == (None, None, 0) and found["admin"]["train_text"] == "-"
    # the equal-compute reading averages the same seeds: none for a row whose every seed diverged
    assert found["rezero"]["nll"][2] == 1 and found["pre_ln"]["nll"][2] == 3
    assert found["admin"]["nll"] is None and not found["admin"]["trained"]
    assert ranking._equal({"equal_compute": found["admin"]}) == "- (no seed trained)"
    assert ranking._equal({"equal_compute": found["rezero"]}) == "5.000 at 3000 updates"


def test_the_lowest_point_of_a_curve_and_its_rise_after():
    """A curve that falls, bottoms out and rises (over-fitting): its lowest validation and the rise to the last;
    unmeasured points are skipped; the table says both."""
    curve = {250: 7.0, 500: 6.0, 750: None, 1000: 5.5, 1250: 5.6, 1500: float("nan"), 1750: 5.8}
    assert ranking.lowest_point(curve) == (1000, 5.5, pytest.approx(0.3))
    assert ranking.lowest_point({}) is None and ranking.lowest_point({250: None}) is None
    assert ranking._lowest({"equal_compute": {"lowest": (1000, 5.5, 0.3)}}) == "5.500 at 1000, then +0.300 by the end"
    assert ranking._lowest({"equal_compute": {"lowest": (3000, 5.0, 0)}}) == "5.000 at 3000"
    assert ranking._lowest({}) == "-"


def test_idle_costs_are_the_speed_benchmarks_paired_training_ratios(tmp_path, capsys):
    """Training time relative to stock Pre-LN = 1 / the median over repetitions of the paired throughput ratio;
    a file of several shapes, or none, is refused, and --idle-costs needs --rank."""
    from residual_studies.speed_compare import training_time_ratios

    def samples(*values):
        return {"samples": {"train_tokens_per_s": list(values)}}

    bench = {"shapes": {"study12": {"models": {"transformer_pre_ln": samples(100.0, 200.0, 100.0),
                                              "hyper_connections": samples(50.0, 80.0, 60.0)}}}}
    path = tmp_path / "idle.json"
    path.write_text(json.dumps(bench))
    ratios = training_time_ratios(str(path))
    assert ratios["transformer_pre_ln"] == 1.0 and ratios["hyper_connections"] == pytest.approx(1 / 0.5)
    bench["shapes"]["deep24"] = bench["shapes"]["study12"]
    path.write_text(json.dumps(bench))
    with pytest.raises(ValueError, match="2 shapes \\(study12, deep24\\); the training time ratios are read"):
        training_time_ratios(str(path))
    with pytest.raises(SystemExit):
        claims.parse_args(["--idle-costs", str(path)])
    assert "--idle-costs reads the equal-compute column of a ranking: add --rank" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["--rank", "warm12", "--idle-costs", str(path)])
    assert "2 shapes (study12, deep24)" in capsys.readouterr().err


def test_adjacent_rows_are_compared_on_seed_paired_differences():
    """Rows 0.2 bits apart with seed noise 0.01 are resolved; 0.005 apart with noise 0.05 are not."""
    results = [_result("pre_ln", "warm12", s, 6.0 + 0.01 * (s % 2)) for s in (2, 3, 4)]
    results += [_result("resi_dual", "warm12", s, 5.8 + 0.01 * (s % 3)) for s in (2, 3, 4)]
    results += [_result("post_ln", "warm12", s, 6.005 + 0.05 * (s - 3)) for s in (2, 3, 4)]
    rows = ranking.rank(results, "warm12")
    assert [r["row"] for r in rows] == ["resi_dual", "pre_ln", "post_ln"]
    assert rows[0]["vs_next"]["resolved"] and rows[0]["vs_next"]["mean"] == pytest.approx(-0.2, abs=0.02)
    assert not rows[1]["vs_next"]["resolved"] and "vs_next" not in rows[2]


def test_how_far_the_order_holds_between_pairs_budgets_and_the_one_seed_screen(tmp_path):
    """Three rows whose curves cross: Pre-LN leads at 1,000 updates, ResiDual at 2,000 and 3,000; ReZero is last
    throughout. ResiDual ends 0.3 bits below Pre-LN with 0.3 bits of seed noise (not told apart), the others over 1
    bit apart. Post-LN diverged in two of three seeds and is left out; ResiDual's fourth seed diverged at 1,500
    updates and is left out of its curve as of its valid nll. The selection's cells at the chosen rates order the
    rows as the final seeds do at 1,000 updates; a cell at a rate not chosen, or at another condition (either would
    reverse them), is not read."""
    updates = list(range(250, 3001, 250))
    noise = {2: -0.3, 3: 0.0, 4: 0.3}
    curves = {"pre_ln": lambda u, s: 7 - u / 1000 + noise[s],                 # 6.0, 5.0, 4.0 at 1000, 2000, 3000
              "resi_dual": lambda u, s: 7.3 - 1.2 * u / 1000 - noise[s] / 2,  # 6.1, 4.9, 3.7
              "rezero": lambda u, s: 8 - u / 1000}                             # last throughout
    results = []
    for row, curve in curves.items():
        for seed in (2, 3, 4):
            r = _result(row, "warm12", seed, curve(3000, seed), lr=4e-3, updates=3000)
            _cell_files(tmp_path, r, [[u, curve(u, seed)] for u in updates], 0.5)
            results.append(r)
    r = _result("resi_dual", "warm12", 5, 19.0, "diverged", lr=4e-3, updates=3000)
    _cell_files(tmp_path, r, [[u, 19.0] for u in updates if u <= 1500], 0.5)
    results.append(r)
    results += [_result("post_ln", "warm12", s, 9.0, "diverged" if s > 2 else "ok", lr=1e-3, updates=3000)
                for s in (2, 3, 4)]
    selected = [_result("pre_ln", "warm12", 1, 6.1, lr=0.004000000000000001),  # the chosen rate, up to rounding
                _result("resi_dual", "warm12", 1, 6.2, lr=4e-3), _result("resi_dual", "warm12", 1, 5.0, lr=2e-3),
                _result("rezero", "warm12", 1, 7.0, lr=4e-3), _result("rezero", "warm6", 1, 5.5, lr=4e-3)]
    lr_by_row = {"pre_ln": 4e-3, "resi_dual": 4e-3, "rezero": 4e-3, "post_ln": 1e-3}
    text = ranking.write(str(tmp_path), results, "warm12", lr_by_row, selected=selected)
    order = json.loads((tmp_path / "ranking.json").read_text())["order"]
    assert {tuple(p["rows"]): p["resolved"] for p in order["pairs"]} == {
        ("resi_dual", "pre_ln"): False, ("resi_dual", "rezero"): True, ("pre_ln", "rezero"): True}
    # (concordant, discordant, pairs): crossed between 1,000 and 2,000 updates
    assert order["within_training"] == {"1000": [2, 1, 3], "2000": [3, 0, 3]}
    assert order["one_seed"] == {"updates": 1000, "at_u": [3, 0, 3], "final": [2, 1, 3]}
    assert "Not told apart: ResiDual / Pre-LN." in text
    assert ("at 1000 updates 2 of 3 pairs in the same order, 1 reversed (Kendall's tau-a 0.33); at 2000 updates 3 "
            "of 3 pairs in the same order, 0 reversed (Kendall's tau-a 1.00)") in text
    assert "the seeds' noise alone): 3 of 3 pairs in the same order, 0 reversed" in text


@pytest.mark.parametrize("first, second, expected", [
    ({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 3, "c": 2}, (2, 1, 3)),
    ({"a": 1, "b": 1, "c": 2}, {"a": 1, "b": 2, "c": 3}, (2, 0, 3)),     # a tie is neither: tau-a 2/3
    ({"a": math.nan, "b": 1, "c": 2}, {"a": 1, "b": 2, "c": 3}, (1, 0, 1)),  # NaN and None are left out
    ({"a": 1, "b": None}, {"a": 1, "b": 2}, (0, 0, 0)),
])
def test_same_order_counts_concordant_and_discordant_pairs(first, second, expected):
    assert ranking.same_order(first, second) == expected


def test_the_order_is_read_against_the_papers_table_and_in_bleu():
    """The paper's IWSLT14 12+12 BLEU orders T-Fixup (35.45) above DeepNorm (35.39) above Pre-LN (35.18), and its
    failed Post-LN last; here Pre-LN is lowest: its two pairs with T-Fixup and DeepNorm are named as reversed, the
    other four agree. A row without a paper number (ReZero) is in no pair."""
    results = [_result(row, "warm12", s, nll + 0.001 * s, bleu=bleu + 0.01 * s) for row, nll, bleu in
               (("pre_ln", 5.0, 4.0), ("t_fixup", 5.1, 4.2), ("deepnorm", 5.2, 3.9), ("post_ln", 7.0, 0.1),
                ("rezero", 4.0, 5.0)) for s in (2, 3, 4)]
    rows = ranking.rank(results, "warm12")
    found = ranking.order_stability(rows, results, "warm12", 3000)
    assert {p["rows"]: p["agrees"] for p in found["paper"]} == {
        ("pre_ln", "t_fixup"): False, ("pre_ln", "deepnorm"): False, ("pre_ln", "post_ln"): True,
        ("t_fixup", "deepnorm"): True, ("t_fixup", "post_ln"): True, ("deepnorm", "post_ln"): True}
    text = ranking.order_text(found)
    assert ("of 6 pairs of rows with a number in the paper's IWSLT14 table, 4 are in the paper's order (its higher "
            "BLEU, here the lower valid nll), 2 reversed: Pre-LN / T-Fixup (here Pre-LN is lower by 0.100 bits ± "
            "0.000, beyond the seed spread); Pre-LN / DeepNorm (here Pre-LN is lower by 0.200") in text
    # BLEU orders Pre-LN / T-Fixup the other way too: one pair of ten reversed against the valid nll
    assert found["bleu_order"] == (9, 1, 10) and all(p["bleu"]["resolved"] for p in found["pairs"])
    assert ("In BLEU:** 10 of 10 pairs differ beyond the seed spread; the rows' BLEU order (higher first) against "
            "their valid-nll order: 9 of 10 pairs in the same order, 1 reversed") in text


def test_a_reversed_pair_without_common_seeds_says_so():
    """Admin (the paper's 35.67) behind Pre-LN (35.18) on other seed numbers: reversed, with nothing to pair."""
    results = [_result("pre_ln", "warm12", s, 5.0 + 0.01 * s) for s in (2, 3, 4)]
    results += [_result("admin", "warm12", s, 5.5 + 0.01 * s) for s in (5, 6, 7)]
    found = ranking.order_stability(ranking.rank(results, "warm12"), results, "warm12", 3000)
    assert [p["agrees"] for p in found["paper"]] == [False]
    assert "1 reversed: Pre-LN / Admin (no seed in common here)." in ranking.order_text(found)

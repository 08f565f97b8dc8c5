"""The study tooling ``scripts/residual_studies``: not loaded by the plugin, and its shared parts (the one
divergence rule, the one training-log parser, the one generate-output reader, the configs' values, the
benchmark runs' names)."""
import math
import subprocess
import sys

import pytest

from conftest import REPO
from residual_studies import commands, divergence, logs

@pytest.mark.slow
@pytest.mark.parametrize("module", ["fairseq_residual", "fairseq_residual.model"])
def test_loading_the_plugin_does_not_import_the_tools(module):
    code = (f"import sys, {module}; loaded = sorted(m for m in sys.modules if m.startswith("
            f"('residual_studies', 'fairseq_residual.analyze', 'matplotlib'))); print(loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("text, reason", [
    ("epoch 003:  50 / 1100 loss=nan, nll_loss=nan, ppl=nan", "nan/inf loss"),
    ('{"loss": "inf", "nll_loss": "3.1"}', "nan/inf loss"),
    ("FloatingPointError: gradients are Nan/Inf", "NaN/Inf gradients (FloatingPointError)"),
    ("WARNING | gradients are Nan/Inf", "NaN/Inf gradients"),
    ("FloatingPointError: Minimum loss scale reached (0.0001).", "NaN/Inf gradients (FloatingPointError)"),
    ("| Minimum loss scale reached (0.0001)", "fp16 minimum loss scale reached"),
    ("Fatal error: gradients norm exceeded threshold", "fatal: limit exceeded"),
    ("NaN detected in output", "NaN detected"),
    ("epoch 001 | loss 4.2 | nll_loss 3.1", None),
    ("RuntimeError: out of memory", None),
])
def test_one_divergence_rule_for_log_lines(text, reason):
    assert divergence.line_sign(text) == reason


def test_the_last_line_showing_divergence_is_quoted():
    text = 'raise FloatingPointError("gradients are Nan/Inf")\nFloatingPointError: gradients are Nan/Inf\nbye\n'
    assert divergence.log_sign(text) == ("NaN/Inf gradients (FloatingPointError)",
                                         "FloatingPointError: gradients are Nan/Inf")
    assert divergence.log_sign("all fine\n") is None


RISING, FALLING = (9.0, 12.0), (9.5, 9.1)


@pytest.mark.parametrize("nll, vocab, train, diverged", [
    (6.5, 4000, RISING, False), (12.5, 4000, RISING, True), (12.5, 4000, (9.0, 9.0), True),
    (math.nan, 4000, None, True), (math.inf, None, None, True), (12.5, None, RISING, False),
    (None, 4000, RISING, False),
    # above the uniform guess but falling: a model a few updates old, untrained rather than diverged
    (8.85, 300, FALLING, False), (8.85, 300, None, False),
])
def test_one_divergence_rule_for_the_valid_loss(nll, vocab, train, diverged):
    assert (divergence.loss_sign(nll, vocab, train) is not None) == diverged


def test_train_log_parser_reads_fairseq_train_and_hydra_logs(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(
        "2026 | INFO | fairseq_cli.train | num. shared model params: 1,234 (num. trained: 1,234)\n"
        '2026 | INFO | train_inner | {"epoch": 1, "num_updates": "10", "loss": "9.5", "wps": "100", '
        '"train_wall": "1"}\n'
        '[2026-01-01 00:00:00,000][train_inner][INFO] - {"epoch": 1, "num_updates": "20", "loss": "8.5"}\n'
        '[2026-01-01 00:00:00,000][valid][INFO] - {"epoch": 1, "valid_loss": "8.0", "valid_nll_loss": "7.5", '
        '"valid_ppl": "181", "valid_num_updates": "20"}\n'
        '2026 | INFO | train | {"epoch": 1, "train_loss": "9.0"}\n'
        "2026 | INFO | train_inner | {broken json\n"
    )
    log = logs.read_train_log(path)
    assert [r["num_updates"] for r in log["train_inner"]] == ["10", "20"]
    assert log["train"] == [{"epoch": 1, "train_loss": "9.0"}] and log["params"] == 1234
    curves = logs.loss_curves(path)
    assert curves["train"] == [(10, 9.5), (20, 8.5)] and curves["valid"] == [(20, 8.0, 7.5, 181.0)]
    assert logs.read_train_log(tmp_path / "missing.log") == {"train_inner": [], "train": [], "valid": [],
                                                             "params": None}


def test_parse_train_log_keeps_last_entry_of_resumed_updates(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "2026-01-01 | INFO | fairseq_cli.train | num. shared model params: 1,234 (num. trained: 1,234)\n"
        '2026-01-01 | INFO | train_inner | {"epoch": 1, "loss": "9.5", "num_updates": "10"}\n'
        '2026-01-01 | INFO | valid | {"epoch": 1, "valid_loss": "9.0", "valid_nll_loss": "8.8", '
        '"valid_ppl": "445.7", "valid_num_updates": "10"}\n'
        "# resumed\n"
        '2026-01-01 | INFO | train_inner | {"epoch": 1, "loss": "9.4", "num_updates": "10"}\n'
        '2026-01-01 | INFO | train_inner | {"epoch": 2, "loss": "8.1", "num_updates": "20"}\n',
        encoding="utf-8")
    c = logs.loss_curves(str(log))
    assert c["params"] == 1234
    assert c["train"] == [(10, 9.4), (20, 8.1)]
    assert c["valid"] == [(10, 9.0, 8.8, 445.7)]


def test_generate_reader(tmp_path):
    path = tmp_path / "generate-test.txt"
    path.write_text("S-1\tein Haus\nT-1\ta house\nH-1\t-0.5\ta ▁house\nD-1\t-0.5\ta house\nP-1\t-0.1 -0.2\n"
                    "H-0\t-0.7\t\nGenerate test with beam=5: BLEU4 = 12.34, ...\n", encoding="utf-8")
    gen = logs.read_generate(path)
    assert gen["hyps"] == {1: "a ▁house", 0: ""} and gen["detok"] == {1: "a house"}
    assert gen["refs"] == {1: "a house"} and gen["sources"] == {1: "ein Haus"}
    assert gen["bleu_line"].startswith("Generate test with beam=5: BLEU4 = 12.34")


@pytest.mark.parametrize("name, tokens, precision, depth", [
    ("iwslt14_de_en", 4096, "fp32", 6), ("wmt14_en_de", 65536, "amp", 6), ("opus100", 65536, "fp16", 18),
])
def test_benchmark_config_values(name, tokens, precision, depth):
    assert commands.config_values(name) == dict(tokens_per_update=tokens, precision=precision, depth=depth)


def test_benchmark_run_names_have_one_pattern():
    name = commands.run_name("resi_dual", 12, 3)
    assert name == "resi_dual-12L-seed3"  # what scripts/train.sh makes from the same pattern
    assert commands.parse_run_name(name) == dict(scheme="resi_dual", layers=12, seed=3)
    assert commands.parse_run_name("resi_dual-12L") is None and commands.parse_run_name("x-1L-seedy") is None


def test_speed_goals_are_each_schemes_own():
    """Each scheme declares its speed goal (``speed_goal``): fairseq's own layers within 1% of stock in training,
    the schemes that add computation within 3%, the multi-stream schemes (n = 4) their own: 0.8x throughput and
    1.35x memory (docs/speed.md), their n = 2 and compiled variants the same; the speed benchmark's GOALS are
    theirs."""
    from fairseq_residual.schemes import SCHEMES
    from residual_studies.speed_compare import GOALS

    fairseq_own = dict(train=0.99, memory=1.05, generate=0.97)
    added = dict(train=0.97, memory=1.05, generate=0.97)
    streams = dict(train=0.80, memory=1.35, generate=0.80)
    want = {s.name: fairseq_own if s.name in ("post_ln", "pre_ln") else
            streams if s.name in ("hyper_connections", "mhc", "mhc_lite") else added for s in SCHEMES}
    # the n = 2 and compiled variants: their scheme's goal
    want.update(hyper_connections_n2=streams, mhc_n2=streams, hyper_connections_compiled=streams,
                mhc_compiled=streams)
    assert GOALS == want


def test_speed_baselines_follow_what_each_scheme_builds_on():
    """The speed harness races each scheme against the stock transformer of its ``builds_on`` (Peri-LN and the
    multi-stream schemes build on Pre-LN without fairseq's normalize_before); the two-stream variants are
    their scheme with one more option, measured only when named."""
    from fairseq_residual.schemes import SCHEMES
    from residual_studies.speed_compare import GOALS
    from residual_studies.speed_harness import DEFAULT_MODELS, MODELS, SHAPES, VARIANTS, model_cli_args

    stock = {"post_ln": "transformer_post_ln", "pre_ln": "transformer_pre_ln"}
    assert {s.name: MODELS[s.name]["baseline"] for s in SCHEMES} == {s.name: stock[s.builds_on] for s in SCHEMES}
    assert MODELS["peri_ln"]["baseline"] == "transformer_pre_ln"
    assert not set(VARIANTS) & set(DEFAULT_MODELS)
    for name, (scheme, options) in VARIANTS.items():
        assert MODELS[name]["baseline"] == MODELS[scheme]["baseline"] and GOALS.get(name) == GOALS.get(scheme)
        args = model_cli_args(name, SHAPES["iwslt6"], 1.0)
        assert args[args.index("--residual-scheme") + 1] == scheme and args[-len(options):] == options

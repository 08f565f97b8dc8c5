"""Tests of ``fairseq-residual-analyze`` (fairseq_residual/analyze.py) and of the
``translation_with_grad_norms`` task's ``--log-grad-norm-interval`` (fairseq_residual/tasks.py).

Everything runs on tiny data binarized by the test (fairseq-preprocess on the first lines of the
shipped corpus) and tiny deep models (16+16 layers, width 32). The tool's per-layer numbers are
checked against an independent computation: ``torch.autograd.grad`` through zero perturbations
added to each sub-layer output (instead of the tool's ``retain_grad``), fairseq's own
``return_all_hiddens`` states for the cosine similarities (instead of the tool's layer hooks), and
the dual stream rebuilt by hand from the embedding and the sub-layer outputs.

Why 16 layers: at initialisation the Post-LN < ResiDual ordering of the layer-1 / top-layer
gradient-norm ratio depends on the random seed at 8 layers (measured with this file's data and
sizes, seeds 1-6: it failed in one stack for seeds 1-3; decoder ratios 0.10-0.31 for Post-LN vs
0.26-0.40 for ResiDual); at 16 layers it held in both stacks for all six seeds (decoder 0.01-0.08
vs 0.18-0.30), so the test does not hang on one lucky seed.
"""
import json
import math
import os
import re
import subprocess
import sys
from argparse import Namespace

import pytest
import torch

from fairseq_residual.schemes import SCHEMES as SCHEME_REGISTRY
from fairseq_residual.schemes import get_scheme
from inprocess import fairseq_main
from process_guard import slow_fixture

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(ROOT, "fairseq_residual")
CORPUS = os.path.join(ROOT, "data", "ding-de-en")
BIN = os.path.dirname(sys.executable)
SCHEMES = ("post_ln", "pre_ln", "resi_dual")
LAYERS, WIDTH, FFN, HEADS, SEED, BATCHES, MAX_TOKENS = 16, 32, 64, 2, 3, 2, 300
ARCH = "residual_transformer_iwslt_de_en"


def _env():
    env = dict(os.environ)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"  # tiny models: a second thread only adds contention on 2 cores
    return env


def analyze_cli(*args):
    """Run the analysis command (``python -m``, so no installed console script is needed)."""
    return subprocess.run([sys.executable, "-m", "fairseq_residual.analyze", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, env=_env())


def _head(src, dst, n):
    with open(src, encoding="utf-8") as f:
        lines = f.read().split("\n")[:n]
    with open(dst, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


@slow_fixture(scope="module")
def data(tmp_path_factory):
    """Binarized tiny corpus: train 80 pairs, valid 24, and an empty 'test' subset."""
    root = tmp_path_factory.mktemp("analyze_data")
    for lang in ("de", "en"):
        _head(os.path.join(CORPUS, f"train.{lang}"), root / f"train.{lang}", 80)
        _head(os.path.join(CORPUS, f"valid.{lang}"), root / f"valid.{lang}", 24)
        (root / f"empty.{lang}").write_text("")
    fairseq_main("fairseq-preprocess", "-s", "de", "-t", "en", "--trainpref", root / "train", "--validpref",
                 root / "valid", "--testpref", root / "empty", "--joined-dictionary", "--destdir", root / "bin",
                 "--workers", "1")
    return str(root / "bin")


@pytest.fixture(scope="module")
def analysis(data, tmp_path_factory):
    """One CLI run over the three schemes; returns (report, output dir)."""
    out = tmp_path_factory.mktemp("analysis_out")
    proc = analyze_cli(data, "--arch", ARCH, "--residual-scheme", "all", "--layers", LAYERS,
                       "--embed-dim", WIDTH, "--ffn-dim", FFN, "--heads", HEADS, "--seed", SEED,
                       "--batches", BATCHES, "--max-tokens", MAX_TOKENS, "--output-dir", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "analysis.json", encoding="utf-8") as f:
        report = json.load(f)
    return report, out


# ------------------------------------------------------------------------------------------------
# the independent computation


def _build(data, scheme):
    from fairseq import options, tasks, utils

    utils.import_user_module(Namespace(user_dir=USER_DIR))
    argv = [data, "--user-dir", USER_DIR, "--task", "translation", "--arch", ARCH,
            "--residual-scheme", scheme, "--seed", str(SEED)]
    for stack in ("encoder", "decoder"):
        argv += [f"--{stack}-layers", str(LAYERS), f"--{stack}-embed-dim", str(WIDTH),
                 f"--{stack}-ffn-embed-dim", str(FFN), f"--{stack}-attention-heads", str(HEADS)]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    task = tasks.setup_task(args)
    torch.manual_seed(SEED)
    model = task.build_model(args)
    task.load_dataset("valid")
    itr = task.get_batch_iterator(
        dataset=task.dataset("valid"), max_tokens=MAX_TOKENS,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, required_batch_size_multiple=1, seed=SEED,
    ).next_epoch_itr(shuffle=True)
    batches = [b for _, b in zip(range(BATCHES), itr)]
    return model, task, batches


def _cos_mean(a, b, mask):
    """Mean over mask positions of the cosine of a and b (T x B x C) along C."""
    dot = (a * b).sum(-1)
    cos = dot / (a.norm(dim=-1) * b.norm(dim=-1))
    return cos[mask].double().sum().item(), int(mask.sum())


def direct(data, scheme):
    """Per-layer grad norms, consecutive cosines and (ResiDual) dual-stream maxima, computed directly.

    The loss of each batch is fairseq's label-smoothed CE of one forward pass
    (``model.encoder(..., return_all_hiddens=True)`` then ``model.decoder``), divided by the target
    tokens of all batches. Sub-layer output gradients: gradients with respect to zero tensors added
    to the outputs of self_attn / encoder_attn / fc2. Parameter gradients: ``torch.autograd.grad``,
    summed over the batches.
    """
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
    from fairseq.modules import FairseqDropout

    model, task, batches = _build(data, scheme)
    for m in model.modules():
        if isinstance(m, FairseqDropout):
            m.p = 0.0
    model.train()
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    n_tok = sum(b["ntokens"] for b in batches)
    stacks = {"encoder": model.encoder, "decoder": model.decoder}
    subs = {"encoder": ("self_attn", "fc2"), "decoder": ("self_attn", "encoder_attn", "fc2")}
    layer_params = [(s, i, p) for s, st in stacks.items() for i, l in enumerate(st.layers)
                    for p in l.parameters()]
    p_grad = [torch.zeros_like(p) for _, _, p in layer_params]
    a_sq = {(s, m): [0.0] * LAYERS for s in stacks for m in subs[s]}
    cos = {s: [[0.0, 0] for _ in range(LAYERS - 1)] for s in stacks}
    cos_d = {s: [[0.0, 0] for _ in range(LAYERS - 1)] for s in stacks}
    dual_max = {s: [0.0] * LAYERS for s in stacks}

    for sample in batches:
        deltas, outs, handles = {}, {}, []

        def perturb(key):
            def hook(module, inputs, output):
                first = output[0] if isinstance(output, tuple) else output
                delta = torch.zeros_like(first, requires_grad=True)
                deltas[key], outs[key] = delta, first.detach()
                return (first + delta,) + tuple(output[1:]) if isinstance(output, tuple) else first + delta
            return hook

        for s, st in stacks.items():
            for i, layer in enumerate(st.layers):
                for m in subs[s]:
                    handles.append(getattr(layer, m).register_forward_hook(perturb((s, m, i))))
        net = sample["net_input"]
        enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"], return_all_hiddens=True)
        net_output = model.decoder(net["prev_output_tokens"], encoder_out=enc,
                                   src_lengths=net["src_lengths"])
        for h in handles:
            h.remove()
        loss, _ = crit.compute_loss(model, net_output, sample, reduce=True)
        keys = sorted(deltas)
        grads = torch.autograd.grad(loss / n_tok, [deltas[k] for k in keys] + [p for _, _, p in layer_params])
        for k, g in zip(keys, grads):
            a_sq[k[0], k[1]][k[2]] += float(g.double().pow(2).sum())
        for j, g in enumerate(grads[len(keys):]):
            p_grad[j] += g

        # cosines from fairseq's own per-layer states (index 0: the embedding output)
        states = {"encoder": enc["encoder_states"], "decoder": net_output[1]["inner_states"]}
        masks = {"encoder": net["src_tokens"].ne(model.encoder.padding_idx).t(),
                 "decoder": net["prev_output_tokens"].ne(model.decoder.padding_idx).t()}
        for s in stacks:
            ys = [y.detach() for y in states[s][1:]]
            assert len(ys) == LAYERS
            for i in range(LAYERS - 1):
                total, count = _cos_mean(ys[i], ys[i + 1], masks[s])
                cos[s][i][0] += total
                cos[s][i][1] += count
            if scheme == "resi_dual":  # x_d = c * embedding + c * (every sub-layer output so far)
                c = stacks[s].residual.dual_scale
                x_d, xds = states[s][0].detach() * c, []
                for i in range(LAYERS):
                    for m in subs[s]:
                        x_d = x_d + c * outs[(s, m, i)]
                    xds.append(x_d)
                    dual_max[s][i] = max(dual_max[s][i], float(x_d.abs().max()))
                for i in range(LAYERS - 1):
                    total, count = _cos_mean(xds[i], xds[i + 1], masks[s])
                    cos_d[s][i][0] += total
                    cos_d[s][i][1] += count

    p_sq = {s: [0.0] * LAYERS for s in stacks}
    for (s, i, _), g in zip(layer_params, p_grad):
        p_sq[s][i] += float(g.double().pow(2).sum())
    return {
        "param_grad_norm": {s: [math.sqrt(v) for v in p_sq[s]] for s in stacks},
        "sublayer": {(s, m): [math.sqrt(v) for v in a_sq[s, m]] for s in stacks for m in subs[s]},
        "cos": {s: [t / n for t, n in cos[s]] for s in stacks},
        "cos_dual": {s: [t / max(n, 1) for t, n in cos_d[s]] for s in stacks},
        "dual_max": dual_max,
    }


def _by_scheme(report):
    return {m["scheme"]: m for m in report["models"]}


# ------------------------------------------------------------------------------------------------
# (1) the tool's numbers equal the direct computation


@pytest.mark.parametrize("scheme", SCHEMES)
def test_numbers_match_direct_computation(analysis, data, scheme):
    report, _ = analysis
    got = _by_scheme(report)[scheme]
    want = direct(data, scheme)
    assert got["batches"] == BATCHES and got["encoder_layers"] == got["decoder_layers"] == LAYERS
    close = dict(rel=2e-4, abs=1e-7)
    for s in ("encoder", "decoder"):
        assert got["param_grad_norm"][s] == pytest.approx(want["param_grad_norm"][s], **close)
        assert min(got["param_grad_norm"][s]) > 0
        assert got["cosine_consecutive"][s] == pytest.approx(want["cos"][s], **close)
        assert len(got["cosine_consecutive"][s]) == LAYERS - 1
    for (s, m), values in want["sublayer"].items():
        name = {"self_attn": "self_attn", "encoder_attn": "cross_attn", "fc2": "ffn"}[m]
        assert got["sublayer_output_grad_norm"][s][name] == pytest.approx(values, **close)
        assert min(values) > 0
    if scheme == "resi_dual":
        for s in ("encoder", "decoder"):
            dual = got["dual_stream"][s]
            assert dual["max_abs"] == pytest.approx(want["dual_max"][s], **close)
            assert got["cosine_consecutive_dual"][s] == pytest.approx(want["cos_dual"][s], **close)
            # the fp16 rule: c = 1 here, and max|x_d| is far below 0.1 * 65504 at init
            assert dual["scale"] == 1.0 and dual["safe_scale"] == 1.0
            assert dual["headroom"] == pytest.approx(65504.0 / max(want["dual_max"][s]), rel=2e-4)
    else:
        assert got["dual_stream"] is None and got["cosine_consecutive_dual"] is None


def test_the_range_report_follows_the_stream_a_scheme_declares(data, monkeypatch):
    """The ``dual_stream`` report is of the stream the stack residual declares (``ranged_stream``), whatever the
    scheme: SiameseNorm made to declare its stream y (scale 2, no LayerNorm eps) is reported like ResiDual's x_d."""
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    from fairseq_residual.analyze import analyze_model
    from fairseq_residual.residual import StreamRange
    from fairseq_residual.schemes.siamese_norm import SiameseStack

    monkeypatch.setattr(SiameseStack, "ranged_stream", lambda self: StreamRange("y", scale=2.0), raising=False)
    model, task, batches = _build(data, "siamese_norm")
    got = analyze_model(model, LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1),
                        batches)
    assert got["cosine_consecutive_dual"] == got["cosine_consecutive_streams"]["y"]
    for s in ("encoder", "decoder"):
        dual = got["dual_stream"][s]
        assert len(dual["max_abs"]) == LAYERS and min(dual["max_abs"]) > 0
        assert dual["scale"] == 2.0 and dual["max_abs_unscaled"] == dual["max_abs_peak"] / 2.0
        assert dual["ln_eps_relative"] is None  # no LayerNorm reads it


# ------------------------------------------------------------------------------------------------
# (2) the paper's claims, on the tiny deep model at initialisation


def test_post_ln_lower_layers_get_smaller_gradients_than_resi_dual(analysis):
    by = _by_scheme(analysis[0])
    for s in ("encoder", "decoder"):
        post = by["post_ln"]["grad_norm_low_top"][s]
        resi = by["resi_dual"]["grad_norm_low_top"][s]
        assert post < resi, (s, post, resi)
    # Post-LN's decoder: the vanishing gradient is strong even at 8 layers
    assert by["post_ln"]["grad_norm_low_top"]["decoder"] < 0.5 * by["resi_dual"]["grad_norm_low_top"]["decoder"]


def test_pre_ln_top_layers_are_more_alike_than_post_ln(analysis):
    by = _by_scheme(analysis[0])
    for s in ("encoder", "decoder"):
        assert by["pre_ln"]["cosine_consecutive"][s][-1] > by["post_ln"]["cosine_consecutive"][s][-1]


# ------------------------------------------------------------------------------------------------
# (3) JSON and plots


def test_json_and_plots_are_written(analysis):
    report, out = analysis
    # --residual-scheme all: every registered scheme, in the registry's order, with its label
    assert [m["label"] for m in report["models"]] == [s.label for s in SCHEME_REGISTRY]
    assert report["subset"] == "valid" and report["batches"] == BATCHES
    assert report["command"][:4] == ["fairseq-residual-analyze", report["data"], "--arch", ARCH]
    assert report["fp16_max"] == 65504.0
    # dual_stream_range.png: ResiDual is among them; streams.png: so are the multi-stream schemes
    expected = {"grad_norm_layers.png", "grad_norm_sublayers.png", "cosine_similarity.png",
                "dual_stream_range.png", "streams.png"}
    assert set(report["plots"]) == expected
    for name in expected:
        with open(out / name, "rb") as f:
            head = f.read(8)
        assert head == b"\x89PNG\r\n\x1a\n", name
        assert os.path.getsize(out / name) > 10_000, name


def test_safe_scale_rule():
    from fairseq_residual.analyze import safe_dual_scale, scale_ladder

    assert scale_ladder()[:7] == [1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01]
    assert safe_dual_scale(100.0, safety=0.1) == 1.0  # 100 <= 6550.4
    assert safe_dual_scale(10_000.0, safety=0.1) == 0.5  # 5000 <= 6550.4 < 10000
    assert safe_dual_scale(100_000.0, safety=0.1) == 0.05  # 5000 <= 6550.4 < 10000 (c = 0.1)
    assert safe_dual_scale(1e12, safety=0.1) is None


# ------------------------------------------------------------------------------------------------
# (5) --log-grad-norm-interval: per-layer metrics in fairseq's log, nothing when off


def _train(data, save_dir, interval, updates=4, extra=(), task="translation_with_grad_norms"):
    task_args = ["--task", task] + (["--log-grad-norm-interval", str(interval)] if task != "translation" else [])
    cmd = [data, "--user-dir", USER_DIR, *task_args, "--arch", "residual_transformer_tiny",
           "--residual-scheme", "post_ln", "--share-all-embeddings", "--optimizer", "adam",
           "--lr", "1e-3", "--max-tokens", "400", "--max-update", str(updates),
           "--required-batch-size-multiple", "1", "--criterion", "label_smoothed_cross_entropy",
           "--label-smoothing", "0.1", "--log-format", "json", "--log-interval", "1",
           "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--disable-validation",
           "--cpu", "--num-workers", "0", "--seed", "1", *extra]
    log = fairseq_main("fairseq-train", *cmd)
    inner = [json.loads(m.group(1)) for m in re.finditer(r"\| train_inner \| (\{.*\})", log)]
    epoch = [json.loads(m.group(1)) for m in re.finditer(r"\| train \| (\{.*\})", log)]
    return inner, epoch


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """A 2+2 Post-LN model trained 4 updates with --log-grad-norm-interval 2."""
    save = tmp_path_factory.mktemp("ckpt")
    inner, epoch = _train(data, save, interval=2)
    return str(save / "checkpoint_last.pt"), inner, epoch


def test_grad_norm_logging_puts_per_layer_metrics_in_the_log(trained):
    _, inner, epoch = trained
    assert [int(r["num_updates"]) for r in inner] == [1, 2, 3, 4]
    keys = {f"gnorm_{s}_L{i:02d}" for s in ("enc", "dec") for i in (1, 2)}
    keys |= {"gnorm_enc_low_top", "gnorm_dec_low_top"}
    for r in inner:
        logged = {k for k in r if k.startswith("gnorm_")}
        if int(r["num_updates"]) % 2 == 0:  # updates 2 and 4
            assert logged == keys, r
            values = {k: float(r[k]) for k in keys}
            assert all(v > 0 and math.isfinite(v) for v in values.values())
            assert values["gnorm_dec_low_top"] == pytest.approx(
                values["gnorm_dec_L01"] / values["gnorm_dec_L02"], rel=1e-3)
        else:  # not measured: absent, or null once fairseq's meter holds the key (reset to None)
            assert all(r[k] is None for k in logged), r
    assert keys <= {k[len("train_"):] for k in epoch[-1]}


def test_grad_norm_logging_off_logs_nothing(data, tmp_path):
    inner, epoch = _train(data, tmp_path, interval=0, updates=2)
    assert inner and epoch
    assert not [k for r in inner + epoch for k in r if "gnorm_enc" in k or "gnorm_dec" in k]


def test_grad_norm_logging_divides_out_the_fp16_loss_scale(trained, data, tmp_path):
    """fp16 gradients carry the loss scale (128 here): the logged norms must not.

    Same seed and data as the fp32 run of ``trained``: update 2's norms agree up to fp16 rounding
    (measured: within 0.4%). ``--memory-efficient-fp16`` because fairseq's ``--fp16`` optimizer needs
    CUDA; both keep the scale in the same ``DynamicLossScaler``.
    """
    fp16, _ = _train(data, tmp_path, interval=2, updates=2,
                     extra=("--memory-efficient-fp16", "--fp16-init-scale", "128"))
    fp32 = trained[1]
    assert float(fp16[1]["loss_scale"]) == 128 and int(fp16[1]["num_updates"]) == 2
    for key in ("gnorm_enc_L01", "gnorm_enc_L02", "gnorm_dec_L01", "gnorm_dec_L02"):
        assert float(fp16[1][key]) == pytest.approx(float(fp32[1][key]), rel=2e-2), key


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, model, sample_size, loss_scale=1.0):
        self.calls.append(sample_size)


def test_train_step_off_path_never_computes_norms(data, monkeypatch):
    """Interval 0: the norm code is never reached; interval 3: once per logged update only."""
    from fairseq import utils

    utils.import_user_module(Namespace(user_dir=USER_DIR))
    from fairseq_residual import tasks as plugin_tasks

    class Model(torch.nn.Module):
        def set_num_updates(self, n):
            pass

    class Optimizer:
        def backward(self, loss):
            loss.backward()

    weight = torch.nn.Parameter(torch.ones(()))

    def criterion(model, sample):
        return weight * 2.0, 5, {}

    for interval, expected in ((0, []), (3, [5, 5, 5])):
        recorder = _Recorder()
        monkeypatch.setattr(plugin_tasks, "log_layer_grad_norms", recorder)
        cfg = plugin_tasks.TranslationWithGradNormsConfig(data=data, log_grad_norm_interval=interval)
        task = plugin_tasks.TranslationWithGradNormsTask.setup_task(cfg)
        for update in range(9):
            for _micro_batch in range(2):  # --update-freq 2: logged on the first micro-batch only
                task.train_step({}, Model(), criterion, Optimizer(), update)
        assert recorder.calls == expected, interval


# ------------------------------------------------------------------------------------------------
# (4) bad input: clear messages, exit status 2, no traceback


@pytest.mark.parametrize("task, same", [("translation_with_grad_norms", True), ("translation", False)])
def test_resumed_run_equals_the_uninterrupted_one(data, tmp_path, task, same):
    """Stopped after 5 updates (in epoch 2) and resumed to 9, the run equals one trained to 9 at once, bit for
    bit, with the plugin's task; fairseq's own translation task sorts the resumed run's batches under
    another seed, and its weights differ (the negative control)."""
    import torch

    weights = {}
    for name, stops in (("once", (9,)), ("resumed", (5, 9))):
        for updates in stops:
            inner, _ = _train(data, tmp_path / name, interval=0, updates=updates, task=task, extra=(
                "--dropout", "0.1"))
        assert int(inner[-1]["num_updates"]) == 9 and int(inner[0]["epoch"]) >= (2 if name == "resumed" else 1)
        weights[name] = torch.load(tmp_path / name / "checkpoint_last.pt", map_location="cpu",
                                   weights_only=False)["model"]
    diff = max((weights["once"][k] - weights["resumed"][k]).abs().max().item() for k in weights["once"])
    assert (diff == 0.0) if same else (diff > 1e-6), diff


def test_checkpoint_mode_and_scheme_mismatch(trained, data, tmp_path):
    ckpt = trained[0]
    ok = analyze_cli(data, "--checkpoint", ckpt, "--residual-scheme", "post_ln", "--output-dir", tmp_path,
                     "--no-plots")
    assert ok.returncode == 0, ok.stderr[-2000:]
    with open(tmp_path / "analysis.json", encoding="utf-8") as f:
        model = json.load(f)["models"][0]
    assert model["scheme"] == "post_ln" and model["source"] == "checkpoint"
    assert model["encoder_layers"] == 2 and len(model["param_grad_norm"]["decoder"]) == 2

    from fairseq_residual.analyze import main

    bad = main([data, "--checkpoint", ckpt, "--residual-scheme", "resi_dual", "--output-dir", str(tmp_path)])
    assert bad == 2


def test_main_leaves_the_callers_logging_as_it_was(data, tmp_path):
    """Called in-process, the tool quiets fairseq's logging while it runs and restores the caller's after."""
    import logging
    import warnings

    from fairseq_residual.analyze import main

    fairseq_log, root = logging.getLogger("fairseq"), logging.getLogger()
    before = (fairseq_log.level, root.level, list(root.handlers), list(warnings.filters))
    fairseq_log.setLevel(logging.INFO)
    try:
        assert main([data, "--batches", "0", "--output-dir", str(tmp_path)]) == 2
        assert fairseq_log.level == logging.INFO
        assert (root.level, root.handlers, warnings.filters) == tuple(before[1:])
    finally:
        fairseq_log.setLevel(before[0])


def test_missing_checkpoint_message(data, tmp_path):
    proc = analyze_cli(data, "--checkpoint", tmp_path / "nope.pt", "--output-dir", tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "checkpoint not found" in proc.stderr and "nope.pt" in proc.stderr
    assert "checkpoint_best.pt" in proc.stderr and "--arch" in proc.stderr  # the fixes


def test_bad_input_messages(trained, data, tmp_path, capsys):
    from fairseq_residual.analyze import main

    fresh = ["--layers", "2", "--embed-dim", "16", "--ffn-dim", "16", "--heads", "2",
             "--output-dir", str(tmp_path)]
    cases = [
        ([data, "--checkpoint", trained[0], "--residual-scheme", "resi_dual", "--output-dir", str(tmp_path)],
         ["scheme mismatch", "trained with --residual-scheme post_ln",
          "--residual-scheme resi_dual was given", "pass --residual-scheme post_ln"]),
        ([data, "--subset", "test"] + fresh,
         ["subset 'test'", "has 0 sentences", "non-empty text file", "choose another --subset"]),
        ([str(tmp_path / "no_such_dir")] + fresh,
         ["data directory not found", "no_such_dir", "fairseq-preprocess"]),
        ([data, "--subset", "dev"] + fresh, ["subset 'dev' not found", "--validpref"]),
        ([data, "--activation-fn", "gleu"] + fresh, ["argument --activation-fn: invalid choice: 'gleu'"]),
        ([data, "--encoder-ffn-embd-dim", "8"] + fresh,
         ["unknown option(s): --encoder-ffn-embd-dim 8 (did you mean --encoder-ffn-embed-dim?)"]),
        ([data, "--checkpoint", trained[0], "--batchs", "2", "--output-dir", str(tmp_path)],
         ["unknown option --batchs (did you mean --batches?)"]),
        ([data, "--checkpoint", str(tmp_path / "result.json"), "--output-dir", str(tmp_path)],
         ["result.json is not a checkpoint: not a file torch.save wrote (it begins with b'{\"ce'"]),
        ([data, "--checkpoint", str(tmp_path / "weights.pt"), "--output-dir", str(tmp_path)],
         ["weights.pt is not a checkpoint: a PyTorch file but not a fairseq checkpoint (no 'model' entry; it holds "
          "w: a bare state_dict?)"]),
        ([data, "--checkpoint", os.path.dirname(trained[0]), "--output-dir", str(tmp_path)],
         ["is a folder, not a checkpoint: ", "(newest first); pass --checkpoint ", "or another of them"]),
        ([trained[0], "--output-dir", str(tmp_path)],  # the checkpoint where DATA goes
         [f"{trained[0]} is a file, not a data directory", f"--checkpoint {trained[0]}"]),
        ([data, "--checkpoint", str(tmp_path / "de-en.pt"), "--source-lang", "en", "--target-lang", "de",
          "--output-dir", str(tmp_path)],
         ["was trained de->en, but --source-lang/--target-lang ask for en->de: drop them",
          "or pass --source-lang de --target-lang en"]),
        ([data, "--device", "nodevice"] + fresh, ["--device nodevice: not a torch device"]),
        ([data, "--device", "meta"] + fresh, ["--device meta: this tool runs on cpu or cuda only"]),
    ] + ([([data, "--device", f"cuda:{torch.cuda.device_count()}"] + fresh,
           [f"CUDA device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}: use one of them"])]
         if torch.cuda.is_available() else [
        ([data, "--device", "cuda"] + fresh, ["--device cuda: this torch has no CUDA device", "use --device cpu"])])
    (tmp_path / "result.json").write_text('{"cell": "x"}\n')
    torch.save({"w": torch.zeros(2)}, tmp_path / "weights.pt")
    state = torch.load(trained[0], map_location="cpu", weights_only=False)  # as trained with -s de -t en
    state["cfg"]["task"]["source_lang"], state["cfg"]["task"]["target_lang"] = "de", "en"
    torch.save(state, tmp_path / "de-en.pt")
    for argv, phrases in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("fairseq-residual-analyze: error: "), err
        assert err.count("\n") == 1, err  # one line, no traceback
        for phrase in phrases:
            assert phrase in err, (phrase, err)
    assert not os.path.exists(tmp_path / "analysis.json")
    with pytest.raises(SystemExit) as exit_:  # argparse's own errors: one line, the closest choice
        main([data, "--residual-scheme", "resi-dual"] + fresh)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("fairseq-residual-analyze: error: argument --residual-scheme: invalid choice: 'resi-dual' "
                          "(choose from 'post_ln', ") and err.count("\n") == 1, err
    assert err.endswith("'all') (did you mean resi_dual?); fairseq-residual-analyze --help lists the options\n")
    other = torch.load(trained[0], map_location="cpu", weights_only=False)  # a list of two schemes: named first
    other["model"]["encoder.residual_scheme_id"] = torch.tensor(get_scheme("pre_ln").scheme_id)
    torch.save(other, tmp_path / "pre.pt")
    assert main([data, "--checkpoint", trained[0], str(tmp_path / "pre.pt"), "--residual-scheme", "post_ln",
                 "--output-dir", str(tmp_path / "mixed")]) == 2
    assert (f"--residual-scheme post_ln was given, but {tmp_path / 'pre.pt'} was trained with pre_ln: drop "
            f"--residual-scheme (each checkpoint's scheme is read from it)\n" in capsys.readouterr().err)
    assert not (tmp_path / "mixed").exists()
    with pytest.raises(SystemExit):  # the data directory after --checkpoint, which takes several paths
        main(["--checkpoint", trained[0], data])
    assert (f"no data directory: --checkpoint takes several paths and took {data}, a folder, as one; put the data "
            f"directory first" in capsys.readouterr().err)
    # a checkpoint is measured in its own direction, whichever way DATA's files are named, and the report says which
    state["cfg"]["task"]["source_lang"], state["cfg"]["task"]["target_lang"] = "en", "de"
    torch.save(state, tmp_path / "en-de.pt")  # an en->de model on these de-en files (a joined dictionary)
    for name, direction in (("de-en.pt", ("de", "en")), ("en-de.pt", ("en", "de"))):
        assert main([data, "--checkpoint", str(tmp_path / name), "--no-plots", "--output-dir", str(tmp_path)]) == 0
        report = json.loads((tmp_path / "analysis.json").read_text())
        assert (report["source_lang"], report["target_lang"]) == direction
        assert (report["models"][0]["source_lang"], report["models"][0]["target_lang"]) == direction


def test_the_summary_says_what_a_missing_gradient_ratio_means():
    from fairseq_residual.analyze import summary_table

    def run(enc):
        return dict(label="ReZero", encoder_layers=2, decoder_layers=2, cosine_consecutive={"encoder": [1.0],
                    "decoder": [1.0]}, grad_norm_low_top={"encoder": enc, "decoder": 0.446})

    lines = summary_table([run(None)]).splitlines()
    assert lines[1].split()[2] == "-" and lines[-1].startswith("(grad L1/top '-': the top layer's gradient norm is 0")
    assert len(summary_table([run(0.5)]).splitlines()) == 2  # every ratio measured: no note


def test_a_checkpoint_without_a_recorded_direction_is_measured_in_the_one_it_was_trained(trained, data, tmp_path,
                                                                                          caplog, capsys):
    """fairseq-train without -s/-t records no direction: the tool takes the one fairseq inferred from the data the
    checkpoint was trained on (here de-en), on a copy of the data named en-de too; where that folder is gone,
    --source-lang/--target-lang, else DATA's naming with a warning. Data whose dictionary has the same size but
    other words (two lines swapped) is refused, not measured."""
    import shutil

    from fairseq_residual.analyze import main

    assert torch.load(trained[0], map_location="cpu", weights_only=False)["cfg"]["task"]["source_lang"] is None
    reverse = tmp_path / "en-de"
    reverse.mkdir()
    for f in os.listdir(data):
        shutil.copy(os.path.join(data, f), reverse / f.replace(".de-en.", ".en-de."))

    def measured(*argv):
        assert main([str(reverse), *argv, "--no-plots", "--output-dir", str(tmp_path / "out")]) == 0
        report = json.loads((tmp_path / "out" / "analysis.json").read_text())
        return report["models"][0]["source_lang"], report["models"][0]["target_lang"]

    assert measured("--checkpoint", trained[0]) == ("de", "en")
    state = torch.load(trained[0], map_location="cpu", weights_only=False)
    state["cfg"]["task"]["data"] = str(tmp_path / "gone")
    torch.save(state, tmp_path / "gone.pt")
    assert measured("--checkpoint", str(tmp_path / "gone.pt"), "--source-lang", "de", "--target-lang", "en") == ("de", "en")
    with caplog.at_level("WARNING"):
        assert measured("--checkpoint", str(tmp_path / "gone.pt")) == ("en", "de")
    assert "does not record its direction" in caplog.text and "pass --source-lang/--target-lang" in caplog.text
    words = (reverse / "dict.en.txt").read_text().splitlines(keepends=True)
    words[0], words[1] = words[1], words[0]
    (reverse / "dict.en.txt").write_text("".join(words))
    capsys.readouterr()
    assert main([str(reverse), "--checkpoint", trained[0], "--output-dir", str(tmp_path / "o2")]) == 2
    assert (f"was trained on {data}, whose dict.en.txt differs from {reverse / 'dict.en.txt'}"
            in capsys.readouterr().err)
    assert not (tmp_path / "o2").exists()

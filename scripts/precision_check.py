#!/usr/bin/env python3
"""The fp16 range of every running sum of every registered scheme, at depth, at initialisation and after a
short training; and real fp16 training update by update.

Grid (default): for each scheme (``--schemes``, default: the registry) and each depth L (``--depths``, layers
per stack), a model of the ``residual_transformer_tiny`` preset with L+L layers (``--embed-dim`` /
``--ffn-dim`` / ``--heads``, default 64 / 128 / 4) is measured with
:class:`fairseq_residual.analyze.ranges.RunningSums` (the largest magnitude of every LayerNorm input and of
every tensor the residual protocol returns, both stacks, over ``--batches`` batches, eval mode): once at
initialisation, then again after ``--updates`` updates of fairseq's Trainer (Adam (0.9, 0.98), lr ``--lr``
after ``--warmup`` linear warm-up updates from 1e-7, label smoothing 0.1, clipping 1.0, dropout 0.1) on a
synthetic copy task (random source sentences of 4-16 tokens over a 256-word vocabulary, target = the source
reversed; ``--batch`` sentences per batch). Each result is the largest peak, with its site.

``--norm rmsnorm|dyt|derf`` builds every model with that norm in place of each LayerNorm (the model's
``--norm``; the peaks are then the inputs of those norms and the protocol's tensors as before); a scheme that
refuses the norm is reported as refused.

``--dtype fp32`` (default) measures in fp32, where nothing overflows: a peak above 65504 says the sum would
leave fp16's range. ``--dtype fp16`` / ``bf16`` runs the measurement forwards with the model in that dtype
(the CPU has the kernels too) and reports an overflow as ``inf``; training stays fp32.

``--overflow RUNS``: instead of the grid, train each run (a scheme, optionally with fairseq flags after
``:``) with fairseq's ``--memory-efficient-fp16`` (the model and its arithmetic in fp16; default loss scale
128, halved on each overflow) at ``--layers-fp16`` layers per stack for ``--updates`` updates, and log per
update the loss scale, whether the loss scaler skipped it, the largest forward running sum (fp16: inf if it
left the range), the largest scaled gradient of a running sum and of a parameter, with their sites: whether
an overflow is the scaler's (gradients times the loss scale) or a sum's (the forward).

Writes JSON (``--out``, rewritten after every measurement: a run cut short keeps what it finished) and, with
``--markdown``, a table per moment. Usage::

    python scripts/precision_check.py --out range.json --markdown range.md                  # CPU, fp32
    python scripts/precision_check.py --overflow "resi_dual,resi_dual:--resi-dual-scale 0.05,pre_ln" \
        --layers-fp16 6 --out overflow.json                                                 # fp16 training
    python scripts/precision_check.py --norm dyt --out range_dyt.json --markdown range_dyt.md  # DyT in every LayerNorm
    python scripts/precision_check.py --device cuda --dtype fp16 --embed-dim 512 --ffn-dim 2048 --heads 8 \
        --out range_fp16.json
"""
import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import torch

from residual_studies.options import device, nonnegative_int, positive_float, positive_int

#: ``--norm``'s values (fairseq_residual/norms.py; kept here so that --help needs no fairseq import)
NORMS = ("layernorm", "rmsnorm", "dyt", "derf")

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "fairseq_residual")
sys.path.insert(0, str(REPO))

FP16_MAX = 65504.0
VOCAB = 256


def dictionary():
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(VOCAB - d.nspecial):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def copy_task_batches(d, n, bsz, seed):
    """``n`` fairseq samples of ``bsz`` sentence pairs: random sources of 4-16 tokens, targets reversed."""
    from fairseq.data import LanguagePairDataset

    g = torch.Generator().manual_seed(seed)
    src, tgt = [], []
    for _ in range(n * bsz):
        tokens = torch.randint(d.nspecial, len(d), (int(torch.randint(4, 17, (1,), generator=g)),), generator=g)
        src.append(torch.cat([tokens, torch.tensor([d.eos()])]))
        tgt.append(torch.cat([tokens.flip(0), torch.tensor([d.eos()])]))
    ds = LanguagePairDataset(src, [len(t) for t in src], d, tgt, [len(t) for t in tgt], d, shuffle=False)
    return [ds.collater([ds[i] for i in range(b * bsz, (b + 1) * bsz)]) for b in range(n)]


def build_trainer(scheme, layers, a, d, extra=()):
    """fairseq's Trainer for ``scheme`` with ``layers`` + ``layers`` layers of the settings ``a``, plus ``extra`` flags."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.tasks.translation import TranslationTask
    from fairseq.trainer import Trainer

    argv = ["/synthetic-data", "--user-dir", USER_DIR, "--task", "translation", "--arch", "residual_transformer_tiny",
            "--residual-scheme", scheme, "--encoder-layers", layers, "--decoder-layers", layers,
            "--encoder-embed-dim", a.embed_dim, "--decoder-embed-dim", a.embed_dim, "--encoder-ffn-embed-dim",
            a.ffn_dim, "--decoder-ffn-embed-dim", a.ffn_dim, "--encoder-attention-heads", a.heads,
            "--decoder-attention-heads", a.heads, "--share-all-embeddings", "--dropout", "0.1",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", a.lr,
            *(["--lr-scheduler", "inverse_sqrt", "--warmup-updates", a.warmup, "--warmup-init-lr", "1e-7"]
              if a.warmup > 0 else ["--lr-scheduler", "fixed"]), "--criterion", "label_smoothed_cross_entropy",
            "--label-smoothing", "0.1", "--clip-norm", "1.0", "--seed", a.seed, "--max-tokens", "100000",
            "--no-save", "--num-workers", "0", "--norm", a.norm, *extra]
    if a.device == "cpu":
        argv.append("--cpu")
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(),
                                                                     [str(x) for x in argv]))
    task = TranslationTask(cfg.task, d, d)
    torch.manual_seed(a.seed)
    model = task.build_model(cfg.model)
    return Trainer(cfg, task, model, task.build_criterion(cfg.criterion)), task


def measure(trainer, batches, dtype):
    """The running sums' peaks of the trainer's model (a copy in ``dtype``, eval mode: no dropout) over the
    forwards of ``batches``: ``{"peak", "site", "fp16_headroom", "loss"}`` (the largest over every running
    sum; :class:`fairseq_residual.analyze.ranges.RunningSums`)."""
    import copy

    from fairseq import utils

    from fairseq_residual.analyze.ranges import RunningSums

    model = copy.deepcopy(trainer.get_model()).float().to(dtype).eval()
    device = next(model.parameters()).device
    criterion = trainer.get_criterion()
    losses = []
    with torch.no_grad(), RunningSums(model) as sums:
        for b in batches:
            b = utils.move_to_cuda(b, device) if device.type == "cuda" else b
            loss, size, _ = criterion(model, b)
            losses.append(float(loss) / size)
    return {**sums.top(), "loss": sum(losses) / len(losses)}


def overflow_run(a, scheme, extra, d, batches):
    """Train ``scheme`` with fairseq's ``--memory-efficient-fp16`` (the model really in fp16; the CPU has the
    kernels) and record, per update: the loss scale it ran with, whether the loss scaler skipped it
    (gradient overflow), the loss, the forward's largest running sum (in fp16: inf if one left the range) and
    the largest scaled gradient of a running sum, with their sites. fairseq's Trainer answers an overflow
    with ``torch.tensor(0.0).cuda()``; on the CPU ``Tensor.cuda`` is made the identity for this run."""
    from unittest import mock

    from fairseq_residual.analyze.ranges import RunningSums, _peak

    trainer, _ = build_trainer(scheme, a.layers_fp16, a, d, ["--memory-efficient-fp16", *extra])
    rows = []
    patch = mock.patch.object(torch.Tensor, "cuda", lambda self, *x, **k: self) if a.device == "cpu" \
        else contextlib.nullcontext()
    with patch:
        for i, b in enumerate(batches, 1):
            scale = float(trainer.optimizer.scaler.loss_scale)
            param_grads = {}
            hooks = [p.register_hook(lambda g, _n=n: param_grads.__setitem__(_n, _peak(g)))
                     for n, p in trainer.get_model().named_parameters() if p.requires_grad]
            with RunningSums(trainer.get_model(), gradients=True) as sums:
                out = trainer.train_step([b])
            for h in hooks:
                h.remove()
            fwd, grad = sums.top(), sums.top(grads=True)
            worst = max(param_grads, key=param_grads.get) if param_grads else None
            rows.append({"update": i, "loss_scale": scale, "skipped": out is None,
                         "loss": None if out is None else float(out["loss"]),
                         "forward_peak": fwd["peak"], "forward_site": fwd["site"],
                         "grad_peak": grad["peak"] if grad else None, "grad_site": grad["site"] if grad else None,
                         "param_grad_peak": param_grads.get(worst), "param_grad_site": worst})
    return rows


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--schemes", help="comma-separated subset of the registry (default: every scheme)")
    p.add_argument("--depths", default="6,12,24,48", help="layers per stack")
    p.add_argument("--embed-dim", type=positive_int, default=64)
    p.add_argument("--ffn-dim", type=positive_int, default=128)
    p.add_argument("--heads", type=positive_int, default=4)
    p.add_argument("--updates", type=positive_int, default=30, help="training updates before the second measurement")
    p.add_argument("--lr", type=positive_float, default=1e-3)
    p.add_argument("--warmup", type=nonnegative_int, default=10,
                   help="linear warm-up updates (0: a fixed learning rate)")
    p.add_argument("--batch", type=positive_int, default=16, help="sentences per batch")
    p.add_argument("--batches", type=positive_int, default=2, help="batches per measurement")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", type=device, default="cpu", help="cpu (default) or cuda")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="dtype of the measurement forwards (training is fp32)")
    p.add_argument("--overflow", metavar="SCHEME[:FLAGS],...",
                   help="instead of the grid: train each SCHEME (extra fairseq flags after ':', space-separated) "
                        "with --memory-efficient-fp16 for --updates updates at --layers-fp16 layers per stack and "
                        "log every update's loss scale, skip, forward peak and scaled-gradient peak")
    p.add_argument("--layers-fp16", type=positive_int, default=6, help="layers per stack of the --overflow runs")
    p.add_argument("--norm", choices=NORMS, default="layernorm",
                   help="what every LayerNorm computes (the model's --norm), for every run; an --overflow run's own "
                        "'--norm X' after ':' wins; a scheme that refuses the norm is reported as refused")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads on the CPU")
    p.add_argument("--out", required=True, help="JSON, rewritten after every measurement")
    p.add_argument("--markdown", help="also write the tables as markdown here")
    return p.parse_args(argv)


def main(argv=None):
    a = _args(argv)

    import fairseq_residual  # noqa: F401  (registers the model)
    from fairseq_residual.schemes import SCHEME_NAMES, get_scheme

    if a.device == "cpu":
        torch.set_num_threads(a.threads)
    d = dictionary()
    train_batches = copy_task_batches(d, a.updates, a.batch, seed=a.seed)
    report = {"fp16_max": FP16_MAX, "settings": vars(a), "command": " ".join(sys.argv), "results": {}}
    if a.overflow:
        report["what"] = "per update of --memory-efficient-fp16 training: loss scale, skipped, running-sum peaks"
        for run in a.overflow.split(","):
            scheme, _, flags = run.partition(":")
            started = time.time()
            try:
                rows = overflow_run(a, scheme, flags.split(), d, train_batches)
            except Exception as e:  # noqa: BLE001  (recorded, the run goes on)
                rows = [{"error": f"{type(e).__name__}: {e}"}]
            report["results"][run] = rows
            skipped = [r["update"] for r in rows if r.get("skipped")]
            print(f"{run}: skipped updates {skipped}, "
                  f"largest forward sum {max(r.get('forward_peak', 0) for r in rows):.4g}, "
                  f"largest scaled parameter gradient {max(r.get('param_grad_peak') or 0 for r in rows):.4g}, "
                  f"{time.time() - started:.0f}s", flush=True)
            Path(a.out).write_text(json.dumps(report, indent=1))
        return 0

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    schemes = a.schemes.split(",") if a.schemes else list(SCHEME_NAMES)
    depths = [int(x) for x in a.depths.split(",")]
    measure_batches = copy_task_batches(d, a.batches, a.batch, seed=a.seed + 1000)
    report["what"] = "largest |value| of every running sum (analyze/ranges.py), both stacks, before/after training"
    for scheme in schemes:
        for layers in depths:
            started = time.time()
            entry = report["results"].setdefault(scheme, {})[str(layers)] = {}
            try:
                trainer, _ = build_trainer(scheme, layers, a, d)
                entry["init"] = measure(trainer, measure_batches, dtype)
                losses = [trainer.train_step([b]) for b in train_batches]
                entry["train_loss_last"] = None if losses[-1] is None else float(losses[-1]["loss"])
                entry["trained"] = measure(trainer, measure_batches, dtype)
            except Exception as e:  # noqa: BLE001  (recorded, the run goes on)
                entry["error"] = f"{type(e).__name__}: {e}"
                if "is not supported with --residual-scheme" in str(e) and "--norm" in str(e):
                    entry["refused"] = True  # the scheme refuses --norm (its reason is the error)
            entry["seconds"] = round(time.time() - started, 1)
            print(f"{scheme} L={layers}: " + ", ".join(
                f"{k} {v['peak']:.4g} ({v['site']})" for k, v in entry.items() if isinstance(v, dict))
                + (f" ERROR {entry['error']}" if "error" in entry else "") + f" {entry['seconds']}s", flush=True)
            Path(a.out).write_text(json.dumps(report, indent=1))
            if a.markdown:
                Path(a.markdown).write_text(markdown(report, depths, get_scheme))
    return 0


def _cell(entry, moment):
    m = entry.get(moment)
    if m is None:
        return "refused" if entry.get("refused") else "error" if "error" in entry else "-"
    peak = m["peak"]
    flag = " **>fp16**" if not math.isfinite(peak) or peak > FP16_MAX else ""
    return f"{peak:.3g}{flag}"


def markdown(report, depths, get_scheme):
    """One table per moment (initialisation, trained): scheme x depth, the largest running sum and its stream."""
    lines = []
    norm = report["settings"].get("norm", "layernorm")
    for moment, title in (("init", "at initialisation"), ("trained", f"after {report['settings']['updates']} updates")):
        lines += [f"Largest |running sum| {title}" + ("" if norm == "layernorm" else f", --norm {norm}"),
                  "", "| scheme | " + " | ".join(f"{L}+{L}" for L in depths) + " |",
                  "|---|" + "---:|" * len(depths)]
        for scheme, by_depth in report["results"].items():
            cells = [_cell(by_depth.get(str(L), {}), moment) for L in depths]
            lines.append(f"| {get_scheme(scheme).label} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

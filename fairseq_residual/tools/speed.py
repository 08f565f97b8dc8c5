"""Benchmark harness: ``residual_transformer`` (Post-LN, Pre-LN, ResiDual) against fairseq's stock ``transformer``.

ResiDual adds one addition per sub-layer and one LayerNorm per stack, well under 1% of the FLOPs,
so the plugin must cost (almost) nothing on top of fairseq's own transformer. This script measures
that, in one process, on synthetic data (no data directory needed):

* training throughput: target tokens/s of forward + backward + optimizer step, with fairseq's
  ``label_smoothed_cross_entropy`` criterion (smoothing 0.1) and Adam (betas 0.9/0.98, weight decay 1e-4);
* peak training memory of one step (see "Memory" below);
* generation throughput: sentences/s of beam-5 search with fairseq's ``SequenceGenerator``; every
  hypothesis is forced to exactly ``--gen-len`` tokens (``min_len = max_len``), so every model does the
  same number of decoding steps whatever its (random) weights predict.

Models per shape (all built through fairseq's registry from ``fairseq-train`` style arguments, same
dimensions, dropout .3/.1/.1, shared embeddings, ``TranslationTask`` on a synthetic joined dictionary):

======================= ======================================= =============================
name                    what                                    ratio against
======================= ======================================= =============================
``transformer_post_ln`` fairseq ``transformer``, normalize_before False (baseline)
``transformer_pre_ln``  fairseq ``transformer``, normalize_before True  (baseline)
``post_ln``             ``residual_transformer --residual-scheme post_ln``   ``transformer_post_ln``
``pre_ln``              ``residual_transformer --residual-scheme pre_ln``    ``transformer_pre_ln``
``resi_dual``           ``residual_transformer --residual-scheme resi_dual`` ``transformer_post_ln``
======================= ======================================= =============================

Method: every model of a shape is built up front and primed with one training step (Adam state,
allocator caches); then each repetition visits every model in turn (round-robin, starting one model
later each repetition) and times ``--train-steps`` training steps and one generation batch. The first
``--warmup`` repetitions are discarded. Reported: medians over repetitions, and per plugin model the
median over repetitions of the paired ratio to its stock baseline measured in the same repetition
(robust to load changing during the run on a shared machine).

Clock (``--clock``): on CPU the throughputs are by default per second of this process's CPU time
(``time.process_time``), with one thread (``--threads``): on a machine shared with other jobs,
wall-clock time mostly measures their load (at load 5-6 on 2 cores, the wall-clock medians of two
models running the very same fairseq code came out 14% apart), CPU time far less (within 2% over 15
repetitions). On CUDA the clock is the wall clock (with synchronisation). Wall-clock throughputs are
always recorded too (``*_wall`` in the JSON).

A/A noise: the plugin's ``post_ln`` and ``pre_ln`` run fairseq's own layer code, so their ratios to
stock measure the run's noise; the table reports it, to read the ResiDual ratios against.

Memory:

* CUDA: ``torch.cuda.max_memory_allocated`` during one training step minus the memory allocated
  before it (activations, gradients, temporaries), plus the bytes of this model's parameters and
  Adam state: what the model needs on its own, independent of the other models resident on the GPU.
* CPU: the same quantity, with the step's peak taken from the PyTorch profiler's allocation events
  (``profile_memory=True``, one untimed step per model): the peak of live bytes allocated through
  PyTorch's CPU allocator. Not RSS: memory allocated outside PyTorch (Python objects, glibc caches)
  is not counted, and process RSS cannot separate models living in one process.

Precision (``--dtype``): ``fp32``, or ``bf16`` / ``fp16`` with ``torch.autocast`` and fp32 master
weights (as ``fairseq-train --amp``; fp16 also with a ``GradScaler``). Generation runs under the same
autocast. fp16 needs CUDA; ResiDual in fp16 uses ``--resi-dual-scale 0.05`` unless given (as the
paper's fp16 setting), since its dual stream is a running sum over all sub-layers.

Examples::

    python scripts/speed_benchmark.py --device cpu --out bench_cpu.json        # iwslt6 + deep24, 1 thread
    python scripts/speed_benchmark.py --device cuda --dtype bf16 --shapes iwslt6,deep24 --out bench_bf16.json
    python scripts/speed_benchmark.py --shapes tiny --repeats 1 --warmup 0 --out /tmp/tiny.json   # smoke test
"""
import argparse
import datetime
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from contextlib import contextmanager, nullcontext

from ..schemes import SCHEMES
from . import PLUGIN_DIR

# Shapes: layers per stack, model width, FFN width, attention heads, vocabulary size.
# Every shape uses the IWSLT dropouts (.3/.1/.1) and shared embeddings, as the plugin's IWSLT preset.
SHAPES = {
    "tiny": dict(layers=2, embed=64, ffn=64, heads=2, vocab=256,
                 doc="2+2, 64/64/2 heads (smoke tests)"),
    "iwslt6": dict(layers=6, embed=256, ffn=1024, heads=4, vocab=10000,
                   doc="6+6, 256/1024/4 heads (residual_transformer_iwslt_de_en)"),
    "iwslt12": dict(layers=12, embed=256, ffn=1024, heads=4, vocab=10000,
                    doc="12+12, 256/1024/4 heads (the paper's deeper IWSLT model)"),
    "deep24": dict(layers=24, embed=256, ffn=1024, heads=4, vocab=10000,
                   doc="24+24, 256/1024/4 heads (deep and narrow)"),
    "wmt6": dict(layers=6, embed=512, ffn=2048, heads=8, vocab=32000,
                 doc="6+6, 512/2048/8 heads (residual_transformer_wmt_en_de)"),
}

STOCK_POST, STOCK_PRE = "transformer_post_ln", "transformer_pre_ln"
# name -> (fairseq model family, scheme or normalize_before, stock baseline for the ratio)
MODELS = {
    STOCK_POST: dict(stock=True, normalize_before=False, baseline=None),
    STOCK_PRE: dict(stock=True, normalize_before=True, baseline=None),
}
# every registered scheme, against the stock model it is built on (Pre-LN-type schemes: stock Pre-LN)
MODELS.update({
    s.name: dict(stock=False, scheme=s.name, baseline=STOCK_PRE if s.builds_on == "pre_ln" else STOCK_POST)
    for s in SCHEMES
})
DEFAULT_MODELS = tuple(MODELS)
# variants with other scheme options, measured only when named in --models (the multi-stream schemes'
# memory grows with their number of streams n; their default is n = 4)
VARIANTS = {
    "hyper_connections_n2": ("hyper_connections", ["--hc-streams", "2"]),
    "mhc_n2": ("mhc", ["--mhc-streams", "2"]),
}
for _name, (_scheme, _options) in VARIANTS.items():
    MODELS[_name] = dict(MODELS[_scheme], options=_options)

# Goals: minimum ratio to the matching stock model (memory: maximum ratio).
# Scheme -> (train throughput >=, peak memory <=, generation throughput >=).
GOALS = {
    "post_ln": dict(train=0.99, memory=1.05, generate=0.97),
    "pre_ln": dict(train=0.99, memory=1.05, generate=0.97),
}
# schemes that add computation to fairseq's layers: within 3% of the stock model they are built on
GOALS.update({s.name: dict(train=0.97, memory=1.05, generate=0.97) for s in SCHEMES if s.name not in GOALS})
GOALS.update({name: GOALS[scheme] for name, (scheme, _) in VARIANTS.items()})
METRICS = ("train", "memory", "generate")
METRIC_KEYS = dict(train="train_tokens_per_s", memory="peak_train_mem_bytes",
                   generate="gen_sentences_per_s")
# Every measured series; the ``_wall`` ones are by wall clock whatever --clock says.
SERIES = tuple(METRIC_KEYS.values()) + ("train_tokens_per_s_wall", "gen_sentences_per_s_wall")

# CPU / CUDA defaults of the workload sizes (a default CPU run takes a few minutes on 2 cores).
DEVICE_DEFAULTS = {
    "cpu": dict(batch_tokens=512, train_steps=1, gen_sentences=4, gen_len=8, repeats=5, warmup=1,
                threads=1),
    "cuda": dict(batch_tokens=4096, train_steps=5, gen_sentences=128, gen_len=32, repeats=10, warmup=2,
                 threads=None),
}


def get_parser():
    p = argparse.ArgumentParser(
        description="Throughput and memory of residual_transformer in every registered scheme "
        "against fairseq's stock transformer at the same shape, on synthetic data.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="bf16/fp16: torch.autocast with fp32 master weights (fairseq --amp); fp16 needs cuda")
    p.add_argument("--shapes", default="iwslt6,deep24",
                   help=f"comma-separated, from: {', '.join(SHAPES)}")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="comma-separated subset of the models; a plugin model needs its stock baseline")
    p.add_argument("--repeats", type=int, help="timed repetitions (cpu 5, cuda 10)")
    p.add_argument("--warmup", type=int, help="discarded repetitions before the timed ones (cpu 1, cuda 2)")
    p.add_argument("--batch-tokens", type=int,
                   help="target tokens per training batch, about (cpu 512, cuda 4096)")
    p.add_argument("--train-steps", type=int,
                   help="training steps per timed measurement (cpu 1, cuda 5)")
    p.add_argument("--max-len", type=int, default=32,
                   help="training sentences are max_len/2..max_len tokens (source and target, incl. EOS)")
    p.add_argument("--gen-sentences", type=int, help="source sentences per beam-search batch (cpu 4, cuda 128)")
    p.add_argument("--gen-len", type=int,
                   help="tokens generated per hypothesis, the same for every model (cpu 8, cuda 32)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--no-generate", action="store_true", help="skip the generation benchmark")
    p.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    p.add_argument("--threads", type=int,
                   help="torch.set_num_threads; cpu default 1 (reproducible on a shared machine: with "
                   "several threads, OpenMP spin-waits make timings explode when cores are busy); "
                   "cuda default: torch's choice")
    p.add_argument("--resi-dual-scale", type=float,
                   help="ResiDual dual-stream scale c (default: 0.05 for fp16, else 1.0)")
    p.add_argument("--optimizer", choices=("torch", "fairseq"), default="torch",
                   help="Adam implementation: torch = torch.optim.AdamW (foreach; fused on cuda), the "
                   "same update as fairseq's Adam (decoupled weight decay) without its per-parameter "
                   "Python loop; fairseq = fairseq's --optimizer adam (FusedAdam only with apex)")
    p.add_argument("--clock", choices=("auto", "cpu", "wall"), default="auto",
                   help="time base of the throughputs, ratios and goals: wall = wall clock; cpu = "
                   "this process's CPU time (time.process_time), which other processes' load barely "
                   "changes; auto = cpu on --device cpu, wall on cuda. Wall-clock series are "
                   "always recorded as *_wall")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--user-dir", default=PLUGIN_DIR, help="the plugin package directory")
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


# ---------------------------------------------------------------------------------------------
# building models
# ---------------------------------------------------------------------------------------------


def make_dictionary(size):
    """fairseq ``Dictionary`` with ``size`` symbols (4 specials + ``w<i>``), padded to a multiple of 8."""
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"w{i}")
    d.pad_to_multiple_(8)
    return d


def model_cli_args(name, shape, resi_dual_scale, user_dir=PLUGIN_DIR):
    """``fairseq-train`` arguments of model ``name`` at ``shape`` (a dict of ``SHAPES``)."""
    spec = MODELS[name]
    args = [
        "synthetic-data",  # the data positional of fairseq-train; never read
        "--user-dir", user_dir,
        "--task", "translation",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4", "--weight-decay", "1e-4",
        "--dropout", "0.3", "--attention-dropout", "0.1", "--activation-dropout", "0.1",
        "--share-all-embeddings",
    ]
    for stack in ("encoder", "decoder"):
        args += [
            f"--{stack}-layers", str(shape["layers"]),
            f"--{stack}-embed-dim", str(shape["embed"]),
            f"--{stack}-ffn-embed-dim", str(shape["ffn"]),
            f"--{stack}-attention-heads", str(shape["heads"]),
        ]
    if spec["stock"]:
        args += ["--arch", "transformer"]
        if spec["normalize_before"]:
            args += ["--encoder-normalize-before", "--decoder-normalize-before"]
    else:
        args += ["--arch", "residual_transformer", "--residual-scheme", spec["scheme"]]
        if spec["scheme"] == "resi_dual":
            args += ["--resi-dual-scale", str(resi_dual_scale)]
        args += spec.get("options", [])
    return args


def build(name, shape, dictionary, opts, device):
    """Build model ``name``: returns (args, model, criterion, optimizer) on ``device``."""
    import torch
    from fairseq import optim, options
    from fairseq.tasks.translation import TranslationTask

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, model_cli_args(name, shape, opts.resi_dual_scale, opts.user_dir)
    )
    task = TranslationTask(args, dictionary, dictionary)
    torch.manual_seed(opts.seed)  # the same initialisation draw order for every model
    model = task.build_model(args).to(device)
    criterion = task.build_criterion(args).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    if opts.optimizer == "fairseq":
        optimizer = optim.build_optimizer(args, params)
    else:
        kw = dict(lr=5e-4, betas=(0.9, 0.98), eps=1e-8, weight_decay=1e-4)
        if device.type == "cuda":
            kw["fused"] = True
        else:
            kw["foreach"] = True
        optimizer = torch.optim.AdamW(params, **kw)
    return args, model, criterion, optimizer


# ---------------------------------------------------------------------------------------------
# synthetic data
# ---------------------------------------------------------------------------------------------


def random_sentences(gen, dictionary, n, lo, hi):
    """``n`` random token-id sentences of length lo..hi, each ending in EOS (1-D LongTensors)."""
    import torch

    first, last = dictionary.nspecial, len(dictionary)
    out = []
    for _ in range(n):
        length = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        toks = torch.randint(first, last, (length,), generator=gen)
        toks[-1] = dictionary.eos()
        out.append(toks)
    return out


def training_batch(dictionary, batch_tokens, max_len, seed):
    """A fairseq translation batch (``LanguagePairDataset.collater``) of about ``batch_tokens`` target tokens."""
    import torch
    from fairseq.data import LanguagePairDataset

    gen = torch.Generator().manual_seed(seed)
    lo = max(2, max_len // 2)
    n = max(1, round(batch_tokens / ((lo + max_len) / 2)))
    src = random_sentences(gen, dictionary, n, lo, max_len)
    tgt = random_sentences(gen, dictionary, n, lo, max_len)
    ds = LanguagePairDataset(src, [len(s) for s in src], dictionary, tgt, [len(t) for t in tgt], dictionary)
    return ds.collater([ds[i] for i in range(n)])


def generation_batch(dictionary, n, max_len, seed):
    """A source-only batch of ``n`` sentences (left-padded, as fairseq-generate feeds it)."""
    import torch
    from fairseq.data import LanguagePairDataset

    gen = torch.Generator().manual_seed(seed + 1)
    src = random_sentences(gen, dictionary, n, max(2, max_len // 2), max_len)
    ds = LanguagePairDataset(src, [len(s) for s in src], dictionary)
    return ds.collater([ds[i] for i in range(n)])


# ---------------------------------------------------------------------------------------------
# measurements
# ---------------------------------------------------------------------------------------------


class Bench:
    """One model under test with its training state and measurement series."""

    def __init__(self, name, shape_name, args, model, criterion, optimizer, opts, device):
        import torch

        self.name, self.shape_name = name, shape_name
        self.args, self.model, self.criterion, self.optimizer = args, model, criterion, optimizer
        self.opts, self.device = opts, device
        self.dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[opts.dtype]
        self.scaler = None
        if opts.dtype == "fp16":  # torch.amp.GradScaler since torch 2.3; torch.cuda.amp before
            amp = torch.amp if hasattr(torch.amp, "GradScaler") else torch.cuda.amp
            self.scaler = amp.GradScaler("cuda") if amp is torch.amp else amp.GradScaler()
        self.series = {k: [] for k in SERIES}
        self.params = sum(p.numel() for p in model.parameters())
        self.generator = None

    def autocast(self):
        import torch

        if self.dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def sync(self):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def train_step(self, sample):
        """One step: label-smoothed CE forward, backward (per-token gradient), Adam step."""
        self.model.train()
        self.optimizer.zero_grad()  # gradients set to None: their memory counts in the step
        with self.autocast():
            loss, sample_size, _ = self.criterion(self.model, sample)
        loss = loss / sample_size  # fairseq-train divides the gradient by sample_size
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            # the torch optimizer itself (fairseq's FairseqAdam wraps one)
            self.scaler.step(getattr(self.optimizer, "optimizer", self.optimizer))
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        return loss

    def time_train(self, sample, steps):
        """Target tokens/s of ``steps`` training steps: ``(by --clock, by wall clock)``."""
        self.sync()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            self.train_step(sample)
        self.sync()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        tokens = steps * int(sample["ntokens"])
        return tokens / (cpu if self.opts.clock == "cpu" else wall), tokens / wall

    def generate(self, sample):
        self.model.eval()
        with self.autocast():
            hypos = self.generator.generate([self.model], sample)
        return hypos

    def time_generate(self, sample):
        """Sentences/s of one beam-search batch: ``(by --clock, by wall clock)``."""
        self.sync()
        t0, c0 = time.perf_counter(), time.process_time()
        hypos = self.generate(sample)
        self.sync()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        lengths = {len(h[0]["tokens"]) for h in hypos}
        if lengths != {self.opts.gen_len + 1}:  # gen_len tokens + EOS, for every sentence
            raise RuntimeError(f"{self.name}: hypotheses of lengths {sorted(lengths)}, expected "
                               f"{self.opts.gen_len + 1}: the forced generation length did not hold")
        return len(hypos) / (cpu if self.opts.clock == "cpu" else wall), len(hypos) / wall

    def static_bytes(self):
        """Bytes of parameters and optimizer state (gradients are None between steps)."""
        import torch

        total = sum(p.numel() * p.element_size() for p in self.model.parameters())
        opt = getattr(self.optimizer, "optimizer", self.optimizer)  # fairseq wraps torch's
        for state in opt.state.values():
            for v in state.values():
                if torch.is_tensor(v):
                    total += v.numel() * v.element_size()
        return total

    def peak_train_memory(self, sample):
        """Peak bytes of one training step for this model alone (see module docstring), or None."""
        import torch

        if self.device.type == "cuda":
            self.sync()
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.train_step(sample)
            self.sync()
            step_peak = torch.cuda.max_memory_allocated(self.device) - before
        else:
            step_peak = cpu_step_peak_bytes(lambda: self.train_step(sample))
            if step_peak is None:
                return None
        return self.static_bytes() + step_peak


def cpu_step_peak_bytes(fn):
    """Peak of live bytes allocated by PyTorch's CPU allocator while ``fn()`` runs, or None.

    Reconstructed from the profiler's ``[memory]`` events (``profile_memory=True``): every
    allocation and free with its size and time; the running sum's maximum is the peak.
    """
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:
        events = prof.profiler.kineto_results.events()
        mem = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    except AttributeError:  # profiler internals changed: no fair CPU number available
        return None
    live = peak = 0
    for _, nbytes in mem:
        live += nbytes
        peak = max(peak, live)
    return peak


@contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (Kineto prints profiler start/stop lines from C++ there)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def summarize(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return dict(median=statistics.median(values), min=min(values), max=max(values), n=len(values))


def load_average():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def run_shape(shape_name, opts, device, log):
    """Build every model of one shape, measure them interleaved, return the shape's results dict."""
    import torch
    from fairseq.sequence_generator import SequenceGenerator

    shape = SHAPES[shape_name]
    dictionary = make_dictionary(shape["vocab"])
    sample_cpu = training_batch(dictionary, opts.batch_tokens, opts.max_len, opts.seed)
    from fairseq import utils

    sample = utils.move_to_cuda(sample_cpu, device) if device.type == "cuda" else sample_cpu
    gen_sample = None
    if not opts.no_generate:
        gen_sample = generation_batch(dictionary, opts.gen_sentences, opts.max_len, opts.seed)
        if device.type == "cuda":
            gen_sample = utils.move_to_cuda(gen_sample, device)

    benches = []
    for name in opts.model_names:
        args, model, criterion, optimizer = build(name, shape, dictionary, opts, device)
        b = Bench(name, shape_name, args, model, criterion, optimizer, opts, device)
        b.generator = SequenceGenerator(
            [model], dictionary, beam_size=opts.beam, max_len_a=0, max_len_b=opts.gen_len,
            min_len=opts.gen_len,
        )
        b.train_step(sample)  # prime: Adam state, allocator caches, lazy buffers
        benches.append(b)
        log(f"[{shape_name}] built {name}: {b.params:,} parameters")
    check_parameter_counts(benches)

    load_before = load_average()
    n = len(benches)
    for rep in range(opts.warmup + opts.repeats):
        timed = rep >= opts.warmup
        order = [benches[(rep + i) % n] for i in range(n)]  # round-robin, rotated each repetition
        for b in order:
            tps, tps_wall = b.time_train(sample, opts.train_steps)
            mem = b.peak_train_memory(sample) if (device.type == "cuda" and not opts.no_memory) else None
            sps, sps_wall = b.time_generate(gen_sample) if gen_sample is not None else (None, None)
            if timed:
                b.series["train_tokens_per_s"].append(tps)
                b.series["train_tokens_per_s_wall"].append(tps_wall)
                if gen_sample is not None:
                    b.series["gen_sentences_per_s"].append(sps)
                    b.series["gen_sentences_per_s_wall"].append(sps_wall)
                if mem is not None:
                    b.series["peak_train_mem_bytes"].append(mem)
        log(f"[{shape_name}] repetition {rep + 1}/{opts.warmup + opts.repeats}"
            + ("" if timed else " (warm-up)"))
    if device.type == "cpu" and not opts.no_memory:
        for b in benches:  # profiled, hence untimed, after the timing
            b.series["peak_train_mem_bytes"].append(b.peak_train_memory(sample))
    load_after = load_average()

    models = {}
    for b in benches:
        models[b.name] = dict(
            kind="stock transformer" if MODELS[b.name]["stock"] else "residual_transformer",
            arch=b.args.arch,
            residual_scheme=getattr(b.args, "residual_scheme", None),
            normalize_before=bool(b.args.encoder_normalize_before),
            resi_dual_scale=getattr(b.args, "resi_dual_scale", None) if b.name == "resi_dual" else None,
            params=b.params,
            baseline=MODELS[b.name]["baseline"],
            **{key: summarize(vals) for key, vals in b.series.items()},
            samples={key: vals for key, vals in b.series.items()},
        )
    by_name = {b.name: b for b in benches}
    ratios, goals = {}, {}
    for b in benches:
        base = MODELS[b.name]["baseline"]
        if base is None or base not in by_name:
            continue
        r = {}
        for metric, key in METRIC_KEYS.items():
            mine, theirs = b.series[key], by_name[base].series[key]
            if not mine or not theirs or len(mine) != len(theirs) or None in mine + theirs:
                r[metric] = None
                continue
            paired = [x / y for x, y in zip(mine, theirs)]
            r[metric] = dict(
                paired_median=statistics.median(paired),
                of_medians=statistics.median(mine) / statistics.median(theirs),
            )
        ratios[b.name] = dict(baseline=base, **r)
        g = {}
        for metric, target in GOALS[b.name].items():
            if r.get(metric) is None:
                g[metric] = dict(target=target, value=None, met=None)
                continue
            value = r[metric]["paired_median"]
            met = value <= target if metric == "memory" else value >= target
            g[metric] = dict(target=target, value=value, met=bool(met),
                             comparison="<=" if metric == "memory" else ">=")
        goals[b.name] = g
    # post_ln / pre_ln run fairseq's own layer code: their ratios are an A/A comparison, and their
    # distance from 1 is the measurement noise of this run (not plugin overhead).
    aa_noise = {}
    for metric in ("train", "generate"):
        devs = [abs(ratios[n][metric]["paired_median"] - 1.0) for n in ("post_ln", "pre_ln")
                if n in ratios and ratios[n].get(metric)]
        aa_noise[metric] = max(devs) if devs else None
    return dict(
        shape=dict(shape, name=shape_name),
        batch=dict(sentences=int(sample_cpu["nsentences"]), target_tokens=int(sample_cpu["ntokens"]),
                   source_tokens=int(sample_cpu["net_input"]["src_lengths"].sum()),
                   max_len=opts.max_len),
        generation=None if gen_sample is None else dict(
            sentences=opts.gen_sentences, beam=opts.beam, gen_len=opts.gen_len),
        load_average_before=load_before,
        load_average_after=load_after,
        models=models,
        ratios=ratios,
        goals=goals,
        aa_noise=aa_noise,
    )


def check_parameter_counts(benches):
    """Same shape, same parameters: the plugin's post_ln / pre_ln must match stock exactly.

    ResiDual has the final LayerNorms of Pre-LN (one per stack) and otherwise Post-LN's parameters.
    """
    counts = {b.name: b.params for b in benches}
    pairs = [("post_ln", STOCK_POST), ("pre_ln", STOCK_PRE), ("resi_dual", STOCK_PRE)]
    for mine, stock in pairs:
        if mine in counts and stock in counts and counts[mine] != counts[stock]:
            raise RuntimeError(
                f"{mine} has {counts[mine]:,} parameters but {stock} has {counts[stock]:,}: the "
                f"models are not the same shape, so the comparison would be meaningless"
            )


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------


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
    against = {}
    for res in results["shapes"].values():
        for name in res["models"]:
            if MODELS[name]["baseline"]:
                against.setdefault(MODELS[name]["baseline"], []).append(name)
    lines.append("ratios: median over repetitions of (model / its stock baseline in the same repetition); "
                 + "; ".join(f"{', '.join(dict.fromkeys(v))} vs {k}" for k, v in against.items()))
    lines.append(f"throughput clock: {results['meta']['clock']}")
    lines.append(f"memory: {results['meta']['memory_measure']}")
    lines.append("goals:")
    for shape_name, res in results["shapes"].items():
        for name, g in res["goals"].items():
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


def machine_info(device):
    import torch

    info = dict(platform=platform.platform(), python=platform.python_version(),
                hostname=platform.node(), cpu_count=os.cpu_count())
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        info["cpu"] = names[0] if names else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        info["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return info


def main(argv=None):
    opts = get_parser().parse_args(argv)
    for key, value in DEVICE_DEFAULTS[opts.device].items():
        if getattr(opts, key) is None:
            setattr(opts, key, value)
    if opts.clock == "auto":
        opts.clock = "cpu" if opts.device == "cpu" else "wall"
    if opts.clock == "cpu" and opts.device == "cuda":
        sys.exit("benchmark.py: --clock cpu measures host CPU time, meaningless for CUDA kernels: "
                 "use --clock wall (or auto) with --device cuda")
    if opts.resi_dual_scale is None:
        opts.resi_dual_scale = 0.05 if opts.dtype == "fp16" else 1.0
    shapes = [s.strip() for s in opts.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        sys.exit(f"benchmark.py: unknown shape(s) {', '.join(unknown)}: choose from {', '.join(SHAPES)}")
    opts.model_names = [m.strip() for m in opts.models.split(",") if m.strip()]
    unknown = [m for m in opts.model_names if m not in MODELS]
    if unknown:
        sys.exit(f"benchmark.py: unknown model(s) {', '.join(unknown)}: choose from {', '.join(MODELS)}")
    if opts.repeats < 1 or opts.warmup < 0 or opts.train_steps < 1:
        sys.exit("benchmark.py: --repeats and --train-steps must be >= 1 and --warmup >= 0")

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)  # fairseq's and tensorboardX's import-time chatter
    import torch

    if opts.device == "cuda" and not torch.cuda.is_available():
        sys.exit("benchmark.py: --device cuda but torch.cuda.is_available() is False: "
                 "use --device cpu or a CUDA build of torch")
    if opts.dtype == "fp16" and opts.device != "cuda":
        sys.exit("benchmark.py: --dtype fp16 needs --device cuda (use fp32 or bf16 on cpu)")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    device = torch.device(opts.device)
    log = (lambda msg: None) if opts.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))

    import fairseq

    memory_measure = (
        "skipped (--no-memory)" if opts.no_memory else
        "CUDA max_memory_allocated during one training step minus allocated before it, plus this "
        "model's parameter and Adam-state bytes (median over repetitions)" if opts.device == "cuda" else
        "peak live bytes of PyTorch's CPU allocator during one training step (torch.profiler "
        "profile_memory allocation events, one untimed step), plus this model's parameter and "
        "Adam-state bytes; not RSS (allocations outside PyTorch are not counted)"
    )
    meta = dict(
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        command=" ".join([os.path.basename(sys.argv[0])] + (sys.argv[1:] if argv is None else list(argv))),
        device=opts.device, dtype=opts.dtype,
        precision=("fp32" if opts.dtype == "fp32" else
                   f"torch.autocast({opts.dtype}), fp32 master weights"
                   + (", GradScaler" if opts.dtype == "fp16" else "")),
        torch=torch.__version__, fairseq=getattr(fairseq, "__version__", "?"),
        threads=torch.get_num_threads(),
        clock=("process CPU time (time.process_time)" if opts.clock == "cpu" else "wall clock")
        + "; *_wall series: wall clock",
        repeats=opts.repeats, warmup=opts.warmup, train_steps=opts.train_steps,
        batch_tokens=opts.batch_tokens, max_len=opts.max_len,
        gen_sentences=opts.gen_sentences, gen_len=opts.gen_len, beam=opts.beam,
        optimizer=("torch.optim.AdamW (" + ("fused" if opts.device == "cuda" else "foreach") + ")"
                   if opts.optimizer == "torch" else "fairseq --optimizer adam"),
        criterion="label_smoothed_cross_entropy (0.1)",
        resi_dual_scale=opts.resi_dual_scale,
        memory_measure=memory_measure,
        load_average_start=load_average(),
        machine=machine_info(device),
        goals=GOALS,
    )
    results = dict(meta=meta, shapes={})
    t0 = time.perf_counter()
    for shape_name in shapes:
        results["shapes"][shape_name] = run_shape(shape_name, opts, device, log)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        meta["load_average_end"] = load_average()
        meta["wall_s"] = round(time.perf_counter() - t0, 1)
        met = [d["met"] for res in results["shapes"].values() for g in res["goals"].values()
               for d in g.values() if d["met"] is not None]
        meta["all_goals_met"] = all(met) if met else None
        meta["complete"] = shape_name == shapes[-1]
        if opts.out:  # after every shape, so that a run cut short keeps what it measured
            write_json(results, opts.out)

    print(f"# {meta['command']}")
    print(f"# {meta['date']}  {meta['machine']['cpu']}" + (f"  {meta['machine'].get('gpu')}" if
          opts.device == "cuda" else "") + f"  torch {meta['torch']}  threads {meta['threads']}  "
          f"dtype {opts.dtype}  clock {opts.clock}  load {_load_str(meta['load_average_start'])} -> "
          f"{_load_str(meta['load_average_end'])}  wall {meta['wall_s']} s")
    print(format_table(results))
    if opts.out:
        log(f"wrote {opts.out}")
    return results


def write_json(results, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1, allow_nan=False)
    os.replace(tmp, path)


def _load_str(load):
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
                print(f"{dtype:<5} {shape:<7} {name:<10} " + "  ".join(parts))
            print(f"{dtype:<5} {shape:<7} A/A noise: train +-{noise['train'] or 0:.3f}  "
                  f"generate +-{noise['generate'] or 0:.3f}")
    print("goals: post_ln/pre_ln train >= 0.99, resi_dual train >= 0.97, memory <= 1.05, generate >= 0.97")
    print("ALL GOALS MET" if not misses else "MISSED:\n  " + "\n  ".join(misses))


if __name__ == "__main__":
    main()

"""The speed benchmark's harness: the models (fairseq's stock ``transformer`` as Post-LN and Pre-LN baselines,
and ``residual_transformer`` of every registered scheme), synthetic batches, and the interleaved timing of
training steps, generation and peak training memory (method, clocks and memory measures: :mod:`.speed`)."""
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext

from fairseq_residual.schemes import SCHEMES

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
    "study12": dict(layers=12, embed=64, ffn=128, heads=4, vocab=4000,
                    doc="12+12, 64/128/4 heads, 4k vocabulary (the ranking study's cells, for load-free costs)"),
    "wmt6": dict(layers=6, embed=512, ffn=2048, heads=8, vocab=32000,
                 doc="6+6, 512/2048/8 heads (residual_transformer_wmt_en_de)"),
}

STOCK_POST, STOCK_PRE = "transformer_post_ln", "transformer_pre_ln"
# name -> (fairseq model family, scheme or normalize_before, stock baseline for the ratio)
MODELS = {
    STOCK_POST: dict(stock=True, normalize_before=False, baseline=None),
    STOCK_PRE: dict(stock=True, normalize_before=True, baseline=None),
}
# every registered scheme, against the stock transformer it builds on (``builds_on``)
MODELS.update({
    s.name: dict(stock=False, scheme=s.name, baseline=STOCK_PRE if s.builds_on == "pre_ln" else STOCK_POST)
    for s in SCHEMES
})
#: the models measured by default: the two stock transformers and every registered scheme
DEFAULT_MODELS = tuple(MODELS)
#: variants with other scheme options, measured only when named in --models (the multi-stream schemes'
#: memory grows with their number of streams n; their default is n = 4): ``{name: (scheme, options)}``
VARIANTS = {
    "hyper_connections_n2": ("hyper_connections", ["--hc-streams", "2"]),
    "mhc_n2": ("mhc", ["--mhc-streams", "2"]),
    # the connections' prepare/update through torch.compile (eager training only: generation runs the plain code)
    "hyper_connections_compiled": ("hyper_connections", ["--hc-compile"]),
    "mhc_compiled": ("mhc", ["--mhc-compile"]),
}
for _name, (_scheme, _options) in VARIANTS.items():
    MODELS[_name] = dict(MODELS[_scheme], options=_options)

#: every measured series; the ``_wall`` ones are by wall clock whatever --clock says
SERIES = ("train_tokens_per_s", "peak_train_mem_bytes", "gen_sentences_per_s", "train_tokens_per_s_wall",
          "gen_sentences_per_s_wall")


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
        """One step: label-smoothed CE forward, backward (per-token gradient), Adam step, and what the scheme does
        after a step in fairseq-train (nGPT's renormalisation of its matrices: ``after_optimizer_step``)."""
        from fairseq_residual.optimizer_step import after_step

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
        after_step(self.model, self.optimizer)
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


def measure_shape(shape_name, opts, device, log):
    """Build every model of one shape and measure them interleaved (round-robin, rotated each repetition).

    Returns:
        dict: ``benches`` (one :class:`Bench` per model, with its series), ``batch`` and ``generation``
        (what one step trains on and generates), ``load_average_before`` / ``_after``.
    """
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
    return dict(
        benches=benches,
        batch=dict(sentences=int(sample_cpu["nsentences"]), target_tokens=int(sample_cpu["ntokens"]),
                   source_tokens=int(sample_cpu["net_input"]["src_lengths"].sum()),
                   max_len=opts.max_len),
        generation=None if gen_sample is None else dict(
            sentences=opts.gen_sentences, beam=opts.beam, gen_len=opts.gen_len),
        load_average_before=load_before,
        load_average_after=load_after,
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

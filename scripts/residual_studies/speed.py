"""Speed benchmark: ``residual_transformer`` of every registered scheme against fairseq's stock ``transformer``.

ResiDual adds one addition per sub-layer and one LayerNorm per stack, well under 1% of the FLOPs, and the
other schemes little more (DLCL's layer combination, Admin's omegas), so the plugin must cost (almost)
nothing on top of fairseq's own transformer. This application measures that, in one process, on synthetic
data (no data directory needed; harness :mod:`.speed_harness`, ratios and goals :mod:`.speed_compare`,
tables :mod:`.speed_report`):

* training throughput: target tokens/s of forward + backward + optimizer step, with fairseq's
  ``label_smoothed_cross_entropy`` criterion (smoothing 0.1) and Adam (betas 0.9/0.98, weight decay 1e-4);
* peak training memory of one step (see "Memory" below);
* generation throughput: sentences/s of beam-5 search with fairseq's ``SequenceGenerator``; every
  hypothesis is forced to exactly ``--gen-len`` tokens (``min_len = max_len``), so every model does the
  same number of decoding steps whatever its (random) weights predict.

Models per shape (all built through fairseq's registry from ``fairseq-train`` style arguments, same
dimensions, dropout .3/.1/.1, shared embeddings, ``TranslationTask`` on a synthetic joined dictionary): the
two baselines ``transformer_post_ln`` and ``transformer_pre_ln`` (fairseq's ``transformer`` with
normalize_before False / True), and one model per registered scheme, named by the scheme
(``residual_transformer --residual-scheme NAME``), measured against the stock transformer it builds on (the
scheme's ``builds_on``; :data:`.speed_harness.MODELS`). The multi-stream schemes' variants with two streams
(:data:`.speed_harness.VARIANTS`) are measured when named in ``--models``.

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
import contextlib
import datetime
import logging
import os
import sys
import time
import warnings

from . import PLUGIN_DIR, options
from .speed_compare import GOALS, aa_noise, models_summary, ratios_and_goals
from .speed_harness import DEFAULT_MODELS, MODELS, SHAPES, VARIANTS, load_average, machine_info, measure_shape
from .speed_report import format_table, load_text, write_json

# CPU / CUDA defaults of the workload sizes (a default CPU run takes a few minutes on 2 cores).
DEVICE_DEFAULTS = {
    "cpu": dict(batch_tokens=512, train_steps=1, gen_sentences=4, gen_len=8, repeats=5, warmup=1,
                threads=1),
    "cuda": dict(batch_tokens=4096, train_steps=5, gen_sentences=128, gen_len=32, repeats=10, warmup=2,
                 threads=None),
}


def get_parser():
    p = argparse.ArgumentParser(
        description="Throughput and memory of residual_transformer (every registered scheme) against fairseq's "
        "stock transformer at the same shape, on synthetic data.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--device", type=options.device, default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="bf16/fp16: torch.autocast with fp32 master weights (fairseq --amp); fp16 needs cuda")
    p.add_argument("--shapes", default="iwslt6,deep24",
                   help=f"comma-separated, from: {', '.join(SHAPES)}")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="comma-separated subset of the models (or the variants " + ", ".join(VARIANTS)
                        + "); a plugin model needs its stock baseline")
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
    p.add_argument("--user-dir", default=PLUGIN_DIR,
                   help="the plugin package directory (default: the one Python imports)")
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p




def run_shape(shape_name, opts, device, log):
    """Build every model of one shape, measure them interleaved (:func:`.speed_harness.measure_shape`), and
    compare each plugin model with its baseline (:mod:`.speed_compare`): the shape's results dict."""
    measured = measure_shape(shape_name, opts, device, log)
    benches = measured.pop("benches")
    ratios, goals = ratios_and_goals({b.name: b.series for b in benches})
    return dict(shape=dict(SHAPES[shape_name], name=shape_name), batch=measured["batch"],
                generation=measured["generation"], load_average_before=measured["load_average_before"],
                load_average_after=measured["load_average_after"], models=models_summary(benches),
                ratios=ratios, goals=goals, aa_noise=aa_noise(ratios))


def main(argv=None):
    parser = get_parser()
    opts = parser.parse_args(argv)
    for key, value in DEVICE_DEFAULTS[opts.device].items():
        if getattr(opts, key) is None:
            setattr(opts, key, value)
    if opts.clock == "auto":
        opts.clock = "cpu" if opts.device == "cpu" else "wall"
    if opts.clock == "cpu" and opts.device == "cuda":
        parser.error("--clock cpu measures host CPU time, meaningless for CUDA kernels: "
                     "use --clock wall (or auto) with --device cuda")
    if opts.resi_dual_scale is None:
        opts.resi_dual_scale = 0.05 if opts.dtype == "fp16" else 1.0
    shapes = [s.strip() for s in opts.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}: choose from {', '.join(SHAPES)}")
    opts.model_names = [m.strip() for m in opts.models.split(",") if m.strip()]
    unknown = [m for m in opts.model_names if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(MODELS)}")
    if opts.repeats < 1 or opts.warmup < 0 or opts.train_steps < 1:
        parser.error("--repeats and --train-steps must be >= 1 and --warmup >= 0")

    with _quiet():
        return _measure(opts, shapes, argv)


@contextlib.contextmanager
def _quiet():
    """Warnings and logging below ERROR off while the benchmark runs (fairseq's and tensorboardX's
    import-time chatter, fairseq's per-model messages); the caller's settings are back on leaving."""
    previous = logging.root.manager.disable
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(previous)


def _measure(opts, shapes, argv):
    """Measure every shape of ``opts``, print the table, write ``--out``; the results."""
    import torch

    if opts.dtype == "fp16" and opts.device != "cuda":  # refused inside the quiet block: the caller's logging
        # and warning filters come back (tests/test_user_errors.py)
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
          f"dtype {opts.dtype}  clock {opts.clock}  load {load_text(meta['load_average_start'])} -> "
          f"{load_text(meta['load_average_end'])}  wall {meta['wall_s']} s")
    print(format_table(results))
    if opts.out:
        log(f"wrote {opts.out}")
    return results


if __name__ == "__main__":
    main()

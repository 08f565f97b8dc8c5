#!/usr/bin/env python3
"""Cost of one Pre-LN encoder block under each residual scheme, against the plain residual (fairseq's stock
Pre-LN layer), on the CPU: process CPU time of forward + backward, peak memory of that step and the bytes
autograd keeps for the backward pass, each as a ratio to the plain block.

One block (self-attention + FFN), width 256, FFN 1024, 4 heads, T = 32 x B = 16 by default, training mode with
the IWSLT dropouts. The blocks are timed interleaved (every round runs every block once, in a rotated order)
and each ratio is the median over rounds of the block's time over the plain block's time in the same round;
the plain block is also timed under a second name (``plain (A/A)``), whose ratio shows the noise of the
machine. The input is the stack's start state of the block's scheme (n copies of the embedding output for
the multi-stream schemes) and the loss a fixed random projection of what the stack's final LayerNorm would
read (the stream sum for them), so the timed work is the block, its residual and nothing else.

Peak memory: the running maximum of live bytes of PyTorch's CPU allocator during one step (profiler memory
events, as ``scripts/speed_benchmark.py`` measures it). Saved bytes: the distinct storages autograd's
saved-tensor hooks see, parameters excluded.

Example: ``python scripts/block_benchmark.py --schemes hyper_connections,mhc --rounds 30`` (add ``--compile`` for
the compiled connections too).
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from residual_studies.speed_harness import MODELS, STOCK_PRE, cpu_step_peak_bytes, model_cli_args  # noqa: E402

PLAIN = "plain"
PLAIN_AA = "plain (A/A)"


#: the scheme options that compile the multi-stream connections (``--compile``)
COMPILE_FLAGS = {"hyper_connections": "--hc-compile", "mhc": "--mhc-compile", "mhc_lite": "--mhc-lite-compile"}
COMPILED = " (compiled)"


def build_block(name, embed, ffn, heads, resi_dual_scale, seed, extra=()):
    """``(layer, start, final_input)`` of the first encoder layer of model ``name`` with one layer per stack:
    ``start(x)`` the state the layer takes from the embedding output x (T x B x C), ``final_input(state)`` what
    the stack's final LayerNorm reads (T x B x C); ``extra``: more ``fairseq-train`` flags."""
    from fairseq import options
    from fairseq.tasks.translation import TranslationTask

    from residual_studies.speed_harness import make_dictionary

    shape = dict(layers=1, embed=embed, ffn=ffn, heads=heads, vocab=64)
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       model_cli_args(name, shape, resi_dual_scale) + list(extra))
    d = make_dictionary(shape["vocab"])
    torch.manual_seed(seed)
    model = TranslationTask(args, d, d).build_model(args).train()
    layer = model.encoder.layers[0]
    residual = getattr(model.encoder, "residual", None)
    if residual is None:  # fairseq's own layer: one stream, layer(x, padding_mask)
        return (lambda state: layer(state, None)), (lambda x: x), (lambda state: state), model
    return (lambda state: layer(state, None)[0]), residual.start, residual.final_input, model


def step(block, x, weight):
    """One forward + backward of ``block`` from the input ``x``."""
    forward, start, final_input, _ = block
    x = x.detach().requires_grad_()
    out = final_input(forward(start(x)))
    (out * weight).sum().backward()


def saved_bytes(block, x, weight):
    """Bytes of the distinct storages autograd saves for the backward of one step, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in block[3].parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step(block, x, weight)
    return sum(seen.values())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schemes", help="comma-separated schemes (default: every registered scheme whose "
                                     "block runs without a training hook)")
    p.add_argument("--embed", type=int, default=256)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32, help="T")
    p.add_argument("--batch", type=int, default=16, help="B")
    p.add_argument("--rounds", type=int, default=20, help="timed rounds (every block once per round)")
    p.add_argument("--warmup", type=int, default=2, help="discarded rounds before the timed ones")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--compile", action="store_true",
                   help="also time the hyper-connections / mHC / mHC-lite blocks with their connections compiled "
                        "(--hc-compile / --mhc-compile / --mhc-lite-compile), as '<name> (compiled)'; the compiling "
                        "(first step) is timed by wall clock and printed")
    opts = p.parse_args(argv)
    torch.set_num_threads(opts.threads)

    from fairseq_residual.schemes import SCHEMES

    if opts.schemes:
        names = [s for s in opts.schemes.split(",") if s]
    else:
        names = [s.name for s in SCHEMES if not s.needs_training_hook]
    skipped = [s.name for s in SCHEMES if s.needs_training_hook and s.name not in names]
    blocks = {PLAIN: build_block(STOCK_PRE, opts.embed, opts.ffn, opts.heads, 1.0, opts.seed)}
    blocks[PLAIN_AA] = blocks[PLAIN]
    for name in names:
        if name not in MODELS:
            p.error(f"unknown scheme {name!r}")
        blocks[name] = build_block(name, opts.embed, opts.ffn, opts.heads, 1.0, opts.seed)
    gen = torch.Generator().manual_seed(opts.seed)
    x = torch.randn(opts.tokens, opts.batch, opts.embed, generator=gen)
    weight = torch.randn(opts.tokens, opts.batch, opts.embed, generator=gen)
    compile_seconds = {}
    if opts.compile:
        for name in names:
            flag = COMPILE_FLAGS.get(MODELS[name].get("scheme"))
            if flag:
                blocks[name + COMPILED] = build_block(name, opts.embed, opts.ffn, opts.heads, 1.0, opts.seed, [flag])
                t0 = time.perf_counter()
                step(blocks[name + COMPILED], x, weight)  # compiles forward and backward
                compile_seconds[name + COMPILED] = time.perf_counter() - t0

    order = list(blocks)
    times = {name: [] for name in order}
    for r in range(opts.warmup + opts.rounds):
        shift = r % len(order)
        for name in order[shift:] + order[:shift]:
            t0 = time.process_time()
            step(blocks[name], x, weight)
            if r >= opts.warmup:
                times[name].append(time.process_time() - t0)
    memory = {name: cpu_step_peak_bytes(lambda b=blocks[name]: step(b, x, weight)) for name in order}
    saved = {name: saved_bytes(blocks[name], x, weight) for name in order}

    print(f"# one Pre-LN encoder block, {opts.embed}/{opts.ffn}/{opts.heads} heads, T={opts.tokens} x "
          f"B={opts.batch}, forward+backward, process CPU time, {opts.rounds} interleaved rounds, "
          f"{opts.threads} thread(s); ratios to the plain residual block")
    if skipped:
        print(f"# skipped (need a training hook): {', '.join(skipped)}")
    for name, seconds in compile_seconds.items():
        print(f"# {name}: first step (compiling forward and backward) {seconds:.1f} s wall clock")
    width = max(22, 2 + max(len(name) for name in order))
    print(f"{'block':<{width}}{'ms (median)':>12}{'time ratio':>12}{'[min, max]':>18}{'peak mem':>10}{'saved':>8}")
    for name in order:
        ratios = [a / b for a, b in zip(times[name], times[PLAIN])]
        mem = (f"{memory[name] / memory[PLAIN]:.2f}" if memory[name] is not None and memory[PLAIN] else "n/a")
        print(f"{name:<{width}}{1e3 * statistics.median(times[name]):>12.2f}{statistics.median(ratios):>12.3f}"
              f"{f'[{min(ratios):.2f}, {max(ratios):.2f}]':>18}{mem:>10}{saved[name] / saved[PLAIN]:>8.2f}")
    try:
        import hyper_connections  # noqa: F401  (lucidrains/hyper-connections; optional, never a dependency)
        print("# lucidrains' hyper-connections is importable, but this script does not time it yet")
    except ImportError:
        print("# lucidrains' hyper-connections: not importable, not measured")


if __name__ == "__main__":
    main()

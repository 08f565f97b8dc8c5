#!/usr/bin/env python3
"""Distributed data parallel equals one process, for every registered residual scheme.

Run under ``torchrun --nproc_per_node 2`` (gloo on CPU, nccl on CUDA with ``--device cuda``). Each rank
loops in-process over every scheme of the registry (``--schemes`` for a subset) and every configuration
of :data:`CONFIGS` (``--pairwise``: each scheme with one configuration, scheme i with configuration i mod 6,
so that every scheme and every configuration runs at least once): it builds ``residual_transformer_tiny`` with the scheme's defaults from fairseq-train
arguments, wraps it in fairseq's own :class:`~fairseq.trainer.Trainer` (which wraps the model in
``DistributedFairseqModel`` with the configuration's ``--ddp-backend``), and runs ``--updates`` training
updates of SGD on its own share of a fixed list of synthetic batches (fairseq ``LanguagePairDataset`` samples):
rank r takes batches r, r + 2, r + 4, ... as fairseq's sharded iterator does. Then rank 0 compares:

* ``ranks``: the two ranks' state dicts (every parameter and buffer) after training, element by element;
* ``vs_one_process``: rank 0's state dict against one process (no process group, the same Trainer)
  trained with ``--update-freq 2 x (the DDP run's --update-freq)`` on the same batches in the same order
  (batch 0, 1, 2, ...): the batches that meet in one all-reduce meet in one accumulated gradient.

Before the process group exists each rank computes half of those one-process references (a Trainer built
before ``distributed_init`` is a one-process Trainer), so the references cost one rank's time, not two.

The configurations (:data:`CONFIGS`): ``legacy_ddp`` and ``no_c10d`` (fairseq's own all-reduce after the
backward pass; in fairseq 0.12 the same class), ``c10d`` (torch's ``DistributedDataParallel``; stock fairseq
passes ``device_ids=[device_id]``, which torch refuses for a CPU module, so on CPU the wrapper is built
without ``device_ids`` / ``output_device``: torch's semantics, fairseq's arguments otherwise), each with
``--update-freq 2`` for one of them, all with dropout 0 (so that both sides draw no masks); and one
configuration with dropout 0.1 (attention and activation dropout too) whose ranks must agree, while its
reference is not comparable (one process draws other masks than two).

The optimizer is plain SGD (lr 0.1, no momentum, weight decay 1e-4, gradients clipped to norm 1): what DDP
must get right is the gradient, and SGD turns it into the weights linearly, so a rounding difference of the
gradient stays a rounding difference of the weights. Adam divides by ``sqrt(v) + 1e-8`` and turns a last-bit
difference of a gradient near its eps into a weight difference of up to its learning rate, as large as a real
defect (measured: 1.5e-8 for ReZero and 9e-10 for hyper-connections on one CPU, 0 on another).

Output (``--out``, written by rank 0): JSON ``{"world_size", "device", "updates", "optimizer", "lr", "configs",
"results": {scheme: {config: {"ranks_max_abs_diff", "ranks_equal", "vs_one_process_max_abs_diff", "loss",
"largest_update", "largest_value", "parameters", "error"}}}}``; a configuration that raised records the error text (the test then fails naming it).
Tolerance: see ``tests/test_ddp.py`` (the test decides; this script only measures).

Usage::

    torchrun --nproc_per_node 2 scripts/ddp_check.py --out ddp.json                # CPU, gloo
    torchrun --nproc_per_node 2 scripts/ddp_check.py --device cuda --out ddp.json  # 2 GPUs, nccl
"""
import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from residual_studies.fairseq_cfg import copy_with_scheme
from residual_studies.options import device

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "fairseq_residual")
sys.path.insert(0, str(REPO))

#: name -> (--ddp-backend, --update-freq, dropout); a dropout > 0 configuration is checked for rank
#: equality only
CONFIGS = {
    "legacy_ddp": ("legacy_ddp", 1, 0.0),
    "no_c10d": ("no_c10d", 1, 0.0),
    "c10d": ("c10d", 1, 0.0),
    "c10d_update_freq_2": ("c10d", 2, 0.0),
    "legacy_ddp_update_freq_2": ("legacy_ddp", 2, 0.0),
    "c10d_dropout": ("c10d", 1, 0.1),
}
SEED = 3
LR = 0.1  # SGD's learning rate: large enough that 3 updates move the weights far above fp32 rounding
BATCH = 4  # sentences per batch
VOCAB = 40


def train_args(scheme, backend, update_freq, dropout, world_size, device, extra=()):
    """fairseq-train arguments of one run (tiny model, SGD, label smoothing, clipping)."""
    from fairseq import options

    argv = [
        "/synthetic-data", "--user-dir", USER_DIR, "--task", "translation", "--arch", "residual_transformer_tiny",
        "--residual-scheme", scheme, "--optimizer", "sgd", "--momentum", "0", "--lr", str(LR),
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--clip-norm", "1.0",
        "--weight-decay", "0.0001", "--dropout", str(dropout), "--attention-dropout", str(dropout),
        "--activation-dropout", str(dropout), "--update-freq", str(update_freq), "--ddp-backend", backend,
        "--distributed-world-size", str(world_size), "--seed", str(SEED), "--max-tokens", "4096",
        "--no-save", "--disable-validation", "--num-workers", "0",
    ]
    if device == "cpu":
        argv.append("--cpu")
    return options.parse_args_and_arch(options.get_training_parser(), argv + [str(a) for a in extra])


def dictionary():
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(VOCAB):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def synthetic_batches(d, n, seed=0):
    """``n`` fairseq translation samples of :data:`BATCH` sentences (lengths 3-9, left-padded sources)
    collated by fairseq's ``LanguagePairDataset``; on the CPU (the Trainer moves them)."""
    from fairseq.data import LanguagePairDataset

    g = torch.Generator().manual_seed(seed)
    src, tgt = [], []
    for _ in range(n * BATCH):
        for out in (src, tgt):
            length = int(torch.randint(3, 10, (1,), generator=g))
            tokens = torch.randint(d.nspecial, len(d), (length,), generator=g)
            out.append(torch.cat([tokens, torch.tensor([d.eos()])]))
    ds = LanguagePairDataset(src, [len(t) for t in src], d, tgt, [len(t) for t in tgt], d, shuffle=False)
    return [ds.collater([ds[i] for i in range(b * BATCH, (b + 1) * BATCH)]) for b in range(n)]


_CFG_CACHE = {}




def run_config(scheme, backend, update_freq, dropout, world_size, device):
    """The fairseq config of one run: converted once per (dropout, world size, device) (fairseq's conversion
    to omegaconf takes half a second, the parsing a twentieth of that), the scheme, backend and update
    frequency set on a copy. The scheme is replaced only where the run's parsed arguments differ from the
    converted ones in ``residual_scheme`` alone (the ``tiny`` preset fills every scheme's options whichever
    is selected; the config keeps fairseq-train's arguments as they are, :func:`residual_studies.fairseq_cfg.copy_with_scheme`); else they are
    converted too."""
    import copy

    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    key = (dropout, world_size, device)
    args = train_args(scheme, backend, update_freq, dropout, world_size, device)
    cached = _CFG_CACHE.get(key)
    if cached is None or vars(args) != {**vars(cached[0]), "residual_scheme": scheme,
                                        "ddp_backend": backend, "update_freq": [update_freq]}:
        cached = _CFG_CACHE[key] = (copy.deepcopy(args), convert_namespace_to_omegaconf(args))
    cfg = copy_with_scheme(cached[1], scheme)
    cfg.distributed_training.ddp_backend = backend
    cfg.optimization.update_freq = [update_freq]
    if world_size > 1 and torch.distributed.is_initialized():
        rank = torch.distributed.get_rank()
        cfg.distributed_training.distributed_rank = rank
        cfg.distributed_training.device_id = rank if device == "cuda" else 0
    return cfg


def build_trainer(cfg, d):
    """fairseq's Trainer of ``cfg`` for a ``TranslationTask`` over dictionary ``d`` (model built with
    seed :data:`SEED`, identically on every rank)."""
    from fairseq.tasks.translation import TranslationTask
    from fairseq.trainer import Trainer

    task = TranslationTask(cfg.task, d, d)
    torch.manual_seed(SEED)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return Trainer(cfg, task, model, criterion)


def state_vector(trainer):
    """Every parameter and buffer of the trained model, flattened in float64, and their names/sizes."""
    state = trainer.get_model().state_dict()
    names = [(k, v.numel()) for k, v in state.items() if torch.is_tensor(v)]
    flat = torch.cat([state[k].detach().reshape(-1).double().cpu() for k, _ in names])
    return flat, names


def train(scheme, backend, update_freq, dropout, world_size, batches, d, device, updates):
    """Train one run of ``updates`` updates of ``update_freq`` batches per rank; return ``(state vector,
    names, last loss, largest change of a weight)``. ``world_size`` 1: one process on every batch in order;
    else this rank's share (batches r, r + world_size, ...)."""
    cfg = run_config(scheme, backend, update_freq, dropout, world_size, device)
    mine = batches if world_size == 1 else batches[torch.distributed.get_rank()::world_size]
    trainer = build_trainer(cfg, d)
    start, _ = state_vector(trainer)
    loss = None
    for u in range(updates):
        out = trainer.train_step(mine[u * update_freq:(u + 1) * update_freq])
        loss = None if out is None else float(out["loss"])
    flat, names = state_vector(trainer)
    return flat, names, loss, float((flat - start).abs().max())


def cpu_ddp_without_device_ids():
    """Build torch's DistributedDataParallel for CPU modules without ``device_ids`` / ``output_device``
    (stock fairseq passes them; torch refuses them for a module that is not on one CUDA device)."""
    from fairseq.models import distributed_fairseq_model as dfm

    ddp = dfm.DistributedDataParallel

    def cpu_ddp(module, device_ids=None, output_device=None, **kwargs):
        on_cuda = next(module.parameters()).is_cuda
        return ddp(module, device_ids=device_ids if on_cuda else None,
                   output_device=output_device if on_cuda else None, **kwargs)

    dfm.DistributedDataParallel = cpu_ddp


def write_report(a, world_size, configs, started, results, done):
    """Rank 0's JSON (``--out``): the schemes finished so far; ``complete`` once every scheme ran."""
    report = {"world_size": world_size, "device": a.device, "updates": a.updates, "batch_sentences": BATCH,
              "optimizer": "sgd", "lr": LR, "pairwise": a.pairwise,
              "configs": {c: dict(zip(("ddp_backend", "update_freq", "dropout"), CONFIGS[c])) for c in configs},
              "seconds": round(time.time() - started, 1), "complete": done, "results": results}
    Path(a.out).write_text(json.dumps(report, indent=1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file written by rank 0")
    p.add_argument("--schemes", help="comma-separated subset of the registry (default: every scheme)")
    p.add_argument("--configs", help=f"comma-separated subset of {', '.join(CONFIGS)}")
    p.add_argument("--pairwise", action="store_true",
                   help="each scheme with one configuration (scheme i with configuration i mod the number of "
                        "configurations) instead of every scheme with every configuration")
    p.add_argument("--updates", type=int, default=3)
    p.add_argument("--device", type=device, default="cpu", help="cpu (default) or cuda")
    a = p.parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        p.error("RANK and WORLD_SIZE are not set: run it under torchrun, e.g. "
                "torchrun --nproc_per_node 2 scripts/ddp_check.py --out ddp.json")

    import fairseq_residual  # noqa: F401  (registers the model)
    from fairseq.distributed import utils as distributed_utils
    from fairseq_residual.schemes import SCHEME_NAMES

    torch.set_num_threads(1)
    schemes = a.schemes.split(",") if a.schemes else list(SCHEME_NAMES)
    configs = a.configs.split(",") if a.configs else list(CONFIGS)
    plan = {s: [configs[i % len(configs)]] if a.pairwise else configs for i, s in enumerate(schemes)}
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if a.device == "cuda":
        torch.cuda.set_device(rank)
    d = dictionary()
    max_freq = max(CONFIGS[c][1] for c in configs)
    batches = synthetic_batches(d, world_size * max_freq * a.updates)
    started = time.time()

    # one-process references (--update-freq world_size x the run's), half per rank, before the process
    # group exists
    references, errors = {}, {}
    pairs = sorted({(s, world_size * CONFIGS[c][1]) for s in schemes for c in plan[s] if CONFIGS[c][2] == 0.0})
    for i, (s, freq) in enumerate(pairs):
        if i % world_size != rank:
            continue
        try:
            references[s, freq] = train(s, "legacy_ddp", freq, 0.0, 1, batches, d, a.device, a.updates)[0]
        except Exception:  # noqa: BLE001  (recorded; the test names it)
            errors[s, freq] = "one process: " + traceback.format_exc(limit=4)

    cfg = run_config(schemes[0], "legacy_ddp", 1, 0.0, world_size, a.device)
    cfg.distributed_training.distributed_rank = rank
    cfg.distributed_training.distributed_init_method = "env://"
    cfg.distributed_training.distributed_backend = "nccl" if a.device == "cuda" else "gloo"
    distributed_utils.distributed_init(cfg)
    cpu_ddp_without_device_ids()
    gathered = [None] * world_size
    torch.distributed.all_gather_object(gathered, (references, errors))
    references, errors = {}, {}
    for refs, errs in gathered:
        references.update(refs)
        errors.update(errs)

    results = {}
    for s in schemes:
        for c in plan[s]:
            backend, freq, dropout = CONFIGS[c]
            ref_key = (s, world_size * freq) if dropout == 0.0 else None
            entry = results.setdefault(s, {})[c] = {"error": errors.get(ref_key)}
            try:
                flat, names, loss, moved = train(s, backend, freq, dropout, world_size, batches, d, a.device,
                                                 a.updates)
            except Exception:  # noqa: BLE001
                entry["error"] = (entry["error"] or "") + f"rank {rank}: " + traceback.format_exc(limit=6)
                flat, names, loss, moved = None, None, None, None
            both = [None] * world_size
            torch.distributed.all_gather_object(both, None if flat is None else flat.tolist())
            if rank != 0:
                continue
            if any(b is None for b in both):
                entry["error"] = entry["error"] or "a rank failed (see its output)"
                continue
            vecs = [torch.tensor(b, dtype=torch.float64) for b in both]
            diff = max(float((v - vecs[0]).abs().max()) for v in vecs[1:])
            entry.update(loss=loss, largest_update=moved, largest_value=float(vecs[0].abs().max()),
                         ranks_max_abs_diff=diff, ranks_equal=all(torch.equal(v, vecs[0]) for v in vecs),
                         parameters=len(names))
            ref = references.get(ref_key)
            if ref is not None:
                entry["vs_one_process_max_abs_diff"] = float((ref - vecs[0]).abs().max())
        if rank == 0:  # after every scheme: a run cut short keeps what it finished
            write_report(a, world_size, configs, started, results, done=s == schemes[-1])
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

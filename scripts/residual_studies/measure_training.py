"""Run ``fairseq-train`` in-process and report its training speed and peak accelerator memory.

Usage::

    python scripts/measure_training.py --out run.json -- DATA_BIN --user-dir fairseq_residual \\
        --arch residual_transformer_iwslt_de_en_resi_dual --bf16 --max-tokens 4096 --max-update 400 ...

Everything after ``--`` goes to fairseq-train unchanged (``--log-format json`` and ``--log-file`` are
added). The JSON written to ``--out`` holds:

* ``wps_median``: median of fairseq's ``wps`` (target tokens per second, what fairseq calls words/s)
  over the ``train_inner`` log intervals, skipping the first ``--skip-intervals`` (warm-up);
* ``peak_mem_gib``: ``torch.cuda.max_memory_allocated()`` at the end of training (GiB), or null on CPU;
* ``updates``, ``final_loss`` and ``wall_s`` (seconds from start to end of ``fairseq-train``).
"""
import argparse
import json
import os
import statistics
import sys
import time

from .logs import read_train_log


def parse_log(path, skip):
    """``train_inner`` records of a fairseq json log file, without the first ``skip`` (warm-up)."""
    records = [r for r in read_train_log(path)["train_inner"]
               if "wps" in r and "epoch" in r and "num_updates" in r and "train_wall" in r]
    return records[skip:] if len(records) > skip else records


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        sys.exit("usage: measure_training.py --out FILE [--skip-intervals N] -- FAIRSEQ_TRAIN_ARGS...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--skip-intervals", type=int, default=1, help="warm-up log intervals to skip")
    parser.add_argument("--label", default=None, help="name of this run in the JSON")
    args = parser.parse_args(argv[:split])
    log_file = args.out + ".log"
    if os.path.exists(log_file):
        os.remove(log_file)
    train_args = argv[split + 1 :] + ["--log-format", "json", "--log-file", log_file]

    import torch
    from fairseq_cli import train

    sys.argv = ["fairseq-train"] + train_args
    start = time.time()
    train.cli_main()
    wall = time.time() - start
    records = parse_log(log_file, args.skip_intervals)
    if not records:
        sys.exit(f"no train_inner records in {log_file}: use a --log-interval below --max-update")
    result = {
        "label": args.label,
        "args": train_args,
        "wps_median": statistics.median(float(r["wps"]) for r in records),
        "intervals": len(records),
        "updates": int(records[-1]["num_updates"]),
        "final_loss": float(records[-1]["loss"]),
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "wall_s": wall,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "args"}))


if __name__ == "__main__":
    main()

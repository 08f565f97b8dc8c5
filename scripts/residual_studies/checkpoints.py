"""Average the model weights of the last N fairseq checkpoints of a run (checkpoint averaging).

fairseq's own ``scripts/average_checkpoints.py`` (the reference for this one) lives in the fairseq
source tree and is not installed by ``pip install fairseq`` / ``fairseq-fixed``. This version does
the same averaging and adds what torch >= 2.6 needs: checkpoints are loaded with
``torch.load(weights_only=True)`` after importing the plugin, whose ``checkpoint_compat`` module
allow-lists the globals fairseq stores (``argparse.Namespace``, numpy scalars); nothing else in the
files is unpickled.

Usage::

    python scripts/average_checkpoints.py --inputs RUN_DIR --num-epoch-checkpoints 10 \\
        --output RUN_DIR/checkpoint_avg10.pt
    python scripts/average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt

Each checkpoint's parameters are first renamed as loading it into the model would (a scheme's names of an
earlier version of the plugin: :func:`upgrade_model_state`). What is averaged: every floating-point tensor of ``state["model"]`` (accumulated in float64, stored
back in its own dtype); integer tensors (e.g. the plugin's ``residual_scheme_id`` buffers) must be
equal in all checkpoints and are kept. Everything else (``cfg``, ``args``, ``extra_state``) comes from
the newest input, as fairseq keeps one input's metadata; the optimizer state is dropped (the
averaged checkpoint is for fairseq-generate / fairseq-validate, not for resuming training).
"""
import argparse
import collections
import os
import re
import sys

import torch

from . import PLUGIN_DIR, options

DEFAULT_USER_DIR = os.environ.get("FAIRSEQ_RESIDUAL_USER_DIR", PLUGIN_DIR)

EPOCH_PATTERN = re.compile(r"^checkpoint(\d+)\.pt$")  # checkpoint12.pt: end of epoch 12
UPDATE_PATTERN = re.compile(r"^checkpoint_\d+_(\d+)\.pt$")  # checkpoint_3_5000.pt: update 5000


def import_plugin(user_dir=DEFAULT_USER_DIR):
    """Import the plugin as fairseq's --user-dir does (registers the model and the load allow-list)."""
    from fairseq import utils

    utils.import_user_module(argparse.Namespace(user_dir=user_dir))


def last_n_checkpoints(directory, n, by="auto"):
    """Paths of the last ``n`` epoch or update checkpoints in ``directory``, oldest first.

    Args:
        directory: a run's ``checkpoint.save_dir``.
        n: how many.
        by: ``epoch`` (``checkpointE.pt``), ``update`` (``checkpoint_E_U.pt``, written with
            ``--save-interval-updates``) or ``auto`` (epoch checkpoints when there are at least
            ``n``, else update checkpoints).

    Raises:
        FileNotFoundError: fewer than ``n`` checkpoints of the requested kind.
    """
    names = os.listdir(directory)
    found = {}
    for kind, pattern in (("epoch", EPOCH_PATTERN), ("update", UPDATE_PATTERN)):
        found[kind] = sorted(
            (int(m.group(1)), name) for name in names for m in [pattern.match(name)] if m
        )
    if by == "auto":
        by = "epoch" if len(found["epoch"]) >= n else "update"
    if by not in found:
        raise ValueError(f"by must be epoch, update or auto, got {by!r}")
    if len(found[by]) < n:
        raise FileNotFoundError(
            f"{directory} has {len(found['epoch'])} epoch checkpoints (checkpointE.pt) and "
            f"{len(found['update'])} update checkpoints (checkpoint_E_U.pt); averaging the last {n} "
            f"{by} checkpoints needs {n}. Keep more with --keep-last-epochs / --keep-interval-updates "
            f"(checkpoint.keep_last_epochs / checkpoint.keep_interval_updates under fairseq-hydra-train), or average "
            f"fewer"
        )
    return [os.path.join(directory, name) for _, name in found[by][-n:]]


def load_checkpoint(path):
    """``torch.load`` a fairseq checkpoint on CPU with the restricted (weights-only) unpickler."""
    with open(path, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=True)


def upgrade_model_state(state):
    """Rename, in place, the parameters of ``state["model"]`` that an earlier version of the plugin saved
    under other names (Admin's reference-named omegas, DLCL's ``history``), as loading the checkpoint into the
    model does (each scheme's ``upgrade_state_dict``), so that checkpoints of one run that cross such a change
    average. A checkpoint without the plugin's configuration (fairseq's stock transformer) is left as it is."""
    cfg = state.get("cfg")  # as fairseq_residual.analyze.loading.checkpoint_scheme reads it
    model_cfg = cfg["model"] if cfg is not None else state.get("args")
    if model_cfg is None or getattr(model_cfg, "residual_scheme", None) is None:
        return state
    from fairseq_residual.config import as_namespace, residual_options
    from fairseq_residual.schemes import get_scheme

    options = residual_options(as_namespace(model_cfg))
    for stack in ("encoder", "decoder"):
        get_scheme(options.scheme).upgrade_state_dict(state["model"], f"{stack}.", stack, options)
    return state


def average_checkpoints(paths):
    """Average ``state["model"]`` over ``paths``; return the newest checkpoint's state with it.

    Raises:
        ValueError: the checkpoints do not hold the same parameter names and shapes (different
            models), or integer tensors differ (e.g. checkpoints of different residual schemes).
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    sums = collections.OrderedDict()
    meta = None
    for path in paths:
        state = upgrade_model_state(load_checkpoint(path))
        model = state["model"]
        if not sums:
            keys = list(model.keys())
            for k, v in model.items():
                sums[k] = v.to(torch.float64).clone() if v.is_floating_point() else v.clone()
            dtypes = {k: v.dtype for k, v in model.items()}
        else:
            if set(model.keys()) != set(keys):
                missing = sorted(set(keys) ^ set(model.keys()))
                raise ValueError(
                    f"{path} has different parameters than {paths[0]} (e.g. {missing[:3]}): "
                    f"only checkpoints of one model can be averaged"
                )
            for k, v in model.items():
                if v.shape != sums[k].shape:
                    raise ValueError(f"{path}: {k} has shape {tuple(v.shape)}, expected {tuple(sums[k].shape)}")
                if v.is_floating_point():
                    sums[k] += v.to(torch.float64)
                elif not torch.equal(v, sums[k]):
                    raise ValueError(
                        f"{path}: integer tensor {k} differs from {paths[0]}'s; these are not "
                        f"checkpoints of the same model (e.g. different residual schemes)"
                    )
        meta = state  # the newest input's metadata
    averaged = collections.OrderedDict(
        (k, (v / len(paths)).to(dtypes[k]) if dtypes[k].is_floating_point else v)
        for k, v in sums.items()
    )
    out = {k: v for k, v in meta.items() if k not in ("model", "last_optimizer_state")}
    out["model"] = averaged
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", nargs="+", required=True,
                        help="checkpoint files, or one run directory with --num-*-checkpoints")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--num-epoch-checkpoints", type=options.positive_int, metavar="N",
                       help="average the last N epoch checkpoints (checkpointE.pt) of the directory")
    group.add_argument("--num-update-checkpoints", type=options.positive_int, metavar="N",
                       help="average the last N update checkpoints (checkpoint_E_U.pt) of the directory")
    group.add_argument("--num-checkpoints", type=options.positive_int, metavar="N",
                       help="the last N epoch checkpoints if there are N, else update checkpoints")
    parser.add_argument("--user-dir", default=DEFAULT_USER_DIR,
                        help="plugin directory (default: this repository's fairseq_residual/)")
    args = parser.parse_args(argv)

    n = next((v for v in (args.num_epoch_checkpoints, args.num_update_checkpoints, args.num_checkpoints)
              if v is not None), None)
    if n is not None:
        if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
            parser.error("--num-*-checkpoints needs exactly one run directory in --inputs")
        by = "epoch" if args.num_epoch_checkpoints else "update" if args.num_update_checkpoints else "auto"
        paths = last_n_checkpoints(args.inputs[0], n, by)
    else:
        paths = args.inputs
        for p in paths:
            if os.path.isdir(p):
                parser.error(f"{p} is a directory: add --num-checkpoints N to pick its last N")

    import_plugin(args.user_dir)
    state = average_checkpoints(paths)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    tmp = args.output + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, args.output)
    print(f"averaged {len(paths)} checkpoints -> {args.output}")
    for p in paths:
        print(f"  {p}")
    return paths


def cli():
    """``scripts/average_checkpoints.py``: :func:`main`, its errors as one line."""
    try:
        main()
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"average_checkpoints.py: error: {e}")


if __name__ == "__main__":
    cli()

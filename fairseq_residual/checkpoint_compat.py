"""Load fairseq checkpoints under torch >= 2.6, whose ``torch.load`` defaults to ``weights_only=True``.

fairseq 0.12 calls ``torch.load(f, map_location="cpu")`` on checkpoints that pickle the training
``argparse.Namespace`` (and, after some runs, numpy scalars such as a best-BLEU value, and with ``--eval-bleu``
numpy arrays: the BLEU counts in the saved metrics). With
``weights_only=True`` these loads fail with ``Unsupported global: argparse.Namespace``, which breaks
``fairseq-generate`` and resuming training. The common workaround,
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, turns the safe loader off for every load in the process.

Instead, importing this plugin adds exactly the types fairseq checkpoints contain to torch's
allow-list (``torch.serialization.add_safe_globals``): the restricted unpickler stays on, and a file
carrying any other global is still refused.

Resuming with several processes needs more: rank 0 reads the checkpoint, upgrades it (its ``cfg`` becomes
an omegaconf ``DictConfig``) and sends it to the other ranks with ``torch.save`` / ``torch.load`` over a
buffer (``fairseq/distributed/utils.py``, ``_broadcast_object_slow``); that ``torch.load`` meets
omegaconf's container and node classes, which are allow-listed too (found by a real 2-task SLURM resume,
``tests/test_slurm.py``).
"""
import collections
import typing
import argparse

import numpy as np
import torch

#: Types that fairseq 0.12 writes into checkpoints besides tensors and builtins.
FAIRSEQ_CHECKPOINT_GLOBALS = [argparse.Namespace]


def _omegaconf_globals():
    """What pickle needs to rebuild an upgraded fairseq state sent between ranks: its omegaconf ``DictConfig``
    and fairseq's tensor placeholders."""
    from fairseq.distributed import utils as distributed_utils
    from omegaconf import base, dictconfig, listconfig, nodes

    node_types = [getattr(nodes, name) for name in (
        "AnyNode", "StringNode", "IntegerNode", "FloatNode", "BooleanNode", "EnumNode", "BytesNode",
        "PathNode") if hasattr(nodes, name)]
    # fairseq's broadcast replaces each tensor by a _TensorPlaceholder(index) before pickling
    placeholder = [distributed_utils._TensorPlaceholder] if hasattr(distributed_utils, "_TensorPlaceholder") else []
    return [*placeholder, dictconfig.DictConfig, listconfig.ListConfig, base.Metadata, base.ContainerMetadata,
            *node_types, typing.Any, dict, list, int, float, str, bool, collections.defaultdict]


def _numpy_globals():
    """What pickle needs to rebuild numpy scalars (``np.float64(...)``) and numeric arrays: their reconstructors,
    ``np.ndarray`` and the dtypes. The arrays are the corpus-BLEU counts that ``--eval-bleu`` logs
    (``fairseq/tasks/translation.py``, ``reduce_metrics``: ``metrics.log_scalar("_bleu_counts", np.array(...))``)
    and fairseq saves with the metrics in every checkpoint's ``extra_state``; an array of Python objects still
    needs its objects' own globals, which stay refused."""
    core = getattr(np, "_core", None) or np.core
    out = [core.multiarray.scalar, core.multiarray._reconstruct, np.ndarray, np.dtype]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        out += [
            getattr(dtypes, name)
            for name in ("Float64DType", "Float32DType", "Int64DType", "Int32DType", "BoolDType")
            if hasattr(dtypes, name)
        ]
    return out


def allow_fairseq_checkpoints():
    """Allow-list the globals of fairseq checkpoints for ``torch.load(weights_only=True)``.

    A no-op on torch versions without ``add_safe_globals`` (< 2.4, which load with pickle anyway).
    Returns the list of types registered.
    """
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is None:
        return []
    types = FAIRSEQ_CHECKPOINT_GLOBALS + _numpy_globals() + _omegaconf_globals()
    add(types)
    return types


allow_fairseq_checkpoints()

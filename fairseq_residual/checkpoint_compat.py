"""Load fairseq checkpoints under torch >= 2.6, whose ``torch.load`` defaults to ``weights_only=True``.

fairseq 0.12 calls ``torch.load(f, map_location="cpu")`` on checkpoints that pickle the training
``argparse.Namespace`` (and, after some runs, numpy scalars such as a best-BLEU value, and with ``--eval-bleu``
numpy arrays: the BLEU counts in the saved metrics, rebuilt through checked stand-ins, :class:`NumericArray`). With
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
import argparse
import collections
import pickle
import typing

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


#: the kinds of array torch's safe loader may rebuild here: bool, signed and unsigned integers, floats
NUMERIC_KINDS = "biuf"


class NumericArray(np.ndarray):
    """A numpy array of a plain numeric dtype, as torch's safe loader rebuilds one from a checkpoint (the
    corpus-BLEU counts that ``--eval-bleu`` logs, ``fairseq/tasks/translation.py``, ``reduce_metrics``:
    ``metrics.log_scalar("_bleu_counts", np.array(...))``, saved with the metrics in every checkpoint's
    ``extra_state``). Pickles as a plain ``np.ndarray``.

    numpy's own ``_reconstruct`` and ``ndarray.__setstate__`` trust the pickled dtype, and a crafted dtype (one with
    an object field not flagged as holding objects) would turn raw bytes into object pointers: they are never
    allow-listed. :meth:`__setstate__` takes the state ``(version, shape, dtype, is_fortran, raw bytes)`` only for a
    dtype of kind ``b``, ``i``, ``u`` or ``f`` without fields or sub-arrays, rebuilds the dtype from its type string,
    and requires exactly ``prod(shape) x itemsize`` bytes.

    Raises:
        pickle.UnpicklingError: any other state, naming what was refused.
    """

    def __new__(cls, *args, **kwargs):
        """Refused: the safe loader may name this class, and ``NumericArray(shape, dtype, buffer)`` would build
        an array from any dtype (arrays of this class come from :func:`_reconstruct_numeric` and numpy's
        operations, which do not call it)."""
        raise pickle.UnpicklingError("fairseq_residual.checkpoint_compat.NumericArray(...) is not called when "
                                     "loading a checkpoint")

    def __setstate__(self, state):
        try:
            version, shape, dtype, fortran, raw = state
            shape = tuple(int(n) for n in shape)
        except (TypeError, ValueError):
            raise pickle.UnpicklingError("a numpy array's pickled state is malformed: not loaded") from None
        if not (isinstance(dtype, np.dtype) and dtype.kind in NUMERIC_KINDS and dtype.fields is None
                and dtype.subdtype is None and not dtype.hasobject):
            raise pickle.UnpicklingError(f"a numpy array of dtype {dtype!r} is not loaded: only arrays of bool, "
                                         f"integer or float numbers are (fairseq's metrics hold no other)")
        clean = np.dtype(dtype.str)
        expected = int(np.prod(shape, dtype=np.int64)) * clean.itemsize
        if not (isinstance(raw, bytes) and all(n >= 0 for n in shape) and len(raw) == expected):
            raise pickle.UnpicklingError(f"a numpy array of shape {shape} and dtype {clean} comes with "
                                         f"{len(raw) if isinstance(raw, bytes) else type(raw).__name__} bytes of "
                                         f"data, not {expected}: not loaded")
        super().__setstate__((version, shape, clean, bool(fortran), raw))

    def __reduce__(self):
        return np.asarray(self).view(np.ndarray).__reduce__()


def _ndarray_marker(*args):
    """What ``numpy.ndarray`` names in a checkpoint for torch's safe loader: the subtype argument of numpy's
    ``_reconstruct`` (:func:`_reconstruct_numeric`), never a constructor (``np.ndarray(shape, dtype, buffer)``
    with a crafted dtype would forge object pointers)."""
    raise pickle.UnpicklingError("numpy.ndarray(...) is not called when loading a checkpoint")


def _reconstruct_numeric(subtype, shape, dtype):
    """numpy's ``_reconstruct(ndarray, (0,), b'b')``, the first step of unpickling an array, as an empty
    :class:`NumericArray` whose ``__setstate__`` then checks the array's state."""
    if subtype is not _ndarray_marker:
        raise pickle.UnpicklingError(f"a numpy array of type {subtype!r} is not loaded: only numpy.ndarray is")
    return np.ndarray.__new__(NumericArray, (0,), np.dtype("b"))


def _numpy_globals():
    """What pickle needs to rebuild numpy scalars (``np.float64(...)``) and numeric arrays (:class:`NumericArray`):
    the scalar reconstructor and the dtypes, and, under the names numpy's pickles use (``numpy._core`` from numpy 2,
    ``numpy.core`` before), the checked stand-ins of ``_reconstruct`` and ``ndarray``."""
    core = getattr(np, "_core", None) or np.core
    out = [core.multiarray.scalar, np.dtype, NumericArray, (_ndarray_marker, "numpy.ndarray")]
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        out += [(_reconstruct_numeric, f"{module}._reconstruct"), (core.multiarray.scalar, f"{module}.scalar")]
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

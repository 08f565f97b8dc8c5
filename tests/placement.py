"""Catching a tensor created on the wrong device without a GPU: two torch function modes for the tests.

* :class:`StrayTensorGuard` records every tensor factory call (``torch.zeros``, ``torch.tensor``, ``torch.arange``,
  ...) made directly from the plugin's own code (a frame under ``fairseq_residual/``) without a device, or with
  the literal device string ``"cpu"``, and every ``.cpu()`` / ``.to("cpu")`` there: on CUDA such a tensor is a
  CPU tensor next to CUDA ones. A device given as a ``torch.device`` object (``x.device``) is taken as derived
  from the data and accepted, even on this CPU. Active during a training step, a forward pass and beam
  search, it sees what a CUDA run would execute, on the CPU.
* :class:`MetaOracle` lets fairseq's own data-dependent Python run on the ``meta`` device: ``bool()`` of a meta
  tensor (``if mask.any():``, fairseq's padding checks) answers False instead of raising, so a whole model
  forward, backward and incremental decoding run with every parameter, buffer and input on ``meta``, where
  any tensor that is not (a CPU tensor with dimensions, e.g. one created without ``device=``, or a plain
  tensor attribute that ``.to()`` did not move) fails as it would on CUDA (0-dimensional CPU tensors mix with
  meta tensors as they do with CUDA ones).
"""
import os
import sys

import torch
from torch.overrides import TorchFunctionMode

import fairseq_residual

PACKAGE_DIR = os.path.dirname(os.path.abspath(fairseq_residual.__file__)) + os.sep
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
HERE = os.path.abspath(__file__)

FACTORIES = {
    torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.tensor, torch.as_tensor, torch.rand,
    torch.randn, torch.randint, torch.randperm, torch.eye, torch.linspace, torch.logspace, torch.scalar_tensor,
    torch.empty_strided, torch.tril_indices, torch.triu_indices,
}


def _is_cpu_literal(device):
    return device is None or (isinstance(device, str) and device.split(":")[0] == "cpu")


class StrayTensorGuard(TorchFunctionMode):
    """Record tensor factories and moves to the CPU issued from frames under ``package_dir`` (default: the
    plugin). ``violations``: ``["file:line: call"]``, in order."""

    def __init__(self, package_dir=PACKAGE_DIR):
        super().__init__()
        self.package_dir = package_dir
        self.violations = []

    def _caller(self):
        frame = sys._getframe(2)
        while frame is not None:
            name = os.path.abspath(frame.f_code.co_filename)
            if not (name.startswith(TORCH_DIR) or name == HERE):
                return name, frame.f_lineno
            frame = frame.f_back
        return "", 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        stray = None
        if func in FACTORIES and _is_cpu_literal(kwargs.get("device")):
            stray = f"{func.__name__}(...) without a device"
        elif func is torch.Tensor.cpu:
            stray = ".cpu()"
        elif func is torch.Tensor.to and any(isinstance(a, str) and a.startswith("cpu") for a in
                                             list(args[1:]) + [kwargs.get("device")]):
            stray = ".to('cpu')"
        if stray is not None:
            name, line = self._caller()
            if name.startswith(self.package_dir):
                self.violations.append(f"{os.path.relpath(name, os.path.dirname(self.package_dir))}:{line}: {stray}")
        return func(*args, **kwargs)


class MetaOracle(TorchFunctionMode):
    """``bool(meta tensor)`` is False (see the module docstring); everything else runs as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.__bool__ and args and args[0].is_meta:
            return False
        return func(*args, **kwargs)

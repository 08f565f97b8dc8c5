"""The largest magnitude of every running sum of a ``residual_transformer`` forward, against fp16's range.

A running sum is a tensor that carries the residual from layer to layer, or a sum made of it before a
LayerNorm brings it back to unit scale. Every scheme's are seen from two places, whatever its code path:

* the input of every LayerNorm (fairseq's ``LayerNorm`` is ``torch.nn.LayerNorm``; apex's fused one is
  matched by its class name), or of the RMSNorm, DyT or Derf that ``--norm`` put in its place: Post-LN's and DeepNorm's ``alpha * x + F(x)`` before their post-norm, the
  Pre-LN stream where a sub-layer reads it, the stack's last state before its final LayerNorm (ResiDual's
  ``x_a + x_d``, hyper-connections' ``sum_i h_i``);
* every call of the residual protocol (:mod:`fairseq_residual.residual`): each tensor that a
  :class:`~fairseq_residual.residual.SublayerResidual`'s ``prepare`` / ``update`` or a
  :class:`~fairseq_residual.residual.StackResidual`'s ``start`` / ``between`` / ``final_input`` returns
  (ResiDual's dual stream ``x_d``, T-Fixup's and ReZero's stream that no LayerNorm sees, DLCL's history,
  the n streams of hyper-connections and mHC, B2T's layer input).

With ``gradients=True`` the same tensors' gradients are recorded too (a hook on each tensor that requires
one): under fairseq's ``--fp16`` they are the scaled gradients whose overflow makes the loss scaler skip an
update. A value that is not finite (an overflow in an fp16 model) is recorded as ``inf``.

``scripts/precision_check.py`` tabulates these peaks over schemes and depths (``docs/precision.md``).
"""
import math
from typing import Dict, Optional

import torch
from torch import Tensor, nn

from ..config import FP16_MAX
from ..norms import is_norm
from ..residual import StackResidual, SublayerResidual

SUBLAYER_METHODS = ("prepare", "update")
STACK_METHODS = ("start", "between", "final_input")


def _is_layer_norm(module: nn.Module) -> bool:
    """A LayerNorm, or what ``--norm`` put in its place (RMSNorm, DyT, Derf): its input is a running sum."""
    return is_norm(module) or type(module).__name__.endswith("LayerNorm")


def _peak(t: Tensor) -> float:
    """``max |t|`` as a Python float, ``inf`` when ``t`` holds an inf or a NaN."""
    a = t.detach().abs()
    if not bool(torch.isfinite(a).all()):
        return math.inf
    return float(a.max()) if a.numel() else 0.0


class RunningSums:
    """Record, while active (a context manager), the largest magnitude of every running sum of ``model``.

    Args:
        model: a ``residual_transformer`` (or any module with LayerNorms and residual protocol objects).
        gradients: also record the largest magnitude of each recorded tensor's gradient (in backward).

    Attributes:
        peaks: ``{site: largest |value| seen}``; a site is ``<module name>.input`` for a LayerNorm's input,
            ``<module name>.<method>[i]`` for the i-th tensor a protocol method returns (the branch input
            is ``prepare[0]``, the state's elements follow). Values in the model's units (no scaling).
        grad_peaks: the same for the gradients (empty without ``gradients``); under a loss scaler these
            are scaled gradients.

    Installs forward pre-hooks on the LayerNorms and instance-attribute wrappers on the protocol methods;
    both are removed on exit. Nothing the model computes changes.
    """

    def __init__(self, model: nn.Module, gradients: bool = False):
        self.model = model
        self.gradients = gradients
        self.peaks: Dict[str, float] = {}
        self.grad_peaks: Dict[str, float] = {}
        self._hooks = []
        self._wrapped = []

    def _record(self, site: str, t) -> None:
        if not torch.is_tensor(t) or not t.is_floating_point():
            return
        self.peaks[site] = max(self.peaks.get(site, 0.0), _peak(t))
        if self.gradients and t.requires_grad:
            def on_grad(g, _site=site):
                self.grad_peaks[_site] = max(self.grad_peaks.get(_site, 0.0), _peak(g))
            t.register_hook(on_grad)

    def _record_all(self, site: str, out) -> None:
        flat = []
        stack = [out]
        while stack:  # tensors in order: (branch input, [state...]) -> branch input, state[0], state[1], ...
            o = stack.pop(0)
            if isinstance(o, (list, tuple)):
                stack = list(o) + stack
            else:
                flat.append(o)
        for i, t in enumerate(flat):
            self._record(f"{site}[{i}]", t)

    def __enter__(self) -> "RunningSums":
        for name, module in self.model.named_modules():
            if _is_layer_norm(module):
                def pre_hook(_m, args, _site=f"{name}.input"):
                    self._record(_site, args[0])
                self._hooks.append(module.register_forward_pre_hook(pre_hook))
            methods = SUBLAYER_METHODS if isinstance(module, SublayerResidual) else \
                STACK_METHODS if isinstance(module, StackResidual) else ()
            for method in methods:
                def wrapper(*args, _f=getattr(module, method), _site=f"{name}.{method}"):
                    out = _f(*args)
                    self._record_all(_site, out)
                    return out
                setattr(module, method, wrapper)
                self._wrapped.append((module, method))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        for module, method in self._wrapped:
            module.__dict__.pop(method, None)
        self._hooks, self._wrapped = [], []

    def reset(self) -> None:
        """Forget what was recorded (the hooks stay)."""
        self.peaks, self.grad_peaks = {}, {}

    def top(self, grads: bool = False) -> Optional[Dict]:
        """The largest recorded peak: ``{"peak": float, "site": str, "fp16_headroom": 65504 / peak}`` (headroom
        below 1: that sum leaves fp16's range; 0 when it is inf), or None when nothing was recorded."""
        peaks = self.grad_peaks if grads else self.peaks
        if not peaks:
            return None
        site = max(peaks, key=lambda k: peaks[k])
        peak = peaks[site]
        return {"peak": peak, "site": site, "fp16_headroom": FP16_MAX / peak if peak > 0 else math.inf}

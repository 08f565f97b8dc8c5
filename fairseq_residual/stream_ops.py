"""Normalise-then-project products of the multi-stream schemes (hyper-connections, mHC) with their own backward.

Both schemes feed a normalised copy of the streams into a projection with a handful of outputs (hyper-connections:
``LN(h_i) [W_alpha | w_beta]``, Zhu et al. arXiv 2409.19606 eq. 10-13; mHC: ``RMSNorm(vec(H)) phi``, arXiv
2512.24880 eq. 7-8). Written with autograd's own operators, that costs more than the rest of the connection on
the CPU: ``torch.var_mean`` over rows of a few hundred values is a slow reduction (about 20 times a ``mean``
of the same tensor), and a matrix product with a long contraction and a tiny output (the weight's gradient,
``h^T g``, C x P by P x k) takes the slow orientation of the BLAS call. The functions here compute the same
values with the normalisation applied after the product (``LN(h) W = (h W - mean(h) 1^T W) / sqrt(var(h) +
eps)``, ``RMSNorm(x) W = (x W) / rms(x)``), so that the normalised streams are never formed, and give the
backward as its closed form, its products in the fast orientation; autograd keeps only the input (which the
mixing product keeps anyway), the weight and a few values per row. The streams' update ``h'_j = c_j + k_j o``
gets its closed-form backward the same way (:func:`stream_update`). Under TorchScript, which has no custom
autograd functions, and without gradients, the same formulas run with autograd's operators.
"""
from typing import Tuple

import torch
from torch import Tensor

from .user_errors import UnavailableHereError


def _layer_norm_projection_forward(h: Tensor, weight: Tensor, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """``(z, mean, rstd)``: z = LN(h) W (M x k) and LN's statistics (M x 1), for h M x C, W C x k.

    torch's fused LayerNorm kernel gives the normalised rows and both statistics in one pass (about twice as
    fast on the CPU as computing the statistics with separate reductions and subtracting after the product);
    the normalised rows are a temporary of the forward only: the backward keeps h, the statistics and z."""
    normed, mean, rstd = torch.native_layer_norm(h, [h.size(-1)], None, None, eps)
    return torch.mm(normed, weight), mean, rstd


class _LayerNormProjection(torch.autograd.Function):
    """:func:`layer_norm_projection` with the closed-form backward. With ``u = h W``, ``s = 1^T W`` (k),
    ``z = (u - mean s) rstd``, ``rstd = (var + eps)^(-1/2)``, ``du = dz rstd``:

        d mean = -sum_k du s,    d rstd = sum_k dz z / rstd,
        dh     = du W^T + (d mean - d rstd rstd^3 (h - mean)) / C     (d var / dh = 2 (h - mean) / C)
        dW     = h^T du - 1 (sum_M mean du)^T = (h - mean)^T du
    """

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, eps: float) -> Tensor:
        z, mean, rstd = _layer_norm_projection_forward(h, weight, eps)
        ctx.save_for_backward(h, weight, mean, rstd, z)
        return z

    @staticmethod
    def backward(ctx, grad: Tensor):
        h, weight, mean, rstd, z = ctx.saved_tensors
        du = grad * rstd  # M x k
        d_mean = -(du * weight.sum(dim=0)).sum(dim=-1, keepdim=True)  # M x 1
        d_rstd = (grad * z).sum(dim=-1, keepdim=True) / rstd
        centred = h - mean
        grad_h = torch.mm(du, weight.t()).addcmul_(centred, d_rstd * rstd.pow(3), value=-1.0 / h.size(-1))
        grad_h.add_(d_mean / h.size(-1))
        grad_weight = torch.mm(du.t(), centred).t()  # h^T du - 1 (sum_M mean du)^T, without the cancellation
        return grad_h, grad_weight, None


@torch.jit.unused
def _layer_norm_projection_function(h: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _LayerNormProjection.apply(h, weight, eps)


def layer_norm_projection(h: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``LN(h) W``, M x k, for h M x C (rows to normalise, contiguous) and the weight W C x k, LN a LayerNorm
    without parameters (hyper-connections' ``LN_hc``, arXiv 2409.19606 eq. 11-13), computed as
    ``LN(h) W`` (torch's fused LayerNorm, then the product) with a closed-form backward
    (:class:`_LayerNormProjection`)."""
    if torch.jit.is_scripting() or not (h.requires_grad or weight.requires_grad):
        return _layer_norm_projection_forward(h, weight, eps)[0]
    return _layer_norm_projection_function(h, weight, eps)


def _rms_projection_forward(x: Tensor, weight: Tensor, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """``(z, u, inv_rms)``: z = (RMSNorm(x) W)^T (k x M), u = (x W)^T, inv_rms (M), for x M x D, W D x k."""
    inv_rms = torch.rsqrt(x.square().mean(dim=-1) + eps)
    u = torch.mm(weight.t(), x.t())
    return u * inv_rms, u, inv_rms


class _RMSProjection(torch.autograd.Function):
    """:func:`rms_projection` with the closed-form backward. With ``u = (x W)^T`` (k x M), ``r = 1/rms(x) =
    (mean(x^2) + eps)^(-1/2)``, ``z = u r``, ``du = dz r``:

        d r = sum_k dz u,    dx = du^T W^T - d r r^3 x / D,    dW = x^T du^T
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        z, u, inv_rms = _rms_projection_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, u, inv_rms)
        return z

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, u, inv_rms = ctx.saved_tensors
        du = grad * inv_rms  # k x M
        scale = (grad * u).sum(dim=0) * inv_rms.pow(3) / x.size(-1)  # M
        grad_x = torch.mm(du.t(), weight.t()).addcmul_(x, scale.unsqueeze(-1), value=-1.0)
        grad_weight = torch.mm(du, x).t()
        return grad_x, grad_weight, None


@torch.jit.unused
def _rms_projection_function(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _RMSProjection.apply(x, weight, eps)


def rms_projection(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``(RMSNorm(x) W)^T``, k x M (positions last), for x M x D (contiguous rows) and the weight W D x k, the
    RMSNorm without parameters (mHC's, arXiv 2512.24880 eq. 7-8), computed as ``(x W) / rms(x)`` with
    ``rms(x) = sqrt(mean(x^2) + eps)`` and a closed-form backward (:class:`_RMSProjection`)."""
    if torch.jit.is_scripting() or not (x.requires_grad or weight.requires_grad):
        return _rms_projection_forward(x, weight, eps)[0]
    return _rms_projection_function(x, weight, eps)


class _StreamUpdate(torch.autograd.Function):
    """:func:`stream_update`'s product with the closed-form backward: for ``h' = c + k o`` (positions-first,
    c T x B x n x C, k T x B x n, o T x B x C), ``dc = dh'``, ``dk_j = dh'_j . o`` (over C), ``do = sum_j k_j dh'_j``
    (one product per position), instead of autograd's broadcast-and-reduce."""

    @staticmethod
    def forward(ctx, carried: Tensor, coefficient: Tensor, out: Tensor) -> Tensor:
        ctx.save_for_backward(coefficient, out)
        return torch.addcmul(carried, coefficient.unsqueeze(-1), out.unsqueeze(-2))

    @staticmethod
    def backward(ctx, grad: Tensor):
        coefficient, out = ctx.saved_tensors
        grad_coefficient = grad_out = None
        if ctx.needs_input_grad[1]:
            grad_coefficient = (grad * out.unsqueeze(-2)).sum(dim=-1)
        if ctx.needs_input_grad[2]:
            # contiguous coefficients (T x B x n, small): a strided one sends the batched product down
            # a per-position loop
            grad_out = torch.matmul(coefficient.contiguous().unsqueeze(-2), grad).squeeze(-2)
        return grad, grad_coefficient, grad_out


@torch.jit.unused
def _stream_update_function(carried: Tensor, coefficient: Tensor, out: Tensor) -> Tensor:
    return _StreamUpdate.apply(carried, coefficient, out)


def stream_update(carried: Tensor, coefficient: Tensor, out: Tensor) -> Tensor:
    """``h'_j = carried_j + coefficient[j] o`` (hyper-connections' ``h'_j = sum_i A_r[i, j] h_i + B[j] o``,
    arXiv 2409.19606 eq. 3 / Alg. 2; mHC's ``H_post[j]``, arXiv 2512.24880 eq. 3) for the carried streams
    n x T x B x C, the coefficients n x T x B and the branch output ``o`` T x B x C; computed positions-first, so
    that the result is laid out T x B x n x C in memory (returned as its n x T x B x C view): the next sub-layer
    then reads every position's n streams as one contiguous n C vector, without a copy. Its backward is the
    closed form (:class:`_StreamUpdate`) outside TorchScript."""
    carried, coefficient = carried.permute(1, 2, 0, 3), coefficient.permute(1, 2, 0)
    if torch.jit.is_scripting() or not (carried.requires_grad or coefficient.requires_grad or out.requires_grad):
        return torch.addcmul(carried, coefficient.unsqueeze(-1), out.unsqueeze(-2)).permute(2, 0, 1, 3)
    return _stream_update_function(carried, coefficient, out).permute(2, 0, 1, 3)


_COMPILED = {}


@torch.jit.unused
def compiled(fn, flag: str):
    """``torch.compile(fn)``, made once per function and shared by every module that calls it (dynamo keys its
    graphs on the function's code and lifts the calling module's parameters to inputs, so the connections of all
    sub-layers share the graphs: one for the stack's expanded start, one for the streams after an update, and
    a dynamic-shape one once a second batch shape is seen).

    Raises:
        UnavailableHereError (a RuntimeError): where ``torch.compile`` cannot run (:func:`compile_unavailable`),
            naming ``flag`` (the option that asked for it), why, and the fix. Raised at the first compiled call (the first training
            step), not when the model is built, so that a model trained with ``flag`` loads and decodes anywhere.
    """
    c = _COMPILED.get(fn)
    if c is None:
        reason = compile_unavailable()
        if reason:
            raise UnavailableHereError(f"{flag} cannot be honoured here: {reason}; train without {flag} (the eager "
                                       f"code computes the same function)")
        c = _COMPILED[fn] = torch.compile(fn)
    return c


def compile_unavailable() -> str:
    """Why ``torch.compile`` cannot run here ("" when it can): no ``torch.compile`` (torch < 2.0), a Python that
    dynamo does not support, or no C++ compiler for inductor's CPU code (``$CXX``, ``g++``, ``c++``, ``clang++``)."""
    import os
    import shutil

    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile (it needs torch >= 2.0)"
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported

        if not is_dynamo_supported():
            return "torch.compile (dynamo) does not support this Python or platform"
    except ImportError:
        pass
    if not any(shutil.which(c) for c in (os.environ.get("CXX") or "", "g++", "c++", "clang++") if c):
        return "torch.compile's inductor needs a C++ compiler and none was found ($CXX, g++, c++, clang++)"
    return ""

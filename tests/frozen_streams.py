"""Frozen copies of the hyper-connection and mHC residuals' computation as the plugin wrote it before their
restructuring for speed (one projection, normalisation after the matmul, one mixing product, Sinkhorn-Knopp
with its own backward), kept to prove that the restructured code computes the same function
(``tests/test_streams.py``). Two changes from that code: mHC's Sinkhorn-Knopp is in the paper's eq. 9 order
(columns, then rows), and every ``.float()`` is ``.to(compute dtype)``, ``torch.promote_types(dtype, float32)``
(identical under fp32, fp16 and bf16; float64 no longer rounded to fp32), so that the twins can be compared in
float64.

:func:`freeze` turns every hyper-connection / mHC residual of a model into its frozen twin, in place, keeping its
parameters."""
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_residual.schemes.hyper_connections import HyperConnection
from fairseq_residual.schemes.mhc import ManifoldHyperConnection


def _cd(x: Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def frozen_sinkhorn_knopp(logits: Tensor, iterations: int) -> Tensor:
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iterations):
        m = m / m.sum(dim=-2, keepdim=True)
        m = m / m.sum(dim=-1, keepdim=True)
    return m


class FrozenHyperConnection(HyperConnection):
    def coefficients(self, streams: Tensor) -> Tuple[Tensor, Tensor]:
        n, dt = self.n_streams, _cd(streams)
        alpha = self.static_alpha.to(dt).view(n, 1, 1, n + 1)
        beta = self.static_beta.to(dt).view(n, 1, 1)
        if self.dynamic_alpha_fn is not None:
            normed = F.layer_norm(streams.to(dt), (streams.size(-1),))
            alpha = alpha + self.dynamic_alpha_scale.to(dt) * torch.tanh(normed @ self.dynamic_alpha_fn.to(dt))
            beta = beta + self.dynamic_beta_scale.to(dt) * torch.tanh(normed @ self.dynamic_beta_fn.to(dt))
        else:
            alpha = alpha.expand(n, streams.size(1), streams.size(2), n + 1)
            beta = beta.expand(n, streams.size(1), streams.size(2))
        return alpha, beta

    def prepare_streams(self, state: List[Tensor]) -> Tuple[Tensor, List[Tensor]]:
        streams = state[0]
        alpha, beta = self.coefficients(streams)
        mixed = torch.einsum("itbu,itbc->utbc", alpha, streams.to(_cd(streams))).to(streams.dtype)
        return mixed[0], [mixed[1:], beta.to(streams.dtype)]

    def update_streams(self, state: List[Tensor], out: Tensor) -> List[Tensor]:
        return [state[0] + state[1].unsqueeze(-1) * out.unsqueeze(0)]


class FrozenManifoldHyperConnection(ManifoldHyperConnection):
    def coefficients(self, streams: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        n, t, b, c = streams.shape
        dt = _cd(streams)
        x = streams.to(dt).permute(1, 2, 0, 3).reshape(t, b, n * c)
        x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.rms_eps)
        pre = torch.sigmoid(self.alpha_pre.to(dt) * (x @ self.phi_pre.to(dt)) + self.b_pre.to(dt))
        post = 2 * torch.sigmoid(self.alpha_post.to(dt) * (x @ self.phi_post.to(dt)) + self.b_post.to(dt))
        res = self.alpha_res.to(dt) * (x @ self.phi_res.to(dt)).view(t, b, n, n) + self.b_res.to(dt)
        return pre, post, frozen_sinkhorn_knopp(res, self.sinkhorn_iterations)

    def prepare_streams(self, state: List[Tensor]) -> Tuple[Tensor, List[Tensor]]:
        streams = state[0]
        pre, post, res = self.coefficients(streams)
        h = streams.to(_cd(streams))
        branch = torch.einsum("tbi,itbc->tbc", pre, h).to(streams.dtype)
        carried = torch.einsum("tbji,itbc->jtbc", res, h).to(streams.dtype)
        return branch, [carried, post.permute(2, 0, 1).to(streams.dtype)]

    def update_streams(self, state: List[Tensor], out: Tensor) -> List[Tensor]:
        return [state[0] + state[1].unsqueeze(-1) * out.unsqueeze(0)]


FROZEN = {HyperConnection: FrozenHyperConnection, ManifoldHyperConnection: FrozenManifoldHyperConnection}


def freeze(model) -> int:
    """Give every hyper-connection / mHC residual of ``model`` its frozen computation; returns how many."""
    count = 0
    for module in model.modules():
        frozen = FROZEN.get(type(module))
        if frozen is not None:
            module.__class__ = frozen
            count += 1
    return count

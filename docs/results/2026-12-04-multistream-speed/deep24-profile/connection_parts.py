"""Component costs of one connection (process CPU time, interleaved), training P=672 with backward, or decoding P=20."""
import sys, time, statistics, torch
torch.set_num_threads(1)
from fairseq_residual.stream_ops import layer_norm_projection, rms_projection, stream_update
from fairseq_residual.schemes.mhc import sinkhorn_knopp_recomputed, sinkhorn_knopp_scripted
P = int(sys.argv[1]); reps = int(sys.argv[2]); grad = P > 100
n, C = 4, 256; k = n + 2; K = 2 * n + n * n
g = torch.Generator().manual_seed(0); r = lambda *s: torch.randn(*s, generator=g)
H = r(P, n, C); W = (r(C, k) * 0.05).requires_grad_(grad); Phi = (r(n * C, K) * 0.05).requires_grad_(grad)
static = r(n, k).requires_grad_(grad); scale = r(k).requires_grad_(grad)
out = r(P, C).requires_grad_(grad)
def leaf(x): return x.clone().requires_grad_(grad)
def bw(y):
    if grad: y.backward(torch.ones_like(y))
def plain_add():
    x = leaf(H[:, 0]); bw(x + out)
def update():
    c = leaf(H).view(P, 1, n, C).permute(2, 1, 0, 3); kk = leaf(r(P, n)).view(P, 1, n).permute(2, 1, 0)
    y = stream_update(c, kk, out.view(1, P, C)); bw(y)
def ln_proj():
    h = leaf(H); bw(layer_norm_projection(h.reshape(P * n, C), W, 1e-5))
def rms_proj():
    h = leaf(H); bw(rms_projection(h.reshape(P, n * C), Phi, 1e-20))
Z = r(P * n, k); Zm = r(K, P)
def hc_small():
    z = leaf(Z); coef = torch.addcmul(static, torch.tanh(z).view(P, n, k), scale); bw(coef)
ab = [r(()).requires_grad_(grad) for _ in range(3)]; bb = [r(n).requires_grad_(grad), r(n).requires_grad_(grad), r(n, n).requires_grad_(grad)]
def mhc_small_nosk():
    z = leaf(Zm); pre, post, res = z.split([n, n, n * n], 0)
    pre = torch.sigmoid(ab[0] * pre + bb[0].unsqueeze(-1)); post = 2 * torch.sigmoid(ab[1] * post + bb[1].unsqueeze(-1))
    res = ab[2] * res.view(n, n, P) + bb[2].unsqueeze(-1)
    bw(pre.sum() + post.sum() + res.sum())
def sinkhorn():
    l = leaf(r(n, n, P))
    if grad: bw(sinkhorn_knopp_recomputed(l, 20))
    else: sinkhorn_knopp_scripted(l, 20)
M = r(P, n, k)
def mixing():
    h = leaf(H); coef = leaf(M)
    mixed = coef[..., : n + 1].transpose(-1, -2) @ h
    branch, carried = mixed.split([1, n], dim=1); branch = branch.contiguous()
    if grad: torch.autograd.backward([branch, carried], [torch.ones_like(branch), torch.ones_like(carried)])
fns = dict(plain_add=plain_add, update=update, ln_proj=ln_proj, rms_proj=rms_proj, hc_small=hc_small,
           mhc_small_nosk=mhc_small_nosk, sinkhorn=sinkhorn, mixing=mixing)
cm = torch.enable_grad() if grad else torch.no_grad()
with cm:
    for f in fns.values(): f()
    ts = {kk: [] for kk in fns}
    inner = 5 if grad else 50
    for _ in range(reps):
        for kk, f in fns.items():
            c0 = time.process_time()
            for _ in range(inner): f()
            ts[kk].append((time.process_time() - c0) / inner)
for kk, v in ts.items():
    v = sorted(v); print(f"P={P} {kk:15s} median {statistics.median(v)*1e3:8.4f} ms  q1 {v[len(v)//4]*1e3:8.4f} q3 {v[3*len(v)//4]*1e3:8.4f}")

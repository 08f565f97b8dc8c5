"""One connection (prepare + identity-like branch + update), forward + backward, at deep24's training / decoding shapes."""
import sys, time, statistics, torch
torch.set_num_threads(1)
from fairseq_residual.residual import Site
from fairseq_residual.schemes.hyper_connections import HyperConnection
from fairseq_residual.schemes.mhc import ManifoldHyperConnection
n, C = 4, 256
T, B = int(sys.argv[1]) if len(sys.argv) > 1 else 32, int(sys.argv[2]) if len(sys.argv) > 2 else 21
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 30
grad = T > 1
site = Site("decoder", "ffn", 3, 24, 11, 3, C, 24, 24)
g = torch.Generator().manual_seed(0)
conns = {"hc": HyperConnection(site, n, True), "mhc": ManifoldHyperConnection(site, n)}
for c in conns.values():
    with torch.no_grad():
        for p in c.parameters(): p.add_(0.05 * torch.randn(p.shape, generator=g))
base = torch.randn(T, B, n, C, generator=g)
W = torch.randn(C, C, generator=g) / 16
def step_plain():
    x = base[:, :, 0].clone().requires_grad_(grad)
    out = (x @ W)
    y = x + out
    if grad: y.backward(torch.ones_like(y))
def make(c):
    def step():
        s = base.clone().requires_grad_(grad)
        state = [s.permute(2, 0, 1, 3)]
        ctx = {}
        br, st = c.prepare(state, ctx)
        out = br @ W
        new = c.update(st, out, ctx)[0]
        if grad: new.backward(torch.ones_like(new))
    return step
fns = {"plain": step_plain, **{k: make(c) for k, c in conns.items()}}
import fairseq_residual.schemes.hyper_connections as HCm, fairseq_residual.schemes.mhc as MHm
def old(f):
    def g():
        saved = [getattr(m, "use_fused_training", None) for m in (HCm, MHm)]
        for m in (HCm, MHm):
            if hasattr(m, "use_fused_training"): m.use_fused_training = lambda: False
        try: f()
        finally:
            for m, v in zip((HCm, MHm), saved):
                if v is not None: m.use_fused_training = v
    return g
fns["hc_old"] = old(fns["hc"]); fns["mhc_old"] = old(fns["mhc"])
ctxm = torch.enable_grad() if grad else torch.no_grad()
with ctxm:
    for f in fns.values(): f()
    ts = {k: [] for k in fns}
    for r in range(reps):
        for k, f in fns.items():
            c0 = time.process_time(); f(); ts[k].append(time.process_time() - c0)
for k, v in ts.items():
    extra = [a - b for a, b in zip(v, ts["plain"])]
    print(f"T={T} B={B} {k:6s} median {statistics.median(v)*1e3:7.3f} ms  extra over plain {statistics.median(extra)*1e3:7.3f} ms  [q1..q3 {sorted(extra)[len(extra)//4]*1e3:.3f}..{sorted(extra)[3*len(extra)//4]*1e3:.3f}]")
import os
if os.environ.get("PAIR"):
    a, b = os.environ["PAIR"].split(",")
    d = [x - y for x, y in zip(ts[a], ts[b])]
    d.sort()
    print(f"paired {a}-{b}: median {statistics.median(d)*1e3:.3f} ms q1 {d[len(d)//4]*1e3:.3f} q3 {d[3*len(d)//4]*1e3:.3f}; {a} {statistics.median(ts[a])*1e3:.2f} {b} {statistics.median(ts[b])*1e3:.2f}")

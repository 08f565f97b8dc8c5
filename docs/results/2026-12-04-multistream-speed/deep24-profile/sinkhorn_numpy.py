import time, statistics, torch, numpy as np
torch.set_num_threads(1)
from fairseq_residual.schemes.mhc import sinkhorn_knopp_scripted, sinkhorn_knopp_positions_last
l = torch.randn(4, 4, 20)
def np_sk(logits, it):
    a = logits.numpy()
    m = np.exp(a - a.max(axis=(0, 1), keepdims=True))
    s0 = np.empty((1,) + m.shape[1:], m.dtype); s1 = np.empty((m.shape[0], 1, m.shape[2]), m.dtype)
    for _ in range(it):
        np.sum(m, axis=0, keepdims=True, out=s0); np.divide(m, s0, out=m)
        np.sum(m, axis=1, keepdims=True, out=s1); np.divide(m, s1, out=m)
    return torch.from_numpy(m)
ref = sinkhorn_knopp_positions_last(l.double(), 20)
print("np vs torch64", (np_sk(l.double(), 20) - ref).abs().max().item(), "scripted", (sinkhorn_knopp_scripted(l.double(), 20) - ref).abs().max().item())
fs = {"scripted": lambda: sinkhorn_knopp_scripted(l, 20), "numpy": lambda: np_sk(l, 20)}
ts = {k: [] for k in fs}
for _ in range(30):
    for k, f in fs.items():
        c0 = time.process_time()
        for _ in range(100): f()
        ts[k].append((time.process_time() - c0) / 100)
for k, v in ts.items(): print(k, f"{statistics.median(v)*1e6:.1f} us")

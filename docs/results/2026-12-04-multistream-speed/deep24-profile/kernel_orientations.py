import time, statistics, torch
torch.set_num_threads(1)
P, n, C = 672, 4, 256
g = torch.Generator().manual_seed(0)
r = lambda *s: torch.randn(*s, generator=g)
h = r(P, n, C); hf = h.view(P * n, C); W = r(C, n + 2); du = r(P * n, n + 2); gh = r(P * n, C)
coef = r(P, n, n + 2); gm = r(P, n + 1, C); gb = r(P, 1, C); gc = r(P, n, C); out = r(P, C)
Wt = W.t().contiguous()
cases = {
 "fwd mm(normed,W)": lambda: torch.mm(hf, W),
 "fwd mm(W^T,normed^T)^T": lambda: torch.mm(W.t(), hf.t()).t(),
 "bwd mm(du,W^T) [view]": lambda: torch.mm(du, W.t()),
 "bwd mm(du,Wt contig)": lambda: torch.mm(du, Wt),
 "bwd (W @ du^T)^T": lambda: torch.mm(W, du.t()).t(),
 "bwd addmm(gh,du,W^T)": lambda: torch.addmm(gh, du, W.t()),
 "bwd addmm(gh,du,Wt)": lambda: torch.addmm(gh, du, Wt),
 "mix fwd bmm(coef^T strided,h)": lambda: torch.bmm(coef[:, :, :n + 1].transpose(1, 2), h),
 "mix fwd bmm(contig coef^T,h)": lambda: torch.bmm(coef[:, :, :n + 1].transpose(1, 2).contiguous(), h),
 "mix fwd 2 bmm": lambda: (torch.bmm(coef[:, :, :1].transpose(1, 2), h), torch.bmm(coef[:, :, 1:n + 1].transpose(1, 2), h)),
 "mix bwd gh bmm(coef strided, gm)": lambda: torch.bmm(coef[:, :, :n + 1], gm),
 "mix bwd gh bmm(coef contig, gm)": lambda: torch.bmm(coef[:, :, :n + 1].contiguous(), gm),
 "mix bwd gh baddbmm(outer, coefr, gc)": lambda: torch.baddbmm(coef[:, :, :1] * gb, coef[:, :, 1:n + 1], gc),
 "mix bwd gh baddbmm contig": lambda: torch.baddbmm(torch.bmm(coef[:, :, :1].contiguous(), gb), coef[:, :, 1:n + 1].contiguous(), gc),
 "mix bwd gcoef bmm(gm,h^T)": lambda: torch.bmm(gm, h.transpose(1, 2)),
 "mix bwd gcoef bmm(h,gm^T)": lambda: torch.bmm(h, gm.transpose(1, 2)),
 "mix bwd gcoef 2 bmm(h,g^T)": lambda: (torch.bmm(h, gb.transpose(1, 2)), torch.bmm(h, gc.transpose(1, 2))),
 "mix bwd cat": lambda: torch.cat([gb, gc], 1),
 "upd gk mul-sum": lambda: (gc * out.unsqueeze(1)).sum(-1),
 "upd gk bmm": lambda: torch.bmm(gc, out.unsqueeze(-1)),
 "add 4PxC": lambda: gc + h,
 "add_ 4PxC": lambda: gc.add_(h),
 "layer_norm": lambda: torch.native_layer_norm(hf, [C], None, None, 1e-5),
 "copy PxC": lambda: gb.clone(),
}
ts = {k: [] for k in cases}
for rep in range(25):
    for k, f in cases.items():
        c0 = time.process_time()
        for _ in range(10): f()
        ts[k].append((time.process_time() - c0) / 10)
for k, v in ts.items():
    v = sorted(v); print(f"{k:40s} median {statistics.median(v)*1e3:7.3f} ms  q1 {v[len(v)//4]*1e3:7.3f} q3 {v[3*len(v)//4]*1e3:7.3f}")

"""float64 outputs and gradients of the multi-stream schemes with the code on PYTHONPATH: save or compare."""
import sys, torch
sys.path.insert(0, "tests")
from test_streams import IDENTITY_CASES, streams_model
from conftest import random_batch

def run(scheme, streams, static, seed):
    model, d = streams_model(scheme, streams, static, seed)
    src, lengths, prev, _ = random_batch(d, bsz=5)
    w = torch.randn(5, prev.size(1), len(d), dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    out = {}
    model.train(); model.zero_grad(set_to_none=True)
    lp = torch.log_softmax(model(src, lengths, prev)[0], dim=-1)
    (lp * w)[prev.ne(d.pad())].sum().div(prev.ne(d.pad()).sum()).backward()
    out["train_lp"] = lp.detach()
    for n, p in model.named_parameters():
        if p.grad is not None: out["grad." + n] = p.grad
    model.eval()
    with torch.no_grad():
        out["eval_lp"] = torch.log_softmax(model(src, lengths, prev)[0], dim=-1)
        enc = model.encoder(src, lengths)
        inc = {}
        steps = []
        for t in range(prev.size(1)):
            x, _ = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=inc)
            steps.append(x[:, -1])
        out["incremental"] = torch.stack(steps, 1)
    out["keep"] = prev.ne(d.pad())
    return out

mode, path = sys.argv[1], sys.argv[2]
res = {}
for case in IDENTITY_CASES:
    for seed in (1, 2):
        res[case + (seed,)] = run(*case, seed)
if mode == "save":
    torch.save(res, path)
else:
    ref = torch.load(path)
    worst = {}
    for k, o in res.items():
        r = ref[k]
        for key in o:
            if key == "keep": continue
            a, b = o[key], r[key]
            if key in ("train_lp", "eval_lp", "incremental"):
                diff = (a - b)[o["keep"]].abs().max().item()
            else:
                diff = (a - b).abs().max().item()
            kind = key.split(".")[0]
            worst[(k[0], kind)] = max(worst.get((k[0], kind), 0.0), diff)
    for k, v in sorted(worst.items()): print(k, f"{v:.3g}")
    print("MAX", max(worst.values()))

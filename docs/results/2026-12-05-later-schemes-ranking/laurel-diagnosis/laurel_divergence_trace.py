"""Where the eval-mode and the train-mode forward pass of a LAuReL-RW checkpoint part ways: a sub-layer by
sub-layer trace of one valid batch, and single-site dropout ablations in the decoder. Trains nothing.

    PYTHONPATH=<checkout> python laurel_divergence_trace.py CHECKPOINT DATA_BIN [--seeds 3] [--layers 7-12]
        [--sites all | decoder:9:ffn,decoder:9:encoder_attn ...] [--json OUT.json]

1. single-site ablations: dropout (the checkpoint's p) at exactly one decoder sub-layer output (layer L of --layers,
   kind self_attn / encoder_attn / ffn), the model otherwise in eval mode: nll, entropy (bits), mean of --seeds.
2. trace: the eval pass (no dropout) and a pass with dropout at --sites ("all" = model.train(); or a list of
   stack:layer:kind, 1-based layers; "emb" for a stack's embedding dropout), same batch, per seed. At every decoder
   sub-layer (and the final LayerNorm) over the non-pad target positions:
     in:  the stream the sub-layer's LayerNorm reads: mean |channel mean| (|mu|), mean centred std (sd) in eval
          and dropout passes, cos(x_drop, x_eval) of the stream itself and of its LN output;
     h:   the branch output (after dropout in the dropout pass): mean norm, eval vs dropout pass, and cos;
          cos(h, x): in the eval pass, the angle between the branch output and the stream x it is mixed into
          (x' = alpha h + beta x): strongly negative means the two cancel and x' is small beside them;
   so the first sub-layer whose output direction moves tells where the passes part.
3. sigma swap: the eval pass with a group of LayerNorms (--sigma-groups: dec_final, dec_from:L, dec_all, all)
   dividing by the per-position sigma = sqrt(var + eps) that each had in the dropout pass (same seed), and the
   converse (the dropout pass with the eval pass's sigmas): nll, entropy. If the eval pass with dropout-pass
   sigmas recovers the train-mode nll, the gap is the LN scale (noise inflating sigma), not the noise's direction.
Uses the SiteDropout and loaders of laurel_train_eval_diagnosis.py (same folder).
"""
import argparse
import json
import os
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from laurel_train_eval_diagnosis import KINDS, Probe, batches, load, nll_entropy  # noqa: E402


def parse_sites(text, pr):
    if text == "all":
        return pr.all_sites()
    s = set()
    for item in text.split(","):
        parts = item.split(":")
        if parts[1] == "emb":
            s.add((parts[0], "emb", None))
        else:
            s.add((parts[0], int(parts[1]) - 1, parts[2]))
    return s


def trace(pr: Probe, sites, seeds):
    m = pr.model
    dec = m.decoder
    rec = {}

    hooks = []
    names = []
    for i, layer in enumerate(dec.layers):
        for kind in KINDS["decoder"]:
            ln = getattr(layer, {"self_attn": "self_attn_layer_norm", "encoder_attn": "encoder_attn_layer_norm",
                                 "ffn": "final_layer_norm"}[kind])
            name = f"L{i + 1:02d} {kind}"
            names.append(name)

            def pre(mod, args, name=name):
                rec[name + " in"] = args[0].detach()

            def post(mod, args, out, name=name):
                rec[name + " ln"] = out.detach()
            hooks += [ln.register_forward_pre_hook(pre), ln.register_forward_hook(post)]
            res = getattr(layer, f"{kind}_residual")
            orig = type(res).update

            def upd(state, out, ctx, res=res, orig=orig, name=name):
                rec[name + " h"] = out.detach()
                rec[name + " x"] = state[0].detach()
                return orig(res, state, out, ctx)
            res.update = upd
    names.append("final")
    hooks += [dec.layer_norm.register_forward_pre_hook(lambda mod, a: rec.__setitem__("final in", a[0].detach())),
              dec.layer_norm.register_forward_hook(lambda mod, a, o: rec.__setitem__("final ln", o.detach()))]

    pr.install_sites()
    m.eval()
    acc = defaultdict(list)
    for b in pr.bs:
        real = b["target"].ne(pr.pad).transpose(0, 1)
        pr.set_sites(set()); pr.logits(b, 0); ev = dict(rec)
        for s in seeds:
            pr.set_sites(sites); pr.logits(b, s); dr = dict(rec)
            for n in names:
                for part in ("in", "ln", "h"):
                    key = f"{n} {part}"
                    if key not in ev:
                        continue
                    if part == "h":  # the angle between the branch output and the stream it is mixed into
                        acc[key + " cos_hx eval"].append(
                            F.cosine_similarity(ev[key][real], ev[f"{n} x"][real], dim=-1).mean().item())
                    e, d = ev[key][real], dr[key][real]
                    if part == "in":
                        acc[key + " |mu| eval"].append(e.mean(-1).abs().mean().item())
                        acc[key + " |mu| drop"].append(d.mean(-1).abs().mean().item())
                        acc[key + " sd eval"].append(e.std(-1, unbiased=False).mean().item())
                        acc[key + " sd drop"].append(d.std(-1, unbiased=False).mean().item())
                    else:
                        acc[key + " norm eval"].append(e.norm(dim=-1).mean().item())
                        acc[key + " norm drop"].append(d.norm(dim=-1).mean().item())
                    acc[key + " cos"].append(F.cosine_similarity(e, d, dim=-1).mean().item())
    pr.restore()
    for h in hooks:
        h.remove()
    for layer in dec.layers:
        for kind in KINDS["decoder"]:
            del getattr(layer, f"{kind}_residual").update
    out = {k: sum(v) / len(v) for k, v in acc.items()}
    print("sub-layer          | LN input: |mu| eval/drop   sd eval/drop   cos(x) | cos(LN x) | h: norm eval/drop  cos(h) | cos(h,x) eval")
    for n in names:
        g = lambda k: out.get(f"{n} {k}", float("nan"))
        print(f"{n:18s} | {g('in |mu| eval'):7.3f} {g('in |mu| drop'):7.3f}  {g('in sd eval'):7.3f} {g('in sd drop'):7.3f}"
              f"  {g('in cos'):6.3f} | {g('ln cos'):6.3f}   | {g('h norm eval'):7.3f} {g('h norm drop'):7.3f}  "
              f"{g('h cos'):6.3f} | {g('h cos_hx eval'):6.3f}")
    return out


def ln_modules(m, which):
    """{name: LayerNorm} of the model: which = 'dec_all' (the decoder's sub-layer LNs and its final LN),
    'dec_from:L' (decoder sub-layer LNs of layers >= L, 1-based, and its final LN), 'dec_final', 'all' (encoder's
    too)."""
    out = {}
    for stack in ("encoder", "decoder"):
        st = getattr(m, stack)
        for i, layer in enumerate(st.layers):
            for ln_name in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"):
                ln = getattr(layer, ln_name, None)
                if ln is not None:
                    out[(stack, i + 1, ln_name)] = ln
        out[(stack, 99, "layer_norm")] = st.layer_norm
    if which == "all":
        return out
    out = {k: v for k, v in out.items() if k[0] == "decoder"}
    if which == "dec_final":
        return {k: v for k, v in out.items() if k[1] == 99}
    if which.startswith("dec_from:"):
        lo = int(which.split(":")[1])
        return {k: v for k, v in out.items() if k[1] >= lo}
    return out


def sigma_swap(pr: Probe, sites, seeds, groups):
    """Eval pass whose LayerNorms (a group) divide by the per-position sigma = sqrt(var + eps) that the same LN
    had in a dropout pass (dropout at ``sites``, seed s), and the converse (dropout pass, LN sigma of the eval
    pass): does the LN's scale alone carry the train / eval gap?"""
    m = pr.model
    pr.install_sites()
    m.eval()
    rows = []
    for group in groups:
        lns = ln_modules(m, group)
        for direction in ("eval pass, dropout-pass sigma", "dropout pass, eval-pass sigma"):
            tot_n = tot_e = tot_t = 0.0
            for s in seeds:
                for b in pr.bs:
                    sig, hooks = {}, []
                    for k, ln in lns.items():
                        def rec(mod, a, k=k):
                            x = a[0].float()
                            sig[k] = (x.var(-1, keepdim=True, unbiased=False) + mod.eps).sqrt()
                        hooks.append(ln.register_forward_pre_hook(rec))
                    src_sites, dst_sites = (sites, set()) if direction.startswith("eval") else (set(), sites)
                    pr.set_sites(src_sites); pr.logits(b, s)
                    for h in hooks:
                        h.remove()
                    hooks = []
                    for k, ln in lns.items():
                        def swap(mod, a, o, k=k):
                            x = a[0]
                            return ((x - x.mean(-1, keepdim=True)) / sig[k] * mod.weight + mod.bias).to(o.dtype)
                        hooks.append(ln.register_forward_hook(swap))
                    pr.set_sites(dst_sites)
                    with torch.no_grad():
                        lg = pr.logits(b, s)
                    for h in hooks:
                        h.remove()

                    n, e, t = nll_entropy(lg, b, pr.pad)
                    tot_n += n; tot_e += e; tot_t += t
            ln2 = 0.6931471805599453
            rows.append([group, direction, tot_n / tot_t / ln2, tot_e / tot_t / ln2])
            print(f"[sigma swap] LNs {group:12s} {direction:32s} nll {rows[-1][2]:7.3f} entropy {rows[-1][3]:6.3f}")
    pr.restore()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("data")
    ap.add_argument("--batches", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--layers", default="7-12")
    ap.add_argument("--sites", default="all")
    ap.add_argument("--no-ablation", action="store_true")
    ap.add_argument("--sigma-groups", default="dec_final,dec_from:9,dec_all,all",
                    help="LN groups for the sigma swap ('' to skip)")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, cfg, task = load(a.checkpoint, a.data)
    model.eval()
    pr = Probe(model, task, batches(task, a.batches, a.max_tokens))
    seeds = list(range(a.seeds))
    out = {"checkpoint": a.checkpoint, "sites": a.sites}
    ev = pr.score()
    print(f"{a.checkpoint}: eval nll {ev[0]:.3f} bits, entropy {ev[1]:.3f}")
    if not a.no_ablation:
        lo, hi = (int(x) for x in a.layers.split("-"))
        pr.install_sites()
        rows = []
        for layer in range(lo, hi + 1):
            for kind in KINDS["decoder"]:
                pr.set_sites({("decoder", layer - 1, kind)})
                nll, ent, per = pr.score_seeds(seeds)
                print(f"[single site] decoder L{layer:02d} {kind:12s} nll {nll:7.3f} entropy {ent:6.3f}  "
                      f"per seed {' '.join(f'{x:.2f}' for x in per)}")
                rows.append([layer, kind, nll, ent])
        pr.restore()
        out["single_site"] = rows
    print(f"[trace] dropout at: {a.sites}")
    out["trace"] = trace(pr, parse_sites(a.sites, pr), seeds)
    if a.sigma_groups:
        out["sigma_swap"] = sigma_swap(pr, parse_sites(a.sites, pr), seeds, a.sigma_groups.split(","))
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()

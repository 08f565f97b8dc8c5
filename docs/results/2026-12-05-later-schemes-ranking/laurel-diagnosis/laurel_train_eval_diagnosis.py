"""Why a trained LAuReL-RW checkpoint scores far worse in eval mode (dropout off) than in train mode (dropout on):
five probes on the first valid batch(es), nothing trained, nothing written but stdout (and --json).

    PYTHONPATH=<checkout> python laurel_train_eval_diagnosis.py CHECKPOINT DATA_BIN [--batches 1] [--seeds 3]
        [--parts equal,coeffs,sites,stream,temperature] [--json OUT.json]

Parts (all by default):

equal        the bug check: every dropout p set to 0, model.train() vs model.eval() on the same batch; prints the
             largest |logit difference| and both nlls (they must agree: dropout is the only mode-dependent op).
coeffs       the learned (alpha, beta) = softmax(w) of every sub-layer (LaurelRWResidual.w), and the weight each
             branch output and the embedding get in the stack's final stream, c_i = alpha_i prod_{j>i} beta_j.
sites        dropout at chosen sites only, the model otherwise in eval mode: each layer's dropout module is replaced
             by one that applies fairseq's dropout (p of the checkpoint) only at the chosen calls (encoder layer:
             self-attention output, FFN output; decoder layer: self-attention, cross-attention, FFN output), and
             the stacks' embedding dropout is switched on or off. nll (bits / target token) and predicted entropy
             (bits), the mean over --seeds dropout seeds. "all" reproduces model.train() exactly (checked).
stream       the input of the decoder's (and encoder's) final LayerNorm in eval mode (x_e) and in train mode (x_t,
             same batch, per seed): mean per-position norms, the per-position std LN divides by, the share of x_t
             that is dropout noise ||x_t - x_e||^2 / ||x_t||^2, cos(x_t, x_e), and the nll of eval features
             normalised with the *train-mode* std (LN(x_e) with sigma_t instead of sigma_e: does the LN scale alone
             carry the gap?), and with x_t's mean over seeds (the average over masks) as LN input.
temperature  nll of eval-mode logits / T over a grid of T (and the best), and of train-mode logits for reference.

nll is computed as fairseq's criterion does (sum over non-pad targets of -log p, / tokens / ln 2), bits.
"""
import argparse
import json
import math
from typing import Dict, Set, Tuple

import torch
import torch.nn.functional as F
from torch import nn

import fairseq_residual  # noqa: F401  (registers the model)
from fairseq import checkpoint_utils
from fairseq.modules.fairseq_dropout import FairseqDropout

LN2 = math.log(2)
KINDS = {"encoder": ("self_attn", "ffn"), "decoder": ("self_attn", "encoder_attn", "ffn")}


class SiteDropout(nn.Module):
    """Replaces a layer's dropout_module: its i-th call in a layer's forward is sub-layer KINDS[stack][i]'s output
    dropout; applies F.dropout(p) only when that kind is in ``enabled`` (train or eval mode alike)."""

    def __init__(self, p: float, kinds: Tuple[str, ...]):
        super().__init__()
        self.p, self.kinds, self.calls, self.enabled = p, kinds, 0, set()
        self.module_name = None

    def forward(self, x, inplace: bool = False):
        kind = self.kinds[self.calls % len(self.kinds)]
        self.calls += 1
        if kind in self.enabled and self.p > 0:
            return F.dropout(x, p=self.p, training=True)
        return x


def load(path, data):
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
    return models[0], cfg, task


def batches(task, n, max_tokens):
    task.load_dataset("valid")
    it = task.get_batch_iterator(task.dataset("valid"), max_tokens=max_tokens).next_epoch_itr(shuffle=False)
    return [next(it) for _ in range(n)]


def nll_entropy(logits, batch, pad):
    lprobs = F.log_softmax(logits.float(), dim=-1)
    target = batch["target"]
    real = target.ne(pad)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)[real].sum()
    ent = -(lprobs.exp() * lprobs).sum(-1)[real].sum()
    return float(nll), float(ent), int(real.sum())


class Probe:
    def __init__(self, model, task, bs):
        self.model, self.task, self.bs = model, task, bs
        self.pad = task.target_dictionary.pad()
        self.p = model.decoder.dropout_module.p
        self.orig = {}  # layer -> its FairseqDropout, to restore
        for stack in ("encoder", "decoder"):
            for i, layer in enumerate(getattr(model, stack).layers):
                self.orig[(stack, i)] = layer.dropout_module

    # -- site control -------------------------------------------------------------------------------------
    def install_sites(self):
        for (stack, i), d in self.orig.items():
            getattr(self.model, stack).layers[i].dropout_module = SiteDropout(d.p, KINDS[stack])

    def restore(self):
        for (stack, i), d in self.orig.items():
            getattr(self.model, stack).layers[i].dropout_module = d
        for stack in ("encoder", "decoder"):
            getattr(self.model, stack).dropout_module.apply_during_inference = False

    def set_sites(self, sites: Set[Tuple]):
        """sites: {("encoder"|"decoder", layer or "emb", kind or None)}."""
        for stack in ("encoder", "decoder"):
            getattr(self.model, stack).dropout_module.apply_during_inference = (stack, "emb", None) in sites
            for i, layer in enumerate(getattr(self.model, stack).layers):
                layer.dropout_module.enabled = {k for k in KINDS[stack] if (stack, i, k) in sites}
                layer.dropout_module.calls = 0

    def all_sites(self):
        s = set()
        for stack in ("encoder", "decoder"):
            s.add((stack, "emb", None))
            for i in range(len(getattr(self.model, stack).layers)):
                for k in KINDS[stack]:
                    s.add((stack, i, k))
        return s

    # -- forward ------------------------------------------------------------------------------------------
    def logits(self, batch, seed=0):
        torch.manual_seed(seed)
        with torch.no_grad():
            return self.model(**batch["net_input"])[0]

    def score(self, seed=0, logits_fn=None):
        tot = [0.0, 0.0, 0]
        for b in self.bs:
            with torch.no_grad():
                lg = self.logits(b, seed) if logits_fn is None else logits_fn(b, seed)
            n, e, t = nll_entropy(lg, b, self.pad)
            tot[0] += n; tot[1] += e; tot[2] += t
        return tot[0] / tot[2] / LN2, tot[1] / tot[2] / LN2

    def score_seeds(self, seeds, logits_fn=None):
        r = [self.score(s, logits_fn) for s in seeds]
        return sum(x[0] for x in r) / len(r), sum(x[1] for x in r) / len(r), [x[0] for x in r]


def part_equal(pr: Probe, out):
    m = pr.model
    saved = {}
    for name, mod in m.named_modules():
        if isinstance(mod, (FairseqDropout, SiteDropout)):
            saved[name] = mod.p
            mod.p = 0.0
    res = {}
    for mode in ("train", "eval"):
        getattr(m, mode)()
        res[mode] = [pr.logits(b) for b in pr.bs]
    diff = max(float((a - b).abs().max()) for a, b in zip(res["train"], res["eval"]))
    m.train(); nt = pr.score()
    m.eval(); ne = pr.score()
    for name, mod in m.named_modules():
        if name in saved:
            mod.p = saved[name]
    print(f"[equal] dropout p=0 everywhere ({len(saved)} modules): max |logit(train) - logit(eval)| = {diff:.3g}; "
          f"nll train-mode {nt[0]:.4f}, eval-mode {ne[0]:.4f} bits")
    out["equal"] = {"max_abs_logit_diff": diff, "nll_train_mode_p0": nt[0], "nll_eval_mode_p0": ne[0],
                    "dropout_modules": len(saved)}


def part_coeffs(pr: Probe, out):
    res = {}
    for stack in ("encoder", "decoder"):
        rows = []
        for i, layer in enumerate(getattr(pr.model, stack).layers):
            for k in KINDS[stack]:
                r = getattr(layer, f"{k}_residual")
                ab = torch.softmax(r.w.detach().float(), 0).tolist()
                rows.append((i, k, ab[0], ab[1]))
        # weight of each branch in the final stream: alpha_i * prod_{j>i} beta_j; embedding: prod beta
        weights, tail = [], 1.0
        for i, k, a, b in reversed(rows):
            weights.append(a * tail)
            tail *= b
        weights.reverse()
        res[stack] = {"alpha_beta": [[i, k, a, b] for i, k, a, b in rows],
                      "final_weight": weights, "embedding_final_weight": tail}
        print(f"[coeffs] {stack}: (layer kind alpha beta | weight in final stream)")
        for (i, k, a, b), wt in zip(rows, weights):
            print(f"   L{i + 1:02d} {k:12s} alpha {a:.4f} beta {b:.4f} | {wt:.3g}")
        print(f"   embedding weight in final stream {tail:.3g}")
    out["coeffs"] = res


def site_configs(pr: Probe):
    A = pr.all_sites()
    ne, nd = len(pr.model.encoder.layers), len(pr.model.decoder.layers)
    cfgs = [("none (eval)", set()), ("all (= train mode)", A)]
    emb = {("encoder", "emb", None), ("decoder", "emb", None)}
    enc = {s for s in A if s[0] == "encoder"}
    dec = {s for s in A if s[0] == "decoder"}
    cfgs += [("embeddings only (enc+dec)", emb), ("encoder all sites", enc), ("decoder all sites", dec),
             ("decoder layers only (no emb)", dec - {("decoder", "emb", None)}),
             ("all but embeddings", A - emb)]
    for stack in ("encoder", "decoder"):
        for k in KINDS[stack]:
            cfgs.append((f"{stack} {k} outputs, all layers", {s for s in A if s[0] == stack and s[2] == k}))
    for i in range(nd):
        cfgs.append((f"decoder L{i + 1:02d} (all kinds)", {s for s in dec if s[1] == i}))
    for k in KINDS["decoder"]:
        cfgs.append((f"decoder L{nd:02d} {k} only", {("decoder", nd - 1, k)}))
    for top in (2, 3, 4, 6):
        cfgs.append((f"decoder top {top} layers", {s for s in dec if s[1] != "emb" and s[1] >= nd - top}))
    for i in range(ne):
        cfgs.append((f"encoder L{i + 1:02d} (all kinds)", {s for s in enc if s[1] == i}))
    # leave-one-out from train mode
    for i in range(nd):
        cfgs.append((f"all but decoder L{i + 1:02d}", A - {s for s in dec if s[1] == i}))
    for k in KINDS["decoder"]:
        cfgs.append((f"all but decoder {k} outputs", A - {s for s in dec if s[2] == k}))
    cfgs.append(("all but decoder top 2 layers", A - {s for s in dec if s[1] != "emb" and s[1] >= nd - 2}))
    return cfgs


def part_sites(pr: Probe, seeds, out):
    m = pr.model
    # exactness: SiteDropout with every site on == model.train() with fairseq's modules, same seed
    m.train(); ref = pr.score(seeds[0])
    pr.install_sites(); m.eval(); pr.set_sites(pr.all_sites()); mine = pr.score(seeds[0])
    print(f"[sites] model.train() nll {ref[0]:.4f}; eval + all sites {mine[0]:.4f} (same masks: must agree)")
    res = []
    for name, sites in site_configs(pr):
        pr.set_sites(sites)
        nll, ent, per = pr.score_seeds(seeds if sites else seeds[:1])
        print(f"[sites] {name:34s} nll {nll:7.3f} bits  entropy {ent:6.3f}  per seed {' '.join(f'{x:.2f}' for x in per)}")
        res.append({"sites": name, "nll": nll, "entropy": ent, "per_seed": per})
    pr.restore()
    out["sites"] = {"train_mode_check": [ref[0], mine[0]], "rows": res}


def part_stream(pr: Probe, seeds, out):
    m = pr.model
    caught: Dict[str, torch.Tensor] = {}

    def hook(name):
        def f(mod, args):
            caught[name] = args[0].detach()
        return f

    hs = [m.encoder.layer_norm.register_forward_pre_hook(hook("encoder")),
          m.decoder.layer_norm.register_forward_pre_hook(hook("decoder"))]

    def grab(mode, b, seed):
        getattr(m, mode)()
        lg = pr.logits(b, seed)
        return lg, dict(caught)

    res = {}
    ev_lg, tr_lg, stats = [], [], {s: {} for s in ("encoder", "decoder")}
    for bi, b in enumerate(pr.bs):
        real = b["target"].ne(pr.pad).transpose(0, 1)  # T x B
        src_real = b["net_input"]["src_tokens"].ne(pr.task.source_dictionary.pad()).transpose(0, 1)
        le, xe = grab("eval", b, 0)
        ev_lg.append(le)
        xts = []
        for s in seeds:
            lt, xt = grab("train", b, s)
            tr_lg.append((b, s, lt))
            xts.append(xt)
        for stack, mask in (("encoder", src_real), ("decoder", real)):
            e = xe[stack][mask]  # N x C
            ts = [xt[stack][mask] for xt in xts]
            d = stats[stack]
            d.setdefault("norm_eval", []).append(e.norm(dim=-1).mean().item())
            d.setdefault("norm_train", []).append(sum(t.norm(dim=-1).mean().item() for t in ts) / len(ts))
            d.setdefault("std_eval", []).append(e.std(-1, unbiased=False).mean().item())
            d.setdefault("std_train", []).append(sum(t.std(-1, unbiased=False).mean().item() for t in ts) / len(ts))
            d.setdefault("noise_share", []).append(
                sum(((t - e).pow(2).sum() / t.pow(2).sum()).item() for t in ts) / len(ts))
            d.setdefault("cos_train_eval", []).append(
                sum(F.cosine_similarity(t, e, dim=-1).mean().item() for t in ts) / len(ts))
            tbar = torch.stack(ts).mean(0)
            d.setdefault("noise_share_vs_mask_mean", []).append(
                sum(((t - tbar).pow(2).sum() / t.pow(2).sum()).item() for t in ts) / len(ts))
            d.setdefault("cos_mask_mean_eval", []).append(F.cosine_similarity(tbar, e, dim=-1).mean().item())
    for stack in stats:
        res[stack] = {k: sum(v) / len(v) for k, v in stats[stack].items()}
        r = res[stack]
        print(f"[stream] {stack} LN_final input: |x| eval {r['norm_eval']:.3f} train {r['norm_train']:.3f}; "
              f"std eval {r['std_eval']:.4f} train {r['std_train']:.4f}; ||x_t-x_e||^2/||x_t||^2 = "
              f"{r['noise_share']:.3f}; cos(x_t,x_e) {r['cos_train_eval']:.3f}; with E_mask[x_t]: noise share "
              f"{r['noise_share_vs_mask_mean']:.3f}, cos(E x_t, x_e) {r['cos_mask_mean_eval']:.3f}")

    # counterfactuals on the decoder's LN_final: eval stream normalised with the train-mode sigma (per position)
    ln = m.decoder.layer_norm

    def ln_with(x, sigma):
        mu = x.mean(-1, keepdim=True)
        return (x - mu) / sigma * ln.weight + ln.bias

    def logits_from_stream(b, x):  # x: T x B x C (LN input)
        return m.decoder.output_layer(x.transpose(0, 1))

    def cf(kind):
        def fn(b, seed):
            m.eval(); pr.logits(b, 0); xe = caught["decoder"]
            if kind == "eval_ln_train_sigma":
                m.train(); pr.logits(b, seed); xt = caught["decoder"]
                sig = (xt.var(-1, keepdim=True, unbiased=False) + ln.eps).sqrt()
                m.eval()
                return logits_from_stream(b, ln_with(xe, sig))
            if kind == "eval_ln_scaled":  # eval stream, sigma scaled by the mean train/eval sigma ratio
                sig = (xe.var(-1, keepdim=True, unbiased=False) + ln.eps).sqrt() * ratio
                return logits_from_stream(b, ln_with(xe, sig))
            if kind == "mask_mean":  # LN of the train stream averaged over the seeds' masks
                xs = []
                m.train()
                for s in seeds:
                    pr.logits(b, s); xs.append(caught["decoder"])
                m.eval()
                return logits_from_stream(b, ln(torch.stack(xs).mean(0)))
            if kind == "check":  # eval, recomputed through ln: must equal eval
                return logits_from_stream(b, ln(xe))
        return fn

    ratio = res["decoder"]["std_train"] / res["decoder"]["std_eval"]
    cfs = {}
    for kind in ("check", "eval_ln_train_sigma", "eval_ln_scaled", "mask_mean"):
        nll, ent, _ = pr.score_seeds(seeds if kind == "eval_ln_train_sigma" else seeds[:1], cf(kind))
        cfs[kind] = {"nll": nll, "entropy": ent}
        print(f"[stream] decoder counterfactual {kind:22s} nll {nll:.3f} bits entropy {ent:.3f}"
              + (f" (sigma ratio {ratio:.3f})" if kind == "eval_ln_scaled" else ""))
    res["decoder_counterfactuals"] = cfs
    res["sigma_ratio_train_over_eval"] = ratio
    for h in hs:
        h.remove()
    m.eval()
    out["stream"] = res


def part_temperature(pr: Probe, seeds, out):
    m = pr.model
    m.eval()
    ev = [(b, pr.logits(b)) for b in pr.bs]
    m.train()
    tr = [(b, pr.logits(b, s)) for b in pr.bs for s in seeds[:1]]
    m.eval()
    grid = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 40.0, 1e9]

    def curve(pairs):
        rows = []
        for T in grid:
            n = t = e = 0
            for b, lg in pairs:
                a, en, k = nll_entropy(lg / T, b, pr.pad)
                n += a; e += en; t += k
            rows.append((T, n / t / LN2, e / t / LN2))
        return rows

    res = {}
    for name, pairs in (("eval", ev), ("train", tr)):
        rows = curve(pairs)
        best = min(rows, key=lambda r: r[1])
        print(f"[temperature] {name} logits: " + "  ".join(f"T={T:g}:{n:.2f}" for T, n, _ in rows))
        print(f"[temperature] {name}: best T {best[0]:g} nll {best[1]:.3f} bits (entropy {best[2]:.3f})")
        res[name] = {"grid": rows, "best": best}
    # logit statistics
    for name, pairs in (("eval", ev), ("train", tr)):
        lg = torch.cat([l[b["target"].ne(pr.pad)] for b, l in pairs])
        res[name]["logit_std_mean"] = float(lg.std(-1).mean())
        print(f"[temperature] {name}: mean over tokens of std over vocab of logits {res[name]['logit_std_mean']:.3f}")
    out["temperature"] = res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("data")
    ap.add_argument("--batches", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--parts", default="equal,coeffs,sites,stream,temperature")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, cfg, task = load(a.checkpoint, a.data)
    model.eval()
    bs = batches(task, a.batches, a.max_tokens)
    pr = Probe(model, task, bs)
    seeds = list(range(a.seeds))
    out = {"checkpoint": a.checkpoint, "batches": a.batches, "seeds": a.seeds,
           "target_tokens": sum(int(b["target"].ne(pr.pad).sum()) for b in bs), "dropout_p": pr.p}
    m = pr.model
    m.eval(); ev = pr.score()
    m.train(); tr = pr.score_seeds(seeds)
    m.eval()
    print(f"{a.checkpoint}: {out['target_tokens']} target tokens; eval nll {ev[0]:.3f} bits entropy {ev[1]:.3f}; "
          f"train-mode nll {tr[0]:.3f} entropy {tr[1]:.3f} (mean of {len(seeds)} seeds)")
    out["eval"] = {"nll": ev[0], "entropy": ev[1]}
    out["train"] = {"nll": tr[0], "entropy": tr[1], "per_seed": tr[2]}
    parts = a.parts.split(",")
    for p in ("equal", "coeffs"):
        if p in parts:
            globals()["part_" + p](pr, out)
    for p in ("sites", "stream", "temperature"):
        if p in parts:
            globals()["part_" + p](pr, seeds, out)
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()

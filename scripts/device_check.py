#!/usr/bin/env python3
"""Every registered scheme on a device against the CPU: the checks only a GPU can make.

Per scheme (``--schemes``, default: the registry), a ``residual_transformer_tiny`` model with 3+2 layers, its
scheme parameters and LayerNorms randomised (as the conformance suite does; :data:`NOISE`) and, for a scheme with a training
hook (Admin), one training forward on the CPU first:

* ``checkpoint``: its state dict moved to the device, saved there, read back with ``map_location="cpu"`` and
  loaded into a CPU model gives the same weights (``checkpoint_exact``);
* ``cpu_vs_device``: the log-probabilities of a padded batch on the device against the CPU (fp32; TF32 off);
* ``incremental_vs_full``: incremental decoding on the device (two sentences x two beams, reordered within each
  sentence's beams in the middle, as fairseq's ``SequenceGenerator`` reorders), against the full forward on
  the device;
* ``beam_search``: fairseq's ``SequenceGenerator`` (beam 4) on the device: the hypotheses' tokens equal the
  CPU's (``beam_tokens_equal``, a tie may legitimately differ) and their scores equal the teacher-forced scores
  on the device (``beam_vs_forced``);
* ``bf16_vs_fp32`` / ``fp16_vs_fp32``: the model in bf16 / fp16 on the device against fp32 on the device;
* ``train_step``: one forward, backward and Adam step on the device, in fp32 and under bf16 autocast, with
  finite loss and gradients.

``--device cpu`` runs every step with the CPU as the device (a dry run: the numbers are trivially 0, the code
is what runs on CUDA). Writes JSON (``--out``, rewritten after every scheme); prints one line per scheme.
Usage::

    python scripts/device_check.py --device cuda --out device.json
"""
import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import torch

from residual_studies.options import indexed_device

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "fairseq_residual")
sys.path.insert(0, str(REPO))

#: what the summary calls a pass (the CPU measured 1e-6, 0.039 and 0.0051 at this size: tests/test_precision.py)
LIMITS = {"cpu_vs_device": 1e-4, "incremental_vs_full": 1e-4, "beam_vs_forced": 1e-3, "bf16_vs_fp32": 0.08,
          "fp16_vs_fp32": 0.012}


#: std of the noise on LayerNorm and scheme parameters; hyper-connections' unconstrained mixing at 0.3 grows its
#: streams 166-fold over a few layers, and bf16's rounding with it (tests/test_precision.py, FORWARD_NOISE)
NOISE = {"hyper_connections": 0.1}


def build(scheme, d, seed=1):
    """``residual_transformer_tiny`` (3+2 layers) of ``scheme`` with its LayerNorms and scheme parameters
    randomised (noise of std :data:`NOISE`, else 0.3), on the CPU."""
    from fairseq import options
    from fairseq.tasks.translation import TranslationTask

    argv = ["/synthetic-data", "--user-dir", USER_DIR, "--task", "translation", "--arch", "residual_transformer_tiny",
            "--residual-scheme", scheme, "--encoder-layers", "3", "--decoder-layers", "2", "--dropout", "0.1"]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    torch.manual_seed(seed)
    model = TranslationTask(args, d, d).build_model(args)
    with torch.no_grad():  # non-trivial LayerNorms and scheme parameters
        for name, p in model.named_parameters():
            if "norm" in name or "residual" in name:
                p.add_(NOISE.get(scheme, 0.3) * torch.randn_like(p))
    return model


def dictionary():
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def batch(d, bsz=4, src_len=7, tgt_len=6, seed=0):
    """Left-padded sources, right-padded targets (fairseq's translation layout)."""
    g = torch.Generator().manual_seed(seed)
    pad, eos = d.pad(), d.eos()
    src = torch.full((bsz, src_len), pad, dtype=torch.long)
    prev = torch.full((bsz, tgt_len), pad, dtype=torch.long)
    tgt = torch.full((bsz, tgt_len), pad, dtype=torch.long)
    lengths = []
    for b in range(bsz):
        ls, lt = src_len - b % 3, tgt_len - b % 2
        src[b, src_len - ls:] = torch.randint(d.nspecial, len(d), (ls,), generator=g)
        src[b, -1] = eos
        t = torch.randint(d.nspecial, len(d), (lt,), generator=g)
        t[-1] = eos
        tgt[b, :lt] = t
        prev[b, 0] = eos
        prev[b, 1:lt] = t[:-1]
        lengths.append(ls)
    return src, torch.tensor(lengths), prev, tgt


def log_probs(model, src, lengths, prev):
    return model.get_normalized_probs(model(src, lengths, prev), log_probs=True).float()


def check(scheme, device, d):
    out = {}
    cpu = build(scheme, d)
    src, lengths, prev, tgt = batch(d)
    if cpu.training_hook_pending:  # Admin: profile on one training batch, on the CPU
        cpu.train()
        with torch.no_grad():
            cpu(src, lengths, prev)
    cpu.eval()
    dev = copy.deepcopy(cpu).to(device).eval()
    on = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    keep = prev.ne(d.pad())

    # a checkpoint written on the device, read on the CPU
    path = Path(f"/tmp/device_check_{scheme}.pt")
    torch.save(dev.state_dict(), path)
    state = torch.load(path, map_location="cpu")
    path.unlink()
    back = build(scheme, d, seed=2)
    back.load_state_dict(state)
    out["checkpoint_exact"] = all(torch.equal(v, cpu.state_dict()[k]) for k, v in back.state_dict().items())

    with torch.no_grad():
        lp_cpu = log_probs(cpu, src, lengths, prev)
        lp_dev = log_probs(dev, *on(src, lengths, prev)).cpu()
        out["cpu_vs_device"] = float((lp_cpu - lp_dev)[keep].abs().max())

        # incremental decoding against the full forward, with a beam reorder after 3 steps: two sentences x
        # two beams, reordered within each sentence's beams as fairseq's SequenceGenerator does (its
        # cross-attention cache is not reordered when the batch size stays the same)
        beams = torch.tensor([0, 0, 1, 1])
        s, l, p = on(src[beams], lengths[beams], prev)
        lp_beams = log_probs(dev, s, l, p)
        enc = dev.encoder(s, src_lengths=l)
        state, worst = {}, 0.0
        for t in range(3):
            step = dev.get_normalized_probs(dev.decoder(p[:, :t + 1], encoder_out=enc, incremental_state=state),
                                            log_probs=True)[:, -1].float()
            worst = max(worst, float((step - lp_beams[:, t]).abs().max()))
        order = torch.tensor([1, 0, 3, 3], device=device)
        enc = dev.encoder.reorder_encoder_out(enc, order)
        dev.decoder.reorder_incremental_state_scripting(state, order)
        full = log_probs(dev, s[order], l[order], p[order])
        real = p[order].ne(d.pad())  # fairseq leaves the positions of padding unspecified
        for t in range(3, p.size(1)):
            step = dev.get_normalized_probs(dev.decoder(p[order][:, :t + 1], encoder_out=enc, incremental_state=state),
                                            log_probs=True)[:, -1].float()
            if bool(real[:, t].any()):
                worst = max(worst, float((step - full[:, t])[real[:, t]].abs().max()))
        out["incremental_vs_full"] = worst

        s, l, p = on(src, lengths, prev)

        # beam search on the device against the CPU's, and against teacher forcing on the device
        from fairseq.sequence_generator import SequenceGenerator

        hypos = {}
        for name, model, ts in (("cpu", cpu, (src, lengths)), ("dev", dev, on(src, lengths))):
            gen = SequenceGenerator([model], d, beam_size=4, max_len_a=0, max_len_b=6, min_len=2)
            hypos[name] = gen.forward({"net_input": {"src_tokens": ts[0], "src_lengths": ts[1]}})
        out["beam_tokens_equal"] = all(torch.equal(a[0]["tokens"].cpu(), b[0]["tokens"].cpu())
                                       for a, b in zip(hypos["cpu"], hypos["dev"]))
        worst = 0.0
        for i, nbest in enumerate(hypos["dev"]):
            tokens = nbest[0]["tokens"]
            forced_prev = torch.cat([torch.tensor([d.eos()], device=device), tokens[:-1]]).unsqueeze(0)
            forced = log_probs(dev, s[i:i + 1], l[i:i + 1], forced_prev)[0].gather(1, tokens.unsqueeze(1)).squeeze(1)
            worst = max(worst, float((forced - nbest[0]["positional_scores"].float()).abs().max()))
        out["beam_vs_forced"] = worst

        # reduced precision on the device
        for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            low = copy.deepcopy(dev).to(dtype)
            exact = copy.deepcopy(low).float()
            out[f"{name}_vs_fp32"] = float((log_probs(low, s, l, p) - log_probs(exact, s, l, p))[keep.to(device)]
                                           .abs().max())

    # a training step on the device, fp32 and bf16 autocast
    finite = True
    for autocast in (False, True):
        model = copy.deepcopy(dev).train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
            lp = model.get_normalized_probs(model(s, l, p), log_probs=True)
            loss = -lp.gather(-1, tgt.to(device).unsqueeze(-1)).squeeze(-1)[keep.to(device)].sum()
        loss.backward()
        finite &= math.isfinite(float(loss)) and all(torch.isfinite(q.grad).all() for q in model.parameters()
                                                    if q.grad is not None)
        opt.step()
    out["train_step_finite"] = bool(finite)
    out["passed"] = (out["checkpoint_exact"] and out["train_step_finite"]
                     and all(out[k] <= v for k, v in LIMITS.items()))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", type=indexed_device, default="cuda", help="cuda (or cuda:N), or cpu for a dry run")
    p.add_argument("--schemes", help="comma-separated subset of the registry (default: every scheme)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)

    import fairseq_residual  # noqa: F401  (registers the model)
    from fairseq_residual.schemes import SCHEME_NAMES

    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        torch.set_num_threads(1)
    d = dictionary()
    report = {"device": a.device, "limits": LIMITS, "results": {}}
    if a.device.startswith("cuda"):
        report["device_name"] = torch.cuda.get_device_name(torch.device(a.device))
    failed = 0
    for scheme in (a.schemes.split(",") if a.schemes else SCHEME_NAMES):
        started = time.time()
        try:
            r = check(scheme, a.device, d)
        except Exception as e:  # noqa: BLE001  (recorded, the others go on)
            r = {"error": f"{type(e).__name__}: {e}", "passed": False}
        r["seconds"] = round(time.time() - started, 1)
        report["results"][scheme] = r
        failed += not r["passed"]
        Path(a.out).write_text(json.dumps(report, indent=1))
        print(f"{scheme}: " + ("PASS" if r["passed"] else "FAIL") + " " +
              " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items() if k != "passed"),
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""deep24 micro-benchmark / profile: one training step and one beam-search batch, one thread, process CPU time.

Run from the checkout root with PYTHONPATH=<checkout>:
    python <this file> --mode time --what train,gen --rounds 4      # interleaved ratios to pre_ln
    python <this file> --mode profile                               # torch.profiler tables per model
    python <this file> --mode cprofile --what gen                   # Python time (process-time clock)
    python <this file> --mode faults                                # page faults, user / system time
AB=1 (with commit e50d90e's code) times each multi-stream model twice per round, its single-node training
prepare on and off (``use_fused_training``), and prints the paired ratios; OLD=1 turns it off."""
import argparse, cProfile, pstats, io, os, sys, time, statistics, warnings, logging, collections
sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
import torch
torch.set_num_threads(1)
from residual_studies import speed_harness as H
from fairseq.sequence_generator import SequenceGenerator

p = argparse.ArgumentParser()
p.add_argument("--mode", default="time", choices=["time", "profile", "cprofile", "faults"])
p.add_argument("--models", default="pre_ln,hyper_connections,mhc")
p.add_argument("--shape", default="deep24")
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--what", default="train,gen")
p.add_argument("--tag", default="")
a = p.parse_args()

class O: pass
opts = O(); opts.resi_dual_scale = 1.0; opts.user_dir = H.PLUGIN_DIR; opts.seed = 1; opts.optimizer = "torch"
opts.dtype = "fp32"; opts.clock = "cpu"; opts.gen_len = 8
shape = H.SHAPES[a.shape]
d = H.make_dictionary(shape["vocab"])
sample = H.training_batch(d, 512, 32, 1)
gsample = H.generation_batch(d, 4, 32, 1)
dev = torch.device("cpu")
benches = {}
for name in a.models.split(","):
    args, model, crit, optim = H.build(name, shape, d, opts, dev)
    b = H.Bench(name, a.shape, args, model, crit, optim, opts, dev)
    b.generator = SequenceGenerator([model], d, beam_size=5, max_len_a=0, max_len_b=8, min_len=8)
    b.train_step(sample); b.generate(gsample)
    benches[name] = b
what = a.what.split(",")
if os.environ.get("OLD"):
    import fairseq_residual.schemes.hyper_connections as HCm, fairseq_residual.schemes.mhc as MHm
    for m in (HCm, MHm):
        if hasattr(m, "use_fused_training"): m.use_fused_training = lambda: False

def cpu(fn):
    c0 = time.process_time(); fn(); return time.process_time() - c0

if a.mode == "time":
    import fairseq_residual.schemes.hyper_connections as HCm, fairseq_residual.schemes.mhc as MHm
    fused = getattr(HCm, "use_fused_training", None)
    if os.environ.get("AB"):
        for n in list(benches):
            if n != "pre_ln": benches[n + "_old"] = benches[n]
    res = {n: {w: [] for w in what} for n in benches}
    names = list(benches)
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            b = benches[n]
            if fused is not None:  # the single-node training prepare of commit e50d90e, on or off
                f = (lambda: False) if n.endswith("_old") else fused
                HCm.use_fused_training = MHm.use_fused_training = f
            if "train" in what: res[n]["train"].append(cpu(lambda: b.train_step(sample)))
            if "gen" in what: res[n]["gen"].append(cpu(lambda: b.generate(gsample)))
    base = names[0]
    for n in names:
        if n + "_old" in res:
            for w in what:
                pr = sorted(res[n + "_old"][w][i] / res[n][w][i] for i in range(len(res[n][w])))
                print(f"{a.tag} {w} paired old/new time {n}: median {statistics.median(pr):.3f} min {pr[0]:.3f} max {pr[-1]:.3f} all {[round(x, 3) for x in pr]}")
    for w in what:
        for n in names:
            t = res[n][w]
            # per-round ratio base/this (throughput ratio)
            rr = [res[base][w][i] / t[i] for i in range(len(t))]
            print(f"{a.tag} {w:5s} {n:20s} median {statistics.median(t)*1e3:8.1f} ms  ratio {statistics.median(rr):.3f} [{min(rr):.3f}, {max(rr):.3f}]")
elif a.mode == "faults":
    import resource
    for n, b in benches.items():
        for w in what:
            fn = (lambda: b.train_step(sample)) if w == "train" else (lambda: b.generate(gsample))
            for _ in range(2):
                r0 = resource.getrusage(resource.RUSAGE_SELF); fn(); r1 = resource.getrusage(resource.RUSAGE_SELF)
                print(f"{n:18s} {w}: minflt {r1.ru_minflt - r0.ru_minflt:7d} user {r1.ru_utime - r0.ru_utime:.3f} s sys {r1.ru_stime - r0.ru_stime:.3f} s")
elif a.mode == "profile":
    from torch.profiler import profile, ProfilerActivity, record_function
    # attribute the connections' forward work with record_function wrappers
    from fairseq_residual.schemes import hyper_connections as HC
    SC = HC.StreamsConnection
    op, ou = SC.prepare, SC.update
    def prep(self, s, c):
        with record_function("CONN.prepare"): return op(self, s, c)
    def upd(self, s, o, c):
        with record_function("CONN.update"): return ou(self, s, o, c)
    SC.prepare, SC.update = prep, upd
    for n, b in benches.items():
        for w in what:
            fn = (lambda: b.train_step(sample)) if w == "train" else (lambda: b.generate(gsample))
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                fn()
            ev = prof.key_averages()
            tot = sum(e.self_cpu_time_total for e in ev)
            cnt = sum(e.count for e in ev)
            print(f"=== {n} {w}: self CPU total {tot/1e3:.1f} ms, {cnt} events")
            for e in sorted(ev, key=lambda e: -e.self_cpu_time_total)[:45]:
                print(f"  {e.key[:60]:60s} n={e.count:6d} self={e.self_cpu_time_total/1e3:8.2f} ms  tot={e.cpu_time_total/1e3:8.2f}")
else:
    for n, b in benches.items():
        for w in what:
            fn = (lambda: b.train_step(sample)) if w == "train" else (lambda: b.generate(gsample))
            pr = cProfile.Profile(time.process_time); pr.enable(); fn(); pr.disable()
            s = io.StringIO(); st = pstats.Stats(pr, stream=s); st.sort_stats("tottime").print_stats(25)
            print(f"=== {n} {w}"); print(s.getvalue()[:6000])

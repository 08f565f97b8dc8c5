import sys, runpy, torch
sys.argv = ["conn.py", sys.argv[1], sys.argv[2], "1"] + sys.argv[3:]
which = sys.argv[4] if len(sys.argv) > 4 else "hc"
ns = runpy.run_path(__import__("os").path.join(__import__("os").path.dirname(__import__("os").path.abspath(__file__)), "connection_bench.py"))
from torch.profiler import profile, ProfilerActivity
f = ns["fns"][which]; grad = ns["grad"]
with (torch.enable_grad() if grad else torch.no_grad()):
    for _ in range(3): f()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(20): f()
ev = prof.key_averages(group_by_input_shape=True)
tot = sum(e.self_cpu_time_total for e in ev)
print(f"{which}: total self {tot/20/1e3:.3f} ms/rep")
for e in sorted(ev, key=lambda e: -e.self_cpu_time_total)[:40]:
    print(f"  {e.key[:45]:45s} {str(e.input_shapes)[:70]:70s} n={e.count//20:4d} self={e.self_cpu_time_total/20/1e3:7.3f} ms")

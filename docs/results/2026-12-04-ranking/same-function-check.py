"""Do two checkouts compute the same function? Build each scheme (tiny, 3+3 layers, seed 0) in float64, perturb
every weight (std 0.05), save the state dict and the log-probabilities of a fixed batch (mode ``save``, at the first
checkout); load that state dict and compute the same batch (mode ``load``, at the second); compare the two files.

    cd A && PYTHONPATH=$PWD python same-function-check.py $PWD /tmp/old.pt save SCHEMES
    cd B && PYTHONPATH=$PWD python same-function-check.py $PWD /tmp/new.pt load SCHEMES
    python -c "import torch; a, b = torch.load('/tmp/old.pt'), torch.load('/tmp/new.pt'); \
               print({s: float((a[s] - b[s]).abs().max()) for s in a})"

(state dicts go to /tmp/samefn/; run with torch.no_grad() around the forward for the inference path)."""
import sys, torch
sys.path.insert(0, sys.argv[1] + "/tests")
from conftest import build_model, make_dictionary, random_batch
out, mode = sys.argv[2], sys.argv[3]
schemes = sys.argv[4].split(",")
torch.set_num_threads(1)
res = {}
for s in schemes:
    torch.manual_seed(0)
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", s, "--encoder-layers", "3", "--decoder-layers", "3")
    model = model.double().eval()
    if mode == "load":
        sd = torch.load(f"/tmp/samefn/old_{s}.pt")
        model.load_state_dict(sd, strict=True)
    torch.manual_seed(1)
    # non-trivial scheme parameters: perturb every parameter a little (same on both sides via the saved dict)
    d = make_dictionary()
    torch.manual_seed(2)
    src, lengths, prev, _ = random_batch(d)
    lp = model.get_normalized_probs(model(src, lengths, prev), log_probs=True).detach()
    if mode == "save":
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        lp = model.get_normalized_probs(model(src, lengths, prev), log_probs=True).detach()
        torch.save(model.state_dict(), f"/tmp/samefn/old_{s}.pt")
    res[s] = lp
torch.save(res, out)

"""What the gradient ratio of MUDDFormer's final cell reads: the size of the stored layer outputs X_0..X_L.

Usage (from the repository root, on a run folder that still holds the cell's checkpoint; the archive keeps
results, not checkpoints):

    python docs/results/2026-12-05-later-schemes-ranking/muddformer-diagnosis/measure.py \
        ~/fsr-runs/ranking/cells/muddformer-L12-w64-fff78ca1/budgets/u3000/checkpoint.pt ~/fsr-runs/ranking/data/bin

On the valid split, dropout off (eval mode), it prints:

1. valid nll in bits per target token (the report's 5.450 for this cell), and with every target paired with
   another sentence's source (sources rolled by one within each batch): how much the model reads its source;
2. per stack, the RMS over positions (padding included) of each stored output X_j (MUDDFormer, arXiv 2502.12170, eq. 3-6: X_0 the
   embedding output, X_i the output of layer i), mean over batches, and its largest entry in absolute value
   (fp16's largest finite value is 65,504);
3. the encoder's last mix (the encoder output's X^r = sum_j c_j X_j before the final LayerNorm): each term's
   share of sum_j |c_j X_j| per position, mean over positions (padding included), and the valid nll with groups of terms zeroed.
"""
import math
import sys

import torch

import fairseq_residual  # noqa: F401  registers the model and its checkpoint loading
from fairseq import checkpoint_utils

checkpoint, data = sys.argv[1], sys.argv[2]
models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
model = models[0].eval()
task.load_dataset("valid")
batches = list(task.get_batch_iterator(task.dataset("valid"), max_tokens=4096).next_epoch_itr(shuffle=False))
pad = task.target_dictionary.pad()


def valid_nll(roll_sources=False):
    total, tokens = 0.0, 0
    with torch.no_grad():
        for sample in batches:
            net_input = dict(sample["net_input"])
            if roll_sources:
                net_input["src_tokens"] = net_input["src_tokens"].roll(1, 0)
                net_input["src_lengths"] = net_input["src_lengths"].roll(1, 0)
            lprobs = model.get_normalized_probs(model(**net_input), log_probs=True)
            target = sample["target"]
            mask = target.ne(pad)
            total += float(-lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)[mask].sum())
            tokens += int(mask.sum())
    return total / tokens / math.log(2)


def rounded(values, digits=3):
    return [round(float(v), digits) for v in values]


print(f"valid nll: {valid_nll():.3f} bits; with another sentence's source: {valid_nll(True):.3f} bits")

last = {name: getattr(model, name).residual.connections[-1] for name in ("encoder", "decoder")}
forward = {name: c.forward for name, c in last.items()}
coefficients = last["encoder"].coefficients
rms = {name: [] for name in last}
largest = {name: None for name in last}
shares = []


def recording(name):
    def record(outputs):
        rms[name].append(torch.stack([o.pow(2).mean(-1).sqrt().mean() for o in outputs]))
        top = torch.stack([o.abs().max() for o in outputs])
        largest[name] = top if largest[name] is None else torch.maximum(largest[name], top)
        if name == "encoder":
            c = coefficients(outputs[-1])[:, :, 0]  # T x B x (L+1): the one stream after the last layer
            terms = torch.stack([(c[:, :, j:j + 1] * o).norm(dim=-1) for j, o in enumerate(outputs)], -1)
            shares.append((terms / terms.sum(-1, keepdim=True)).reshape(-1, terms.shape[-1]))
        return forward[name](outputs)
    return record


for name, connection in last.items():
    connection.forward = recording(name)
with torch.no_grad():
    for sample in batches:
        model(**sample["net_input"])
for name, connection in last.items():
    connection.forward = forward[name]
    print(f"{name}: RMS of X_0..X_{len(rms[name][0]) - 1}:", rounded(torch.stack(rms[name]).mean(0), 2))
    print(f"{name}: largest |entry| of X_0..X_{len(rms[name][0]) - 1}:", rounded(largest[name], 1))
print("encoder output's mix, share of |c_j X_j|, j = 0..L:", rounded(torch.cat(shares).mean(0)))

zeroed = set()


def without(x):
    c = coefficients(x).clone()
    for j in zeroed:
        c[..., j] = 0
    return c


last["encoder"].coefficients = without
depth = last["encoder"].inputs - 1
for label, terms in (("X_0", [0]), ("X_1..X_6", range(1, 7)), (f"X_7..X_{depth}", range(7, depth + 1)),
                     (f"X_10..X_{depth}", range(10, depth + 1))):
    zeroed.clear()
    zeroed.update(terms)
    print(f"valid nll with {label} zeroed in the encoder output's mix: {valid_nll():.3f} bits")

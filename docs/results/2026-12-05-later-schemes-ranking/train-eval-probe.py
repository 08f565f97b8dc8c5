"""One valid batch through a trained checkpoint in eval mode (dropout off, as fairseq validates) and in train mode
(dropout on, seeded): the label-smoothed criterion's nll in bits per target token, and the mean entropy of the
predicted distributions (bits), each. A large gap says the model computes another function without dropout than
the one it was trained as.

    PYTHONPATH=<checkout> python train-eval-probe.py CHECKPOINT DATA_BIN [MAX_TOKENS]

(the run folder's checkpoint_last.pt and the study's data/bin; MAX_TOKENS 2048 by default, the first batch of the
valid split in fairseq's order). Reads nothing but the checkpoint and the data; trains nothing.
"""
import math
import sys

import torch

import fairseq_residual  # noqa: F401  (registers the model; allow-lists fairseq's checkpoint types)
from fairseq import checkpoint_utils

torch.set_num_threads(1)
path, data = sys.argv[1], sys.argv[2]
max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
model = models[0]
task.load_dataset("valid")
batch = next(task.get_batch_iterator(task.dataset("valid"), max_tokens=max_tokens).next_epoch_itr(shuffle=False))
criterion = task.build_criterion(cfg.criterion)
for mode in ("eval", "train"):
    getattr(model, mode)()
    torch.manual_seed(0)
    with torch.no_grad():
        _, _, log = criterion(model, batch)
        torch.manual_seed(0)  # the same dropout masks for the distributions
        lprobs = model.get_normalized_probs(model(**batch["net_input"]), log_probs=True).float()
    real = batch["target"].ne(task.target_dictionary.pad())
    entropy = -(lprobs.exp() * lprobs).sum(-1)[real].mean() / math.log(2)
    print(f"{mode}: nll {float(log['nll_loss']) / log['ntokens'] / math.log(2):.3f} bits per target token, predicted "
          f"entropy {float(entropy):.3f} bits ({log['ntokens']} tokens)")

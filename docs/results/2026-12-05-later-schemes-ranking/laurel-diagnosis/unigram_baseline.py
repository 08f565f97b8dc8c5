"""Context number: the valid split's target nll (bits / token, EOS included, as fairseq counts) under the
unigram distribution of the training targets (counts from the train split, add-one smoothed).
    PYTHONPATH=<checkout> python unigram_baseline.py DATA_BIN"""
import math, sys
import torch
from fairseq.tasks.translation import TranslationTask
from fairseq import options
data = sys.argv[1]
p = options.get_training_parser(); a = options.parse_args_and_arch(p, [data, "--source-lang", "de", "--target-lang", "en", "--task", "translation", "--arch", "transformer"])
a.max_source_positions = a.max_target_positions = 1024
task = TranslationTask.setup_task(a)
for split in ("train", "valid"):
    task.load_dataset(split)
V = len(task.target_dictionary)
cnt = torch.ones(V)
ds = task.dataset("train").tgt
for i in range(len(ds)):
    cnt += torch.bincount(ds[i], minlength=V).float()
lp = (cnt / cnt.sum()).log2()
tot = n = 0
ds = task.dataset("valid").tgt
for i in range(len(ds)):
    t = ds[i]; tot += -lp[t].sum().item(); n += len(t)
print(f"unigram (train counts, add-one) valid target nll {tot / n:.3f} bits/token over {n} tokens; uniform {math.log2(V):.3f}")

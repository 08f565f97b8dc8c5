"""The whole valid split's nll (bits / target token) of a checkpoint in eval mode and in train mode (dropout on,
seed 0): the eval number should equal fairseq's logged valid_nll_loss.
    PYTHONPATH=<checkout> python full_valid_nll.py CHECKPOINT DATA_BIN"""
import math, sys
import torch
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from laurel_train_eval_diagnosis import load, nll_entropy
torch.set_num_threads(1)
m, cfg, task = load(sys.argv[1], sys.argv[2])
task.load_dataset("valid")
pad = task.target_dictionary.pad()
for mode in ("eval", "train"):
    getattr(m, mode)(); torch.manual_seed(0)
    n = e = t = 0
    for b in task.get_batch_iterator(task.dataset("valid"), max_tokens=2048).next_epoch_itr(shuffle=False):
        with torch.no_grad():
            a, en, k = nll_entropy(m(**b["net_input"])[0], b, pad)
        n += a; e += en; t += k
    print(f"{mode}: valid nll {n / t / math.log(2):.3f} bits, entropy {e / t / math.log(2):.3f} ({t} tokens)")

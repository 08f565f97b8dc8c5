"""fairseq's own Trainer in-process for the tests: built from fairseq-train arguments on a synthetic
translation task, fed fairseq ``LanguagePairDataset`` samples (no data directory)."""
import copy

import torch

from conftest import USER_DIR, make_dictionary

#: fairseq-train arguments every trainer of the tests gets (tiny preset, Adam, label smoothing, clipping)
BASE = ["--task", "translation", "--arch", "residual_transformer_tiny", "--optimizer", "adam", "--lr", "1e-3",
        "--adam-betas", "(0.9, 0.98)", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--clip-norm", "1.0", "--cpu", "--seed", "3", "--max-tokens", "4096", "--no-save", "--num-workers", "0"]


_CONFIGS = {}


def train_config(scheme, *flags):
    """fairseq's config of ``fairseq-train --residual-scheme SCHEME BASE FLAGS`` (a fresh copy; converted once
    per argument list: fairseq's conversion takes half a second). ``--bf16`` keeps ``common.tpu`` off
    (fairseq-train's argparse path turns it on with ``--bf16``, fairseq issue 4696; fairseq-hydra-train does
    not)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = ("/synthetic-data", "--user-dir", USER_DIR, "--residual-scheme", scheme, *BASE, *[str(f) for f in flags])
    if argv not in _CONFIGS:
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), list(argv)))
        cfg.common.tpu = False
        _CONFIGS[argv] = cfg
    return copy.deepcopy(_CONFIGS[argv])


def trainer(scheme, *flags, dictionary=None, seed=3):
    """fairseq's Trainer (model, criterion, optimizer as fairseq-train builds them) and the dictionary."""
    from fairseq.tasks.translation import TranslationTask
    from fairseq.trainer import Trainer

    cfg = train_config(scheme, *flags)
    d = dictionary or make_dictionary()
    task = TranslationTask(cfg.task, d, d)
    torch.manual_seed(seed)
    model = task.build_model(cfg.model)
    return Trainer(cfg, task, model, task.build_criterion(cfg.criterion)), d


def samples(d, n, bsz=4, seed=0):
    """``n`` fairseq translation samples of ``bsz`` sentences (lengths 3-9 plus EOS, left-padded sources)."""
    from fairseq.data import LanguagePairDataset

    g = torch.Generator().manual_seed(seed)
    src, tgt = [], []
    for _ in range(n * bsz):
        for out in (src, tgt):
            tokens = torch.randint(d.nspecial, len(d), (int(torch.randint(3, 10, (1,), generator=g)),), generator=g)
            out.append(torch.cat([tokens, torch.tensor([d.eos()])]))
    ds = LanguagePairDataset(src, [len(t) for t in src], d, tgt, [len(t) for t in tgt], d, shuffle=False)
    return [ds.collater([ds[i] for i in range(b * bsz, (b + 1) * bsz)]) for b in range(n)]


def save_checkpoint(tr, path):
    """Write ``tr``'s checkpoint to ``path`` as fairseq-train does (``checkpoint_utils.save_checkpoint`` first
    consolidates the optimizer state, then ``Trainer.save_checkpoint``)."""
    tr.consolidate_optimizer()
    tr.save_checkpoint(str(path), {})

"""fairseq's own Trainer in-process for the tests: built from fairseq-train arguments on a synthetic
translation task, fed fairseq ``LanguagePairDataset`` samples (no data directory)."""
import copy

import torch

from conftest import USER_DIR, make_dictionary
from residual_studies.fairseq_cfg import copy_with_scheme

#: fairseq-train arguments every trainer of the tests gets (tiny preset, Adam, label smoothing, clipping)
BASE = ["--task", "translation", "--arch", "residual_transformer_tiny", "--optimizer", "adam", "--lr", "1e-3",
        "--adam-betas", "(0.9, 0.98)", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--clip-norm", "1.0", "--cpu", "--seed", "3", "--max-tokens", "4096", "--no-save", "--num-workers", "0"]


#: (flags) -> (the parsed arguments, fairseq's config converted from them)
_CONFIGS = {}




def train_config(scheme, *flags):
    """fairseq's config of ``fairseq-train --residual-scheme SCHEME BASE FLAGS`` (a fresh copy). ``--bf16`` keeps
    ``common.tpu`` off (fairseq-train's argparse path turns it on with ``--bf16``, fairseq issue 4696;
    fairseq-hydra-train does not).

    fairseq's conversion of the parsed arguments to its config takes half a second, the parsing a
    twentieth of that: the conversion runs once per list of FLAGS, and another scheme's config is that
    config with the scheme replaced, used only when its parsed arguments differ from the converted ones in
    ``residual_scheme`` alone (the ``tiny`` preset fills every scheme's options whichever is selected, and
    the config keeps fairseq-train's arguments as they are, :func:`residual_studies.fairseq_cfg.copy_with_scheme`), else it is converted too."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    flags = tuple(str(f) for f in flags)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        "/synthetic-data", "--user-dir", USER_DIR, "--residual-scheme", scheme, *BASE, *flags])
    converted = _CONFIGS.get(flags)
    if converted is not None and vars(args) == {**vars(converted[0]), "residual_scheme": scheme}:
        return copy_with_scheme(converted[1], scheme)
    parsed = copy.deepcopy(args)
    cfg = convert_namespace_to_omegaconf(args)
    cfg.common.tpu = False
    _CONFIGS[flags] = (parsed, cfg)
    return copy_with_scheme(cfg, scheme)


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

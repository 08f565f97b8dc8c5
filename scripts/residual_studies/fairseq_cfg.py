"""fairseq's training config, reused across schemes: converting parsed arguments to fairseq's config costs
0.3-0.5 s, so the tools that build many models of one recipe (the DDP check, the test suite's in-process
trainers) convert once and copy with the scheme replaced."""


def copy_with_scheme(cfg, scheme):
    """A copy of fairseq's config ``cfg`` with the scheme replaced wherever the config keeps the parsed arguments
    as they are (an ``argparse.Namespace``: ``cfg.model``, and ``cfg.optimizer`` for an optimizer without a
    dataclass of its own). ``copy.deepcopy`` of the config shares those objects (and a model build writes
    into ``cfg.model``): each is copied here."""
    import argparse
    import copy

    from fairseq.dataclass.utils import omegaconf_no_object_check

    cfg = copy.deepcopy(cfg)
    for group in list(cfg):
        value = cfg[group]
        if isinstance(value, argparse.Namespace):
            fresh = argparse.Namespace(**copy.deepcopy(vars(value)))
            if hasattr(fresh, "residual_scheme"):
                fresh.residual_scheme = scheme
            with omegaconf_no_object_check():
                cfg[group] = fresh
    return cfg

"""Checkpoints move between devices, for every registered scheme (read from the registry).

* A checkpoint written by fairseq's Trainer on the CPU (after a training step: Admin's profile and flags set)
  and read with ``map_location`` (fairseq's own ``load_checkpoint_to_cpu``, and ``torch.load``; a state dict
  read onto ``meta`` itself cannot be loaded: the scheme check reads the scheme id's value) loads into a model
  moved to another device (``meta``): afterwards every tensor the
  model holds is there, parameters, buffers (the scheme ids, Admin's ``profile`` / ``profiled``) and any plain
  tensor attribute found by walking the modules (a tensor attribute ``.to()`` does not move is a defect;
  fairseq's own caches, ``_future_mask`` and the sinusoidal positions' ``weights``, follow their input at the
  next forward, which is run); and on the CPU it loads to the very values saved.
* Resuming through fairseq's checkpoint loading (``Trainer.load_checkpoint``, which reads to the CPU with
  ``map_location`` and copies into the model wherever it is) continues exactly the run it interrupted: the
  scheme's state (Admin's profile: never re-profiled), optimizer and dropout seeds included.
"""
import pytest
import torch

from fairseq_residual.schemes import SCHEME_NAMES
from placement import MetaOracle
from trainers import samples, save_checkpoint, trainer


FLAGS = ("--dropout", "0.1")


def every_tensor(model):
    """``(name, tensor)`` of every parameter, buffer and plain tensor attribute (also inside a list, tuple
    or dict attribute) of every module of ``model``."""
    for name, t in model.named_parameters():
        yield name, t
    for name, t in model.named_buffers():
        yield name, t
    for prefix, module in model.named_modules():
        for key, value in vars(module).items():
            if key in ("_parameters", "_buffers", "_modules"):
                continue
            values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
            for v in values:
                if torch.is_tensor(v):
                    yield f"{prefix}.{key}" if prefix else key, v


def _trained_checkpoint(scheme, tmp_path):
    tr, d = trainer(scheme, *FLAGS)
    batch = samples(d, 1)[0]
    tr.train_step([batch])
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(tr, path)
    return tr, d, batch, path


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_a_cpu_checkpoint_loads_onto_another_device(scheme, tmp_path):
    from fairseq import checkpoint_utils

    tr, d, batch, path = _trained_checkpoint(scheme, tmp_path)
    saved = tr.get_model().state_dict()
    reads = {"fairseq's load_checkpoint_to_cpu": checkpoint_utils.load_checkpoint_to_cpu(str(path)),
             "torch.load, map_location cpu": torch.load(path, map_location="cpu", weights_only=False)}
    for how, state in reads.items():
        fresh, _ = trainer(scheme, *FLAGS, dictionary=d, seed=7)
        model = fresh.get_model()
        model.load_state_dict(state["model"], strict=True, model_cfg=fresh.cfg.model)  # on the CPU
        for name, value in model.state_dict().items():
            assert torch.equal(value, saved[name]), f"{how}: {name}"
        model = fresh.get_model().to("meta")
        model.load_state_dict(state["model"], strict=True, model_cfg=fresh.cfg.model)
        stray = [n for n, t in every_tensor(model) if not t.is_meta and t.dim() > 0 and n not in
                 ("decoder._future_mask",)]
        assert stray == [], f"{how}: not moved to the model's device: {stray}"
        net_input = {k: v.to("meta") for k, v in batch["net_input"].items()}
        model.eval()
        with MetaOracle(), torch.no_grad():
            assert model(**net_input)[0].is_meta
        stray = [n for n, t in every_tensor(model) if not t.is_meta and t.dim() > 0]
        assert stray == [], f"{how}: left on the CPU after a forward on meta: {stray}"


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_resume_through_fairseqs_checkpoint_loading_continues_the_run(scheme, tmp_path):
    whole, d = trainer(scheme, *FLAGS)
    batches = samples(d, 3)
    for b in batches:
        whole.train_step([b])

    first, _ = trainer(scheme, *FLAGS, dictionary=d)
    for b in batches[:2]:
        first.train_step([b])
    path = tmp_path / "checkpoint_last.pt"
    save_checkpoint(first, path)
    resumed, _ = trainer(scheme, *FLAGS, dictionary=d, seed=11)  # other initial weights: all must come from the file
    resumed.load_checkpoint(str(path))
    assert resumed.get_num_updates() == 2
    resumed.train_step([batches[2]])
    expected = whole.get_model().state_dict()
    for name, value in resumed.get_model().state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_the_walk_finds_a_tensor_attribute_that_to_does_not_move():
    """Negative control: a plain tensor attribute of a residual (not a buffer) stays on the CPU under ``.to()``
    and the walk names it."""
    tr, _ = trainer("resi_dual", *FLAGS)
    model = tr.get_model()
    model.decoder.residual.cache = [torch.zeros(3)]
    model.to("meta")
    assert [n for n, t in every_tensor(model) if not t.is_meta and t.dim() > 0] == ["decoder._future_mask",
                                                                                 "decoder.residual.cache"]

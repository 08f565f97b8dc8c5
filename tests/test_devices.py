"""Device placement without a GPU, for every registered scheme (read from the registry).

Two checks (``tests/placement.py``), each shown to catch a deliberately stray tensor:

* a training step through fairseq's Trainer (the first one runs Admin's profiling), a full forward in eval
  mode and beam search with fairseq's ``SequenceGenerator`` (incremental decoding, reordering) run under
  :class:`~placement.StrayTensorGuard`: no tensor factory of the plugin's code runs without a device, and
  nothing of it moves to the CPU;
* the whole model on the ``meta`` device (every parameter, buffer and input): a training forward and backward,
  an eval forward and incremental decoding with a beam reorder, under :class:`~placement.MetaOracle`, where a
  CPU tensor with dimensions fails as it does on CUDA.
"""
import copy

import pytest
import torch

from conftest import make_dictionary, random_batch
from fairseq_residual.schemes import SCHEME_NAMES
from placement import MetaOracle, StrayTensorGuard
from trainers import samples, trainer



def _run_everything(scheme, guard):
    """Two training steps, an eval forward and beam search of a tiny ``scheme`` model, under ``guard``."""
    from fairseq.sequence_generator import SequenceGenerator

    tr, d = trainer(scheme, "--dropout", "0.1")
    batches = samples(d, 2)
    with guard:
        for b in batches:
            tr.train_step([b])
    model = tr.get_model()
    model.eval()
    net_input = batches[0]["net_input"]
    gen = SequenceGenerator([model], d, beam_size=3, max_len_a=0, max_len_b=6)
    with guard, torch.no_grad():
        model(**net_input)
        gen.forward({"net_input": {k: net_input[k] for k in ("src_tokens", "src_lengths")}})
    return guard.violations


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_training_forward_and_beam_search_create_no_stray_tensor(scheme):
    assert _run_everything(scheme, StrayTensorGuard()) == []


def test_the_guard_catches_a_tensor_created_without_a_device(monkeypatch):
    """Negative control: a residual update that adds a tensor made without ``device=`` (in this file, so the
    guard watches this file's frames)."""
    import os

    from fairseq_residual.residual import SublayerResidual, with_main

    def stray_update(self, state, out, ctx):
        return with_main(state, state[0] + out + torch.zeros(out.shape))

    monkeypatch.setattr(SublayerResidual, "update", stray_update)
    violations = _run_everything("dlcl", StrayTensorGuard(os.path.dirname(__file__) + os.sep))
    assert violations and all("test_devices.py" in v and "zeros(...) without a device" in v for v in violations)


def _meta_model(scheme):
    """A tiny model of ``scheme`` after one training forward on the CPU (Admin profiles there: its profile is
    data, which the meta device has none of), moved to ``meta``."""
    from conftest import build_model

    d = make_dictionary()
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", scheme, "--dropout", "0.1",
                              dictionary=d)
    src, lengths, prev, tgt = random_batch(d, pad_rows=False)
    model.train()
    with torch.no_grad():
        model(src, lengths, prev)  # the scheme's training hook, if it has one
    assert not model.training_hook_pending
    meta = copy.deepcopy(model).to("meta")
    return meta, [t.to("meta") for t in (src, lengths, prev, tgt)]


def _meta_run(model, src, lengths, prev, tgt):
    with MetaOracle():
        model.train()
        out = model(src, lengths, prev)
        lp = model.get_normalized_probs(out, log_probs=True)
        assert lp.is_meta
        (-lp.gather(-1, tgt.unsqueeze(-1)).sum()).backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(g.is_meta for g in grads)
        model.eval()
        assert model(src, lengths, prev)[0].is_meta
        enc = model.encoder(src, src_lengths=lengths)
        state = {}
        for t in range(3):
            model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
        order = torch.tensor([1, 1, 0, 3], device="meta")
        enc = model.encoder.reorder_encoder_out(enc, order)
        model.decoder.reorder_incremental_state_scripting(state, order)
        step = model.decoder(prev[order][:, :4], encoder_out=enc, incremental_state=state)
        assert step[0].is_meta and step[0].shape[1] == 1


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_the_whole_model_runs_on_the_meta_device(scheme):
    model, inputs = _meta_model(scheme)
    _meta_run(model, *inputs)


def test_the_meta_check_catches_a_stray_cpu_tensor(monkeypatch):
    """Negative controls: a residual update adding a CPU tensor, and a stack holding a plain tensor attribute
    (not a buffer: ``.to()`` leaves it on the CPU) that its forward uses."""
    from fairseq_residual.residual import SublayerResidual, with_main

    model, inputs = _meta_model("dlcl")
    monkeypatch.setattr(SublayerResidual, "update",
                        lambda self, state, out, ctx: with_main(state, state[0] + out + torch.zeros(out.shape[-1])))
    with pytest.raises(RuntimeError, match="on device cpu is not on the expected device meta"):
        _meta_run(model, *inputs)
    monkeypatch.undo()

    model, inputs = _meta_model("resi_dual")
    model.encoder.residual.shift = torch.zeros(model.encoder.embed_tokens.embedding_dim)  # a plain attribute
    monkeypatch.setattr(type(model.encoder.residual), "start", lambda self, x: [x + self.shift, x])
    with pytest.raises(RuntimeError, match="on device cpu is not on the expected device meta"):
        _meta_run(model, *inputs)

"""The multi-stream schemes' inference path (hyper-connections, mHC): without gradients, their connections run a
leaner computation (``prepare_inference``: static parts cached, fewer operators, Sinkhorn-Knopp in place through
TorchScript) and the decoder computes the stream-sum view only when asked. The same function as the frozen
computation in float64, a cache that follows every change of the parameters, and ``inner_states`` as documented."""
import copy

import pytest
import torch

from conftest import random_batch
from frozen_streams import freeze
from test_streams import IDENTITY_CASES, streams_model


def _model(scheme, streams=4, static=False, seed=1):
    model, d = streams_model(scheme, streams, static, seed)
    return model.eval(), d


@pytest.mark.parametrize("scheme, streams, static", IDENTITY_CASES)
def test_inference_path_computes_the_frozen_function(scheme, streams, static):
    """Evaluation without gradients (the inference path) against the frozen computation, float64, whole model:
    log-probabilities within 1e-12."""
    model, d = _model(scheme, streams, static)
    frozen = copy.deepcopy(model)
    assert freeze(frozen) > 0
    src, lengths, prev, _ = random_batch(d, bsz=5)
    keep = prev.ne(d.pad())
    with torch.no_grad():
        new, old = (torch.log_softmax(m(src, lengths, prev)[0], dim=-1) for m in (model, frozen))
    assert (new - old)[keep].abs().max().item() <= 1e-12


@pytest.mark.parametrize("scheme", ["hyper_connections", "mhc"])
def test_inference_cache_follows_parameter_changes(scheme):
    """The cached static parts are rebuilt after an in-place update (an optimizer step), ``load_state_dict`` and a
    dtype change: each result equals the one computed with gradients (no cache)."""
    model, d = _model(scheme)
    src, lengths, prev, _ = random_batch(d, bsz=3)

    def both():
        with torch.no_grad():
            cached = model(src, lengths, prev)[0]
        return cached, model(src, lengths, prev)[0].detach()

    cached, fresh = both()
    assert (cached - fresh).abs().max().item() <= 1e-12
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "residual" in name:
                p.add_(0.05 * torch.randn_like(p))
    cached2, fresh2 = both()
    assert (cached2 - fresh2).abs().max().item() <= 1e-12 and (cached2 - cached).abs().max().item() > 1e-6
    other, _ = _model(scheme, seed=2)
    model.load_state_dict(other.state_dict())
    cached3, fresh3 = both()
    assert (cached3 - fresh3).abs().max().item() <= 1e-12 and (cached3 - cached2).abs().max().item() > 1e-6
    model.float()
    cached4, fresh4 = both()
    assert cached4.dtype == torch.float32 and (cached4 - fresh4).abs().max().item() <= 1e-4


@pytest.mark.parametrize("scheme", ["hyper_connections", "mhc"])
def test_decoder_view_only_when_asked_at_incremental_steps(scheme):
    """``inner_states``: the stream sum after every layer in a full forward; at an incremental decoding step None
    for the layers unless ``return_all_hiddens`` asks, then the same views."""
    model, d = _model(scheme)
    src, lengths, prev, _ = random_batch(d, bsz=3)
    layers = len(model.decoder.layers)
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        full = model.decoder(prev, encoder_out=enc)[1]["inner_states"]
        assert len(full) == layers + 1 and all(s is not None for s in full)
        step = model.decoder(prev[:, :1], encoder_out=enc, incremental_state={})[1]["inner_states"]
        assert step[0] is not None and step[1:] == [None] * layers
        asked = model.decoder(prev[:, :1], encoder_out=enc, incremental_state={},
                              return_all_hiddens=True)[1]["inner_states"]
        for a, f in zip(asked, full):
            assert (a[0] - f[0]).abs().max().item() <= 1e-12

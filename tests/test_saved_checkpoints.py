"""State dicts saved by an earlier version of the plugin load into today's code and compute the same.

``tests/data/saved_checkpoints.pt.gz`` holds, per registered scheme of the commit that wrote it (its ``commit``
entry; written by ``tests/data/make_saved_checkpoints.py``), a tiny model's state dict (3 + 2 layers, width 8,
every LayerNorm and scheme parameter randomised), the log-probabilities it computed on a fixed batch and the
hypotheses and scores of a beam search. Today's model of that scheme must have exactly the saved keys and shapes,
load the state dict strictly through the model's own ``load_state_dict`` (the scheme check and the scheme's
renames), compute the same log-probabilities and find the same hypotheses with the same scores.
"""
import gzip
import io
import sys
from pathlib import Path

import pytest
import torch

from conftest import make_dictionary
from fairseq_residual.schemes import SCHEME_NAMES

DATA = Path(__file__).resolve().parent / "data"
SAVED = DATA / "saved_checkpoints.pt.gz"
sys.path.insert(0, str(DATA))  # make_saved_checkpoints: the shape, the batch and the beam search it used


def _saved():
    with gzip.open(SAVED, "rb") as f:
        return torch.load(io.BytesIO(f.read()), weights_only=False)


SCHEMES = sorted(_saved()["schemes"], key=SCHEME_NAMES.index)


def test_the_saved_schemes_are_registered():
    assert set(SCHEMES) <= set(SCHEME_NAMES) and len(SCHEMES) >= 16


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_saved_state_dict_loads_and_translates_identically(scheme):
    from conftest import build_model
    from make_saved_checkpoints import outputs, scheme_flags

    saved = _saved()["schemes"][scheme]
    d = make_dictionary(12)
    model, _, _ = build_model("residual_transformer_tiny", *scheme_flags(scheme), dictionary=d)
    layout = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert layout == {k: tuple(v.shape) for k, v in saved["model"].items()}
    model.load_state_dict({k: v.clone() for k, v in saved["model"].items()}, strict=True)
    lp, hyps = outputs(model, d)
    # fp32 rounding, not a change of function: the same arithmetic may be grouped differently (the multi-stream
    # connections' leaner path without gradients, another CPU's SIMD kernels); 1e-5 is about 20 ulp at the
    # log-probabilities' magnitude (2-8, ulp 2.4e-7 to 4.8e-7), the conformance suite's tolerance
    assert (lp - saved["log_probs"]).abs().max().item() <= 1e-5
    assert [[tokens for tokens, _ in sent] for sent in hyps] == \
        [[tokens for tokens, _ in sent] for sent in saved["hypotheses"]]
    assert max(abs(a[1] - b[1]) for s, t in zip(hyps, saved["hypotheses"]) for a, b in zip(s, t)) <= 1e-5

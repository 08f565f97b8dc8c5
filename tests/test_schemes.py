"""DeepNorm, B2T and T-Fixup initialise as their reference code does (their forward passes are checked
against transcriptions of the references in tests/test_conformance.py), and T-Fixup's schedule and warning.

Initialisation: built with the same seed as ``post_ln`` (fairseq's own layers draw the same random
numbers), each scaled parameter equals the Post-LN one times the reference's factor, element by
element, and every other parameter is untouched.

References: microsoft/torchscale torchscale/architecture/{encoder,decoder}.py (DeepNorm);
takase/b2t_connection fairseq/modules/transformer_layer.py (B2T); layer6ai-labs/T-Fixup
fairseq/modules/transformer_layer.py, fairseq/models/transformer.py and
fairseq/optim/lr_scheduler/inverse_sqrt_nowarmup_schedule.py (T-Fixup).
"""
import math

import pytest
import torch

from conftest import build_model, make_dictionary


N_ENC, N_DEC = 3, 2
DEPTH = ["--encoder-layers", N_ENC, "--decoder-layers", N_DEC]


def deepnorm_alphas():
    return 0.81 * (N_ENC ** 4 * N_DEC) ** (1 / 16), (3 * N_DEC) ** (1 / 4)


def test_deepnorm_constants_are_per_stack():
    """Swapping N and M changes DeepNorm's encoder alpha: an N/M mix-up cannot pass unnoticed."""
    from fairseq_residual.schemes.deepnorm import deepnorm_constants

    c = deepnorm_constants(N_ENC, N_DEC)
    assert c["encoder_alpha"] == pytest.approx(deepnorm_alphas()[0])
    assert c["decoder_alpha"] == pytest.approx(deepnorm_alphas()[1])
    assert c["encoder_beta"] == pytest.approx(1.15 * (N_ENC ** 4 * N_DEC) ** (-1 / 16))
    assert c["decoder_beta"] == pytest.approx((12 * N_DEC) ** (-1 / 4))
    assert deepnorm_constants(N_DEC, N_ENC)["encoder_alpha"] != pytest.approx(c["encoder_alpha"])
    # the table of common depths (6+6, 12+12, 18+18) in the torchscale / DeepNet papers
    six = deepnorm_constants(6, 6)
    assert (round(six["encoder_alpha"], 3), round(six["decoder_alpha"], 3)) == (1.418, 2.060)
    assert (round(six["encoder_beta"], 3), round(six["decoder_beta"], 3)) == (0.657, 0.343)


# ---------------------------------------------------------------------------------------------
# Initialisation against the same model built with post_ln and the same seed
# ---------------------------------------------------------------------------------------------


def build_seeded(scheme, *flags, seed=7):
    torch.manual_seed(seed)
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", scheme, *DEPTH, *flags,
                              dictionary=make_dictionary())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def expected_factor(scheme, name):
    """The reference's multiplier of parameter ``name`` relative to fairseq's default init (None: the
    parameter is re-drawn, not scaled)."""
    stack = name.split(".")[0]
    depth = N_ENC if stack == "encoder" else N_DEC
    in_layer = ".layers." in name
    if scheme == "deepnorm":
        from fairseq_residual.schemes.deepnorm import deepnorm_constants

        beta = deepnorm_constants(N_ENC, N_DEC)[f"{stack}_beta"]
        keys = (".fc1.", ".fc2.", ".v_proj.", ".out_proj.")
        return beta if in_layer and any(k in name for k in keys) else 1.0
    if scheme == "b2t":
        return depth ** -0.5 if in_layer and "weight" in name and "layer_norm" not in name else 1.0
    if scheme == "t_fixup":
        if in_layer and (".fc1." in name or ".fc2." in name):
            return None  # re-drawn xavier_uniform (weights) / zero (biases): checked separately
        scale = 0.67 * N_ENC ** -0.25 if stack == "encoder" else (9 * N_DEC) ** -0.25
        if in_layer and name.endswith("out_proj.weight"):
            return scale
        if in_layer and name.endswith("v_proj.weight"):
            return scale * math.sqrt(2)
        if name.endswith("embed_tokens.weight"):
            return (9 * depth) ** -0.25
        return 1.0
    raise AssertionError(scheme)


@pytest.mark.parametrize("scheme", ["deepnorm", "b2t", "t_fixup"])
def test_initialisation_scales_post_ln_init(scheme):
    base = build_seeded("post_ln")
    ours = build_seeded(scheme)
    if scheme == "t_fixup":  # no LayerNorm parameters at all
        assert not any("layer_norm" in k for k in ours)
        base = {k: v for k, v in base.items() if "layer_norm" not in k}
    assert set(ours) - {"encoder.residual_scheme_id", "decoder.residual_scheme_id"} == \
        set(base) - {"encoder.residual_scheme_id", "decoder.residual_scheme_id"}
    n_scaled = 0
    for name, value in ours.items():
        if name.endswith("residual_scheme_id") or name.endswith("_float_tensor"):
            continue
        factor = expected_factor(scheme, name)
        if factor is None:
            continue
        torch.testing.assert_close(value, base[name] * factor, rtol=1e-6, atol=1e-7, msg=name)
        n_scaled += factor != 1.0
    # every parameter the reference scales was seen: weights and biases of fc1, fc2, v_proj, out_proj
    # (DeepNorm: 8 per encoder layer, 12 per decoder layer); every layer weight (B2T: 6 / 10); out_proj and
    # v_proj weights and the two token tables (T-Fixup: 2 / 4, + 2)
    expected = dict(deepnorm=8 * N_ENC + 12 * N_DEC, b2t=6 * N_ENC + 10 * N_DEC, t_fixup=2 * N_ENC + 4 * N_DEC + 2)
    assert n_scaled == expected[scheme]


def test_t_fixup_redraws_ffn_as_xavier_with_zero_bias():
    ours = build_seeded("t_fixup")
    for stack, scale in (("encoder", 0.67 * N_ENC ** -0.25), ("decoder", (9 * N_DEC) ** -0.25)):
        depth = N_ENC if stack == "encoder" else N_DEC
        for i in range(depth):
            for fc in ("fc1", "fc2"):
                w = ours[f"{stack}.layers.{i}.{fc}.weight"]
                fan_out, fan_in = w.shape
                bound = scale * math.sqrt(6.0 / (fan_in + fan_out))  # xavier_uniform, times the scale
                assert w.abs().max().item() <= bound * (1 + 1e-6)
                assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.06)
                assert ours[f"{stack}.layers.{i}.{fc}.bias"].abs().max().item() == 0.0


def test_t_fixup_shared_embeddings_are_scaled_once_by_the_encoder_factor():
    base = build_seeded("post_ln", "--share-all-embeddings")
    ours = build_seeded("t_fixup", "--share-all-embeddings")
    table = "encoder.embed_tokens.weight"
    torch.testing.assert_close(ours[table], base[table] * (9 * N_ENC) ** -0.25)
    torch.testing.assert_close(ours["decoder.embed_tokens.weight"], ours[table])


# ---------------------------------------------------------------------------------------------
# T-Fixup's warning and schedule
# ---------------------------------------------------------------------------------------------


def test_inverse_sqrt_nowarmup_follows_the_reference_formula():
    from fairseq_residual.lr_scheduler import InverseSqrtNoWarmupConfig, InverseSqrtNoWarmupSchedule

    from fairseq.optim import FairseqOptimizer

    class Opt(FairseqOptimizer):  # the scheduler only needs set_lr / get_lr
        def __init__(self):
            self._lr = None

        def set_lr(self, lr):
            self._lr = lr

        def get_lr(self):
            return self._lr

    cfg = InverseSqrtNoWarmupConfig(decay_period=4000, lr=[5e-4])
    opt = Opt()
    sched = InverseSqrtNoWarmupSchedule(cfg, opt)
    assert opt.get_lr() == pytest.approx(5e-4)  # no warm-up: full lr at update 0
    for t in (1, 4000, 12000, 100000):
        assert sched.step_update(t) == pytest.approx(5e-4 * math.sqrt(4000 / (4000 + t)))
    assert sched.step_update(4000) == pytest.approx(5e-4 / math.sqrt(2))
    with pytest.raises(ValueError, match="takes one --lr value"):
        InverseSqrtNoWarmupSchedule(InverseSqrtNoWarmupConfig(decay_period=4000, lr=[1e-3, 5e-4]), Opt())


def test_the_shell_tools_read_the_registry_without_loading_torch():
    """train.sh checks --scheme against the names that scripts/residual_studies/shell.py reads from
    schemes/registry_order.py by its path (no torch, no fairseq): the registry's names, in its order."""
    from residual_studies import shell
    from fairseq_residual.schemes import SCHEME_NAMES

    assert shell.scheme_names().split() == list(SCHEME_NAMES)

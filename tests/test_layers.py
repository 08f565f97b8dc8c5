"""The protocol's layers (fairseq_residual/layers.py): fairseq's NormFormer and cross-self-attention options
are refused by name for every scheme that runs them, and the decoder returns the alignment layer's
cross-attention averaged over heads, as fairseq's ``TransformerDecoder`` does."""
import pytest
import torch

from conftest import build_model, make_dictionary, random_batch
from fairseq_residual.layers import refuse_decoder_extras
from fairseq_residual.schemes import SCHEMES, get_scheme


#: fairseq's decoder options that change the sub-layers (NormFormer: Shleifer et al. 2021)
DECODER_EXTRAS = ["scale_attn", "scale_heads", "scale_fc", "scale_resids", "cross_self_attention"]
#: the schemes whose decoder layers are the protocol's (fairseq's own layers implement the extras)
REFUSING = [s.name for s in SCHEMES if not s.fairseq_path]


class Cfg:
    def __init__(self, **on):
        for key in DECODER_EXTRAS:
            setattr(self, key, on.get(key, False))


@pytest.mark.parametrize("key", DECODER_EXTRAS)
def test_refuse_decoder_extras_names_the_flag_and_the_fix(key):
    flag = "--" + key.replace("_", "-")
    with pytest.raises(ValueError, match=rf"^{flag} is not supported with --residual-scheme resi_dual; "
                                         rf"drop {flag} or use --residual-scheme post_ln / pre_ln$"):
        refuse_decoder_extras(Cfg(**{key: True}), "resi_dual")


def test_refuse_decoder_extras_accepts_the_plain_decoder():
    refuse_decoder_extras(Cfg(), "resi_dual")  # nothing on: no error
    refuse_decoder_extras(object(), "resi_dual")  # a config without the keys: no error


def decoder_cfg(scheme):
    """The TransformerConfig a model of ``scheme`` is built from (fairseq-train flags)."""
    from fairseq_residual.model import _transformer_config

    _, args, _ = build_model("residual_transformer_tiny", "--residual-scheme", scheme)
    return _transformer_config(args)


@pytest.mark.parametrize("scheme", REFUSING)
@pytest.mark.parametrize("key", ["scale_attn", "scale_heads", "scale_fc", "scale_resids"])
def test_normformer_options_are_refused_when_the_decoder_layer_is_built(scheme, key):
    """fairseq reads NormFormer's options from the config (no fairseq-train flag: Hydra configs and
    models that declare them); the scheme's decoder layer refuses them instead of ignoring them."""
    from fairseq_residual.residual import Site

    cfg = decoder_cfg(scheme)
    s = get_scheme(scheme)
    residuals = {kind: s.sublayer_residual(cfg, Site("decoder", kind, 0, 2, j, 3, 64, 2, 2))
                 for j, kind in enumerate(("self_attn", "encoder_attn", "ffn"))}
    s.decoder_layer(cfg, residuals, no_encoder_attn=False)  # the plain config builds
    setattr(cfg, key, True)
    flag = "--" + key.replace("_", "-")
    with pytest.raises(ValueError, match=f"{flag} is not supported with --residual-scheme {scheme}"):
        s.decoder_layer(cfg, residuals, no_encoder_attn=False)


@pytest.mark.parametrize("alignment_heads", [None, 1])
def test_resi_dual_returns_cross_attention_averaged_over_heads(alignment_heads):
    d = make_dictionary()
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "resi_dual",
                              "--decoder-attention-heads", 4, "--encoder-attention-heads", 4, dictionary=d)
    src, lengths, prev, _ = random_batch(d, bsz=3)
    per_head = []
    last = model.decoder.layers[-1].encoder_attn

    def keep_heads(module, inputs, output):
        per_head.append(output[1])

    handle = last.register_forward_hook(keep_heads)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        _, extra = model.decoder(prev, encoder_out=encoder_out, alignment_heads=alignment_heads)
    handle.remove()
    attn = extra["attn"][0]
    heads = per_head[0]  # heads x B x T x S (need_head_weights at the alignment layer)
    assert heads.shape[:2] == (4, 3)
    assert attn.shape == heads.shape[1:] == (prev.size(0), prev.size(1), src.size(1))
    expected = heads[:alignment_heads].mean(dim=0) if alignment_heads else heads.mean(dim=0)
    torch.testing.assert_close(attn, expected.float())
    torch.testing.assert_close(attn.sum(-1), torch.ones_like(attn.sum(-1)))  # still distributions
    assert not torch.allclose(heads[0], heads[1])  # the heads differ: averaging is not a no-op


def test_retain_dropout_names_follow_the_layer_classes():
    """``--retain-dropout-modules`` accepts the class name of every layer class of the plugin (a scheme's own,
    as HybridNorm's), read from the classes: a new scheme's layer class is accepted without a list to edit."""
    from fairseq_residual.layers import ResidualDecoderLayer, ResidualEncoderLayer
    from fairseq_residual.model import RETAIN_DROPOUT_NAMES, retain_dropout_names
    from fairseq_residual.schemes.hybrid_norm import HybridNormDecoderLayer, HybridNormEncoderLayer

    assert RETAIN_DROPOUT_NAMES["HybridNormEncoderLayer"] == RETAIN_DROPOUT_NAMES["TransformerEncoderLayer"]
    assert {HybridNormEncoderLayer.__name__, HybridNormDecoderLayer.__name__} <= set(RETAIN_DROPOUT_NAMES)
    module = "fairseq_residual.schemes.a_new_scheme"
    enc = type("NewSchemeEncoderLayer", (ResidualEncoderLayer,), {"__module__": module})
    dec = type("NewSchemeDecoderLayer", (ResidualDecoderLayer,), {"__module__": module})
    names = retain_dropout_names()
    assert names[enc.__name__] == "TransformerEncoderLayerBase" and names[dec.__name__] == "TransformerDecoderLayerBase"
    assert "NewSchemeEncoderLayer" not in RETAIN_DROPOUT_NAMES  # the constant: the classes defined at import

"""The Hydra configs in configs/: they load through fairseq-hydra-train, carry the paper's
hyperparameters (the authors' hydra_config/*.yaml in github.com/microsoft/ResiDual), and build the model the plugin's presets describe.

Every config is composed with Hydra the way fairseq-hydra-train composes it (fairseq's schema under
the config's name, then the YAML and the overrides), its '???' filled with tiny values, and its model
built by fairseq (tasks.setup_task + task.build_model on tiny binarized data made here; for OPUS-100
a 2-pair multilingual data-bin for translation_multi_simple_epoch). The parameter count must equal
the same model built through fairseq-train's argparse path and a closed-form count of the dims (a
preset silently building fairseq's base dims under Hydra is a known failure of such plugins).
"""
import os
import sys

import pytest
import torch
from omegaconf import OmegaConf

from bench_helpers import CONFIGS, multilingual_data_bin
from conftest import USER_DIR, run_cli

NAMES = ("iwslt14_de_en", "wmt14_en_de", "opus100")

#: the authors' hydra_config/{iwslt,wmt,opus}.yaml (github.com/microsoft/ResiDual), as fairseq config keys
PAPER = {
    "iwslt14_de_en": {
        "model._name": "residual_transformer_iwslt_de_en", "model.encoder_layers": 6,
        "model.decoder_layers": 6, "model.dropout": 0.3, "model.attention_dropout": 0.1,
        "model.activation_dropout": 0.1, "model.share_all_embeddings": True,
        "model.resi_dual_scale": 1.0, "optimization.lr": [0.0005],
        "lr_scheduler.warmup_updates": 4000, "dataset.max_tokens": 4096,
        "optimization.update_freq": [1], "optimization.clip_norm": 0.0,
        "optimizer.weight_decay": 0.0001, "checkpoint.patience": 20,
        "checkpoint.best_checkpoint_metric": "bleu", "checkpoint.maximize_best_checkpoint_metric": True,
        "common.fp16": False, "common.amp": False, "task._name": "translation",
        "task.source_lang": "de", "task.target_lang": "en",
    },
    "wmt14_en_de": {
        "model._name": "residual_transformer_wmt_en_de", "model.encoder_layers": 6,
        "model.decoder_layers": 6, "model.dropout": 0.3, "model.attention_dropout": 0.1,
        "model.activation_dropout": 0.1, "model.share_all_embeddings": True,
        "model.resi_dual_scale": 1.0, "optimization.lr": [0.001],
        "lr_scheduler.warmup_updates": 4000, "dataset.max_tokens": 4096,
        "optimization.update_freq": [16], "optimization.max_update": 50000,
        "checkpoint.keep_last_epochs": 10, "optimization.clip_norm": 0.0,
        "optimizer.weight_decay": 0.0001, "common.amp": True, "common.fp16": False,
        "task._name": "translation", "task.source_lang": "en", "task.target_lang": "de",
    },
    "opus100": {
        "model._name": "residual_transformer_opus100", "model.encoder_layers": 18,
        "model.decoder_layers": 18, "model.dropout": 0.1, "model.attention_dropout": 0.1,
        "model.activation_dropout": 0.1, "model.share_all_embeddings": False,
        "model.share_decoder_input_output_embed": True,
        "optimization.lr": [0.004], "lr_scheduler.warmup_updates": 8000,
        "dataset.max_tokens": 4096, "optimization.update_freq": [16],
        "optimization.max_update": 100000, "optimization.clip_norm": 1.0,
        "optimizer.weight_decay": 0.0, "common.fp16": True, "common.fp16_init_scale": 8,
        "task._name": "translation_multi_simple_epoch", "task.sampling_method": "temperature",
        "task.sampling_temperature": 5.0, "task.encoder_langtok": "tgt",
    },
}
COMMON = {
    "criterion._name": "label_smoothed_cross_entropy", "criterion.label_smoothing": 0.1,
    "optimizer._name": "adam", "optimizer.adam_betas": "(0.9,0.98)",
    "lr_scheduler._name": "inverse_sqrt", "lr_scheduler.warmup_init_lr": 1e-7,
    "dataset.required_batch_size_multiple": 1,  # fairseq drops the last batch otherwise
}
#: d / ffn / heads of each config's preset
DIMS = {"iwslt14_de_en": (256, 1024, 4), "wmt14_en_de": (512, 2048, 8), "opus100": (512, 2048, 8)}


@pytest.fixture(scope="module")
def data(tiny_data_bin, tmp_path_factory):
    """{config name: (data-bin, overrides filling its '???' and languages)}."""
    _, bilingual = tiny_data_bin  # joined dictionary, languages src/tgt
    multi = multilingual_data_bin(tmp_path_factory)
    pair = [f"task.data={bilingual}", "task.source_lang=src", "task.target_lang=tgt"]
    return {
        "iwslt14_de_en": (bilingual, pair),
        "wmt14_en_de": (bilingual, pair),
        "opus100": (multi, [f"task.data={multi}", "task.langs=[en,de,nl]",
                            "task.lang_pairs=[en-de,de-en,en-nl,nl-en]"]),
    }


def compose(name, overrides):
    """The config fairseq-hydra-train would run: fairseq's schema + configs/NAME.yaml + overrides,
    with the dataclass defaults added and every interpolation resolved (fairseq_cli.hydra_train)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from fairseq.dataclass.initialize import add_defaults, hydra_init

    hydra_init(name)
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.1"):
        cfg = hydra_compose(config_name=name, overrides=[f"common.user_dir={USER_DIR}", *overrides])
    add_defaults(cfg)
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    OmegaConf.set_struct(cfg, True)
    return cfg


def build_hydra(name, overrides):
    """Task and model as fairseq_cli.train.main makes them from the composed config."""
    from fairseq import tasks, utils
    from fairseq.dataclass.initialize import add_defaults

    cfg = compose(name, overrides)
    utils.import_user_module(cfg.common)
    add_defaults(cfg)
    task = tasks.setup_task(cfg.task)
    return task.build_model(cfg.model), task, cfg


def build_argparse(data_bin, flags):
    """The model fairseq-train builds from these flags (argparse path)."""
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(data_bin), "--user-dir", USER_DIR, *flags])
    task = tasks.setup_task(args)
    return task.build_model(args)


def n_params(model):
    return sum(p.numel() for p in model.parameters())  # shared tensors count once


def closed_form(vocab, d, ffn, layers_enc, layers_dec, scheme, share_all):
    """Parameters of a Transformer with sinusoidal positions: embeddings + layers + final norms.

    Encoder layer: self-attention (4 d x d + 4 d) + its LayerNorm (2 d) + FFN (d ffn + ffn + ffn d + d)
    + final LayerNorm (2 d); a decoder layer adds cross-attention and its LayerNorm. Pre-LN and
    ResiDual add one LayerNorm per stack (Pre-LN's final norm; ResiDual's LN over x_d); Post-LN none.
    Embeddings: one shared table (share_all) or encoder + decoder tables with the decoder's shared
    with its output projection.
    """
    attn = 4 * (d * d + d)
    ln = 2 * d
    ff = d * ffn + ffn + ffn * d + d
    enc_layer = attn + ln + ff + ln
    dec_layer = attn + ln + attn + ln + ff + ln
    final = 0 if scheme == "post_ln" else 2 * ln
    emb = vocab * d if share_all else 2 * vocab * d
    return emb + layers_enc * enc_layer + layers_dec * dec_layer + final


def argparse_flags(name, data_overrides, scheme, layers):
    if name == "opus100":
        # the _wmt_en_de preset shares all embeddings and fairseq-train has no flag to turn that
        # off: the same model from the base preset with the OPUS dropouts and sharing
        return ["--task", "translation_multi_simple_epoch", "--langs", "en,de,nl",
                "--lang-pairs", "en-de,de-en,en-nl,nl-en", "--encoder-langtok", "tgt",
                "--arch", "residual_transformer", "--attention-dropout", "0.1",
                "--activation-dropout", "0.1", "--share-decoder-input-output-embed",
                "--max-source-positions", "256", "--max-target-positions", "256",
                *(["--resi-dual-scale", "0.05"] if scheme == "resi_dual" else []), "--residual-scheme", scheme,
                "--encoder-layers", str(layers), "--decoder-layers", str(layers)]
    preset = "residual_transformer_iwslt_de_en" if name == "iwslt14_de_en" else "residual_transformer_wmt_en_de"
    return ["--task", "translation", "-s", "src", "-t", "tgt", "--arch", preset,
            "--residual-scheme", scheme, "--encoder-layers", str(layers), "--decoder-layers", str(layers)]


def check_structure(model, d, ffn, heads, layers, scheme):
    """Dims, depth and layer classes of a built model."""
    from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
    from fairseq_residual.layers import ResidualDecoderLayer, ResidualEncoderLayer
    from fairseq_residual.schemes.resi_dual import ResiDualResidual

    assert model.residual_scheme == scheme
    for stack, layer_cls, resi_cls in (
        (model.encoder, TransformerEncoderLayerBase, ResidualEncoderLayer),
        (model.decoder, TransformerDecoderLayerBase, ResidualDecoderLayer),
    ):
        assert len(stack.layers) == layers
        assert stack.embed_tokens.embedding_dim == d
        layer = stack.layers[0]
        assert layer.fc1.out_features == ffn and layer.self_attn.num_heads == heads
        assert isinstance(layer, layer_cls)
        if scheme == "resi_dual":
            assert isinstance(layer, resi_cls) and isinstance(layer.ffn_residual, ResiDualResidual)
            assert stack.layer_norm is not None
        else:  # fairseq's stock layers
            assert type(layer) is layer_cls
            assert layer.normalize_before == (scheme == "pre_ln")
            assert (stack.layer_norm is None) == (scheme == "post_ln")


@pytest.mark.parametrize("name", NAMES)
def test_fairseq_hydra_train_loads_config(name, data):
    """The real CLI composes each YAML (schema matching, overrides, ??? filled) without running."""
    _, overrides = data[name]
    out = run_cli(["fairseq-hydra-train", "--config-dir", CONFIGS, "--config-name", name,
                   f"common.user_dir={USER_DIR}", *overrides, "model.residual_scheme=post_ln",
                   "model.encoder_layers=12", "model.decoder_layers=12", "--cfg", "job"]).stdout
    cfg = OmegaConf.create(out[out.index("common:"):])
    assert cfg.model.residual_scheme == "post_ln" and cfg.model.encoder_layers == 12
    assert cfg.common.user_dir == USER_DIR
    assert cfg.dataset.required_batch_size_multiple == 1


@pytest.mark.parametrize("name", NAMES)
def test_config_has_paper_hyperparameters(name):
    fill = ["task.data=/data-bin"]
    if name == "opus100":
        fill += ["task.langs=[en,de]", "task.lang_pairs=[en-de,de-en]"]
    cfg = compose(name, fill)
    for key, expected in {**COMMON, **PAPER[name]}.items():
        value = OmegaConf.select(cfg, key)
        if isinstance(value, (list, tuple)) or OmegaConf.is_list(value):
            value = list(value)
        assert value == pytest.approx(expected) if isinstance(expected, float) else value == expected, key


@pytest.mark.parametrize("name", NAMES)
def test_model_matches_argparse_and_closed_form(name, data, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/fairseq-hydra-train"])  # every key of the config is checked
    torch.manual_seed(0)
    data_bin, overrides = data[name]
    d, ffn, heads = DIMS[name]
    layers = PAPER[name]["model.encoder_layers"]
    scheme = "resi_dual"
    model, task, cfg = build_hydra(name, overrides)
    check_structure(model, d, ffn, heads, layers, scheme)
    vocab = len(task.source_dictionary)
    share_all = PAPER[name]["model.share_all_embeddings"]
    if not share_all:  # OPUS: separate encoder / decoder tables, decoder in/out shared
        assert model.encoder.embed_tokens.weight is not model.decoder.embed_tokens.weight
        assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight
    expected = closed_form(vocab, d, ffn, layers, layers, scheme, share_all)
    assert n_params(model) == expected
    if name == "opus100":
        assert model.encoder.residual.dual_scale == model.decoder.residual.dual_scale == 0.05  # the preset's c
        assert vocab == 4 + 32 + 3  # specials + words + one language token per language
        # translation_multi_simple_epoch's temperature sampling over the pairs
        assert task.args.sampling_method == "temperature" and float(task.args.sampling_temperature) == 5.0
    del model
    ref = build_argparse(data_bin, argparse_flags(name, overrides, scheme, layers))
    assert n_params(ref) == expected


@pytest.mark.parametrize("scheme", ["post_ln", "pre_ln", "resi_dual"])
def test_scheme_and_depth_overrides(scheme, data):
    """model.residual_scheme / model.encoder_layers / model.decoder_layers on the command line."""
    _, overrides = data["iwslt14_de_en"]
    model, task, _ = build_hydra(
        "iwslt14_de_en",
        [*overrides, f"model.residual_scheme={scheme}", "model.encoder_layers=12", "model.decoder_layers=3"],
    )
    assert len(model.encoder.layers) == 12 and len(model.decoder.layers) == 3
    assert n_params(model) == closed_form(len(task.source_dictionary), 256, 1024, 12, 3, scheme, True)
    from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

    layer = model.encoder.layers[0]
    if scheme == "resi_dual":
        assert type(layer.self_attn_residual).__name__ == "ResiDualResidual"
    else:
        assert type(layer) is TransformerEncoderLayerBase and layer.normalize_before == (scheme == "pre_ln")
    assert model.encoder.embed_tokens.embedding_dim == 256  # the preset's dims, not fairseq's base 512


def test_a_model_key_added_with_plus_that_the_model_does_not_read_is_refused(data, monkeypatch):
    """Hydra takes ``+model.decoder_layer=1`` (a typo of decoder_layers) as given and the model would ignore it:
    fairseq-hydra-train refuses it, naming the closest option; other programs building from a config (loading a
    checkpoint's saved config) are left alone."""
    from fairseq_residual.user_errors import SettingError

    _, overrides = data["iwslt14_de_en"]
    monkeypatch.setattr(sys, "argv", ["/venv/bin/fairseq-hydra-train"])
    with pytest.raises(SettingError, match=r"^model\.decoder_layer \(did you mean model\.decoder_layers\?\) is not an "
                                           r"option of the model residual_transformer_iwslt_de_en, which would ignore "
                                           r"it \(a key added with '\+' is not checked by Hydra\): fix the name"):
        build_hydra("iwslt14_de_en", [*overrides, "model.encoder_layers=2", "+model.decoder_layer=1"])
    monkeypatch.setattr(sys, "argv", ["/venv/bin/fairseq-generate"])
    model, _, _ = build_hydra("iwslt14_de_en", [*overrides, "model.encoder_layers=2", "+model.decoder_layer=1"])
    assert len(model.decoder.layers) == 6


def test_unfilled_values_are_reported():
    """task.data is '???' until given; the plugin path comes from FAIRSEQ_RESIDUAL_USER_DIR or
    common.user_dir, and an unset variable is an error that names it (not a silent '???' path)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue
    from fairseq.dataclass.initialize import hydra_init

    hydra_init("iwslt14_de_en")
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.1"):
        cfg = hydra_compose(config_name="iwslt14_de_en")
    with pytest.raises(MissingMandatoryValue):
        cfg.task.data
    old = os.environ.pop("FAIRSEQ_RESIDUAL_USER_DIR", None)
    try:
        with pytest.raises(InterpolationResolutionError, match="FAIRSEQ_RESIDUAL_USER_DIR"):
            cfg.common.user_dir
        os.environ["FAIRSEQ_RESIDUAL_USER_DIR"] = USER_DIR
        assert cfg.common.user_dir == USER_DIR
    finally:
        os.environ.pop("FAIRSEQ_RESIDUAL_USER_DIR", None)
        if old is not None:
            os.environ["FAIRSEQ_RESIDUAL_USER_DIR"] = old

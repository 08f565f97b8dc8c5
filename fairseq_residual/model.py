"""Registration of the ``residual_transformer`` model and its ``--arch`` presets.

The model is fairseq's argparse-style :class:`~fairseq.models.transformer.TransformerModel` with one
more option group (``--residual-scheme`` and each scheme's options, see ``config.py`` and
``schemes/``) and the encoder/decoder of ``encoder_decoder.py``. It is argparse-style on purpose: a
dataclass-registered model on ``TransformerModelBase`` cannot take its nested encoder/decoder options
from ``fairseq-train``'s command line (its ``add_args`` flattens them only for ``transformer``'s own
dataclass). Under ``fairseq-hydra-train`` fairseq applies the ``_name`` preset to the DictConfig before
``build_model``, so presets hold there too.

Presets (every one in ``fairseq-train --arch`` choices):

=================================== ================================================================
``residual_transformer``            fairseq base: 6+6 layers, 512 / 2048 / 8 heads, dropout 0.1
``residual_transformer_iwslt_de_en`` ResiDual authors' IWSLT14: 6+6, 256 / 1024 / 4, dropout .3/.1/.1,
                                    all embeddings shared (fairseq's own IWSLT preset is 512 wide)
``residual_transformer_wmt_en_de``   authors' WMT14: 6+6, 512 / 2048 / 8, dropout .3/.1/.1, shared
``residual_transformer_wmt_en_de_big`` fairseq big: 6+6, 1024 / 4096 / 16, dropout .3/.1
``residual_transformer_opus100``     authors' OPUS-100: 6+6 (they train 18+18), 512 / 2048 / 8,
                                    dropout .1/.1/.1, decoder in/out embeddings shared, c = 0.05
``residual_transformer_tiny``        tests: 2+2, 64 / 64 / 2 heads
=================================== ================================================================

and for each of the first five and every registered scheme ``<preset>_<scheme>`` (``_post_ln``,
``_pre_ln``, ``_resi_dual``, ...), which fix the default scheme (an explicit ``--residual-scheme`` still wins, as any explicit option does
over a fairseq preset). Without a suffix the scheme defaults to ``resi_dual``.
"""
import argparse
import ast
import contextlib
import copy
import logging
from typing import Optional

from torch import Tensor

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer.transformer_legacy import (
    TransformerModel,
    base_architecture,
    tiny_architecture,
    transformer_wmt_en_de_big,
)

from . import checkpoint_compat  # noqa: F401  (torch>=2.6 loading of fairseq checkpoints)
from .norms import replace_layer_norms
from .config import (add_residual_args, as_namespace, check_model_keys, residual_defaults, residual_options,
                     typed_training_keys)
from .encoder_decoder import (
    DROPOUT_NAMES,
    ProtocolDecoder,
    ProtocolEncoder,
    ResidualTransformerDecoder,
    ResidualTransformerEncoder,
)
from .optimizer_order import record_saved_order
from .pruning import prune_to_kept_layers
from .schemes import DEFAULT_SCHEME, SCHEME_NAMES
from .user_errors import SettingError, advice_for_this_tool, in_hydra_train

MODEL_NAME = "residual_transformer"

logger = logging.getLogger(__name__)


def _plugin_subclasses(cls):
    """The classes of this plugin that subclass ``cls`` (at any depth), in definition order."""
    found = []
    for sub in cls.__subclasses__():
        if sub.__module__.split(".")[0] == __name__.split(".")[0]:
            found.append(sub)
        found += [c for c in _plugin_subclasses(sub) if c not in found]
    return found


def retain_dropout_names():
    """The names ``--retain-dropout-modules`` accepts, each mapped to the ``module_name`` this model's dropout
    modules carry (fairseq's): per part of the transformer, fairseq's classes (base and legacy) and every class
    of this plugin that subclasses fairseq's, read from the classes (a scheme's own layer classes included)."""
    from fairseq.models.transformer import (TransformerDecoder, TransformerDecoderBase, TransformerEncoder,
                                            TransformerEncoderBase)
    from fairseq.modules.transformer_layer import (TransformerDecoderLayer, TransformerDecoderLayerBase,
                                                   TransformerEncoderLayer, TransformerEncoderLayerBase)

    parts = {"encoder": (TransformerEncoderBase, TransformerEncoder),
             "decoder": (TransformerDecoderBase, TransformerDecoder),
             "encoder_layer": (TransformerEncoderLayerBase, TransformerEncoderLayer),
             "decoder_layer": (TransformerDecoderLayerBase, TransformerDecoderLayer)}
    names = {}
    for part, (base, legacy) in parts.items():
        for cls in (base, legacy, *_plugin_subclasses(base)):
            names[cls.__name__] = DROPOUT_NAMES[part]
    names["MultiheadAttention"] = DROPOUT_NAMES["attention"]
    return names


#: :func:`retain_dropout_names` of the classes defined at import (every registered scheme's)
RETAIN_DROPOUT_NAMES = retain_dropout_names()


def _transformer_config(args):
    """fairseq ``TransformerConfig`` of ``args`` plus the validated ``residual_options`` (those
    :meth:`ResidualTransformerModel.build_model` validated once, when it is the caller)."""
    if not isinstance(args, TransformerConfig):
        args = as_namespace(args)
    validated = getattr(args, "_residual_options", None)
    cfg = TransformerConfig.from_namespace(args)
    cfg.residual_options = validated if validated is not None else residual_options(cfg)
    return cfg


def _module_names(value):
    """``--retain-dropout-modules`` as a list of names. fairseq types the option ``Any``, so fairseq-generate and
    fairseq-interactive hand over the string typed: a Python list literal (``"['A', 'B']"``) or names separated by
    commas or spaces (``A,B``); a Hydra config or a caller may give a list. None or empty: None.

    Raises:
        ValueError: a list literal that does not parse, or holds something other than names.
    """
    if value is None:
        return None
    if not isinstance(value, str):  # a list, tuple or Hydra ListConfig
        return [str(v) for v in value]
    text = value.strip()
    if text.startswith("["):
        try:
            names = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            names = None
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise SettingError(f"--retain-dropout-modules {value}: expected module names, as A,B or \"['A', 'B']\"")
        return list(names)
    return [n for n in text.replace(",", " ").split() if n] or None


@register_model(MODEL_NAME)
class ResidualTransformerModel(TransformerModel):
    """Transformer encoder-decoder with a selectable residual scheme (:mod:`fairseq_residual.schemes`).

    Subclass of fairseq's ``TransformerModel``: same inputs and outputs (``forward`` returns decoder
    logits B x T x V and the extras dict), same checkpoints apart from the ``residual_scheme_id``
    buffers and the scheme's own parameters, same training/generation entry points.
    """

    @classmethod
    def add_args(cls, parser):
        """fairseq's transformer options plus the residual-scheme options."""
        super().add_args(parser)
        add_residual_args(parser)

    @classmethod
    def known_model_keys(cls) -> frozenset:
        """The keys of a ``model`` config this model reads: its argparse options (fairseq's transformer options
        and the residual ones) and whatever its architecture presets set (fairseq applies the ``_name`` preset
        to the config before building)."""
        if "_known_keys" not in cls.__dict__:
            from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_INV_REGISTRY

            parser = argparse.ArgumentParser(add_help=False)
            cls.add_args(parser)
            keys = {a.dest for a in parser._actions}
            for arch in ARCH_MODEL_INV_REGISTRY.get(MODEL_NAME, ()):
                preset = argparse.Namespace()
                ARCH_CONFIG_REGISTRY[arch](preset)
                keys.update(vars(preset))
            cls._known_keys = frozenset(keys)
        return cls._known_keys

    @staticmethod
    def checked_options(args):
        """The validated residual options of a fairseq-train Namespace
        (:func:`~fairseq_residual.config.residual_options`, the options typed on this command line counted as
        given): fills the residual defaults and writes fairseq's ``--*-layers-to-keep`` lists as the
        comma-separated strings its legacy build splits, in ``args``.

        Raises:
            ValueError: what :func:`~fairseq_residual.config.residual_options` raises."""
        residual_defaults(args)
        for stack in ("encoder", "decoder"):  # fairseq-train parses these as lists, its legacy build splits strings
            keep = getattr(args, f"{stack}_layers_to_keep", None)
            if isinstance(keep, (list, tuple)):
                setattr(args, f"{stack}_layers_to_keep", ",".join(str(i) for i in keep))
        return residual_options(args, typed_training_keys())

    @classmethod
    def build_model(cls, args, task):
        """Build the model from an argparse Namespace (fairseq-train) or DictConfig (hydra).

        After fairseq built and initialised the model, the scheme re-initialises what it scales
        (``ResidualScheme.initialize``); then, with ``--norm`` other than ``layernorm``, every LayerNorm is
        replaced (:func:`fairseq_residual.norms.replace_layer_norms`).

        Raises:
            ValueError: invalid residual options (see ``config.residual_options``), or fairseq's
                own errors (e.g. ``--share-all-embeddings requires a joined dictionary``).
        """
        if in_hydra_train() and not isinstance(args, argparse.Namespace):  # a config's keys must all count
            check_model_keys(args, cls.known_model_keys())
        args = as_namespace(args)
        options = cls.checked_options(args)  # validated once per build (the stacks reuse it)
        scheme = options.scheme
        # The scheme decides LayerNorm placement: fairseq's normalize_before for Pre-LN-type schemes.
        args.encoder_normalize_before = args.decoder_normalize_before = scheme.normalize_before
        args._residual_options = options
        try:
            model = super().build_model(args, task)
        finally:
            del args._residual_options  # never saved with the checkpoint's args
            # fairseq's build sets --*-layers to the number of kept layers; the configuration saved with the
            # checkpoint keeps the trained depth, so that a model trained pruned reloads as the same sub-network
            args.encoder_layers, args.decoder_layers = options.encoder_layers, options.decoder_layers
        scheme.initialize(model, options)
        if options.norm is not None:  # --norm: every LayerNorm, as the scheme initialised it, replaced
            replace_layer_norms(model, options.norm)
        model.training_hook_pending = scheme.needs_training_hook
        return model

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg = _transformer_config(args)
        stack = ResidualTransformerEncoder if cfg.residual_options.scheme.fairseq_path else ProtocolEncoder
        return stack(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = _transformer_config(args)
        stack = ResidualTransformerDecoder if cfg.residual_options.scheme.fairseq_path else ProtocolDecoder
        return stack(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)

    #: True until the scheme's training hook (:meth:`ResidualScheme.training_hook`) ran on the first
    #: training batch; False for schemes without one
    training_hook_pending: bool = False

    def forward(
        self,
        src_tokens,
        src_lengths,
        prev_output_tokens,
        return_all_hiddens: bool = True,
        features_only: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        """fairseq's ``TransformerModelBase.forward`` (encoder, then decoder; B x T x V logits and the
        extras dict), after the scheme's training hook on the first training batch (Admin's profiling).
        Written out because TorchScript compiles no ``super()`` call."""
        if self.training_hook_pending:
            self._before_first_forward(src_tokens, src_lengths, prev_output_tokens)
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)
        decoder_out = self.decoder(
            prev_output_tokens,
            encoder_out=encoder_out,
            features_only=features_only,
            alignment_layer=alignment_layer,
            alignment_heads=alignment_heads,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
        )
        return decoder_out

    @torch.jit.unused
    def _before_first_forward(self, src_tokens: Tensor, src_lengths: Tensor, prev_output_tokens: Tensor) -> None:
        """The scheme's training hook on the first training batch; in eval mode before it, the scheme's
        warning (an Admin model that was never profiled)."""
        scheme = self.encoder.scheme
        if not self.training:
            scheme.warn_before_hook(self)
            return
        self.training_hook_pending = False  # the hook's own forward passes must not re-enter it
        scheme.training_hook(self, dict(src_tokens=src_tokens, src_lengths=src_lengths,
                                        prev_output_tokens=prev_output_tokens))

    def prepare_for_inference_(self, cfg):
        """fairseq's preparation for generation, with ``--retain-dropout-modules`` names translated: fairseq's
        class names (``TransformerEncoder``, ``TransformerEncoderLayer``, ...) and this plugin's own
        (``ProtocolEncoder``, ``ResidualEncoderLayer``, ...) select the same dropout modules, as in fairseq's
        ``transformer`` (Monte-Carlo dropout).

        Raises:
            ValueError: a name that is no module of this model, listing the names it has.
        """
        names = _module_names(getattr(getattr(cfg, "generation", None), "retain_dropout_modules", None))
        if getattr(cfg.generation, "retain_dropout", False) and names:
            from omegaconf import OmegaConf, open_dict

            unknown = [n for n in names if n not in RETAIN_DROPOUT_NAMES]
            if unknown:
                raise SettingError(
                    f"--retain-dropout-modules {' '.join(unknown)}: no module of residual_transformer has "
                    f"{'this name' if len(unknown) == 1 else 'these names'}; its dropout modules are "
                    f"{', '.join(sorted(set(RETAIN_DROPOUT_NAMES.values())))} (fairseq's names; the plugin's "
                    f"class names {', '.join(k for k in RETAIN_DROPOUT_NAMES if k not in DROPOUT_NAMES.values())} "
                    f"are accepted too)"
                )
            cfg = copy.deepcopy(cfg)  # the caller's configuration is left as it was
            with open_dict(cfg) if OmegaConf.is_config(cfg) else contextlib.nullcontext():
                cfg.generation.retain_dropout_modules = sorted({RETAIN_DROPOUT_NAMES[n] for n in names})
        return super().prepare_for_inference_(cfg)

    def __prepare_scriptable__(self):
        """What ``torch.jit.script`` compiles: this model without a pending training hook (a scripted model
        is for inference; the eager model keeps its hook)."""
        if not self.training_hook_pending:
            return self
        self.encoder.scheme.warn_before_hook(self)
        scriptable = copy.copy(self)  # shares every module and parameter
        scriptable.training_hook_pending = False
        return scriptable

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's load (its ``upgrade_state_dict``, then ``nn.Module.load_state_dict``) with the pruning of
        :func:`~fairseq_residual.pruning.prune_to_kept_layers` in place of fairseq's ``prune_state_dict``, so
        that a model trained with ``--*-layers-to-keep`` resumes and translates (``model_cfg`` and ``args``
        are accepted as fairseq passes them and not needed: the model knows its kept layers). A scheme whose
        training hook has nothing left to do (a resumed, profiled Admin model) runs it once more on the next
        training batch, which only logs that.

        Raises:
            ValueError: the checkpoint's layers match neither the trained model nor the kept layers
                (:func:`~fairseq_residual.pruning.prune_to_kept_layers`), its scheme is another one
                (:class:`~fairseq_residual.encoder_decoder.SchemeMismatchError`), or a tensor's shape differs
                from this model's (:class:`~fairseq_residual.user_errors.SettingError`, naming the tensors:
                a model built with other shape-changing settings than the checkpoint's, where PyTorch would list
                every mismatch after a traceback).
        """
        saved_tensors = list(state_dict.values())  # the saved model's order, before renames
        self.upgrade_state_dict(state_dict)
        state_dict = prune_to_kept_layers(state_dict, self.encoder.residual_options)
        own = self.state_dict()
        if strict:
            _check_keys(state_dict, own)
        _check_shapes(state_dict, own)
        result = torch.nn.Module.load_state_dict(self, state_dict, strict)
        record_saved_order(self, saved_tensors, state_dict)  # the optimizer state follows names, not positions
        self.training_hook_pending = self.encoder.scheme.needs_training_hook
        return result

    @property
    def residual_scheme(self):
        """The model's residual scheme's registry name (``post_ln``, ``pre_ln``, ``resi_dual``, ...)."""
        return self.encoder.residual_scheme


def _check_keys(saved: dict, own: dict) -> None:
    """Refuse a state dict whose tensor names are not this model's (a strict load), naming the first ones.

    Raises:
        SettingError: a model built with settings that add or remove parameters (a scheme's option such as
            hyper-connections' dynamic weights, ``hc_dynamic``) other than the checkpoint was trained with, where
            PyTorch would list every name after a traceback.
    """
    unexpected = [k for k in saved if k not in own]
    missing = [k for k in own if k not in saved]
    if unexpected or missing:
        def names(keys):
            return f"{', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''} ({len(keys)})"

        parts = ([f"the checkpoint has {names(unexpected)} that this model lacks"] if unexpected else []) + (
            [f"this model has {names(missing)} that the checkpoint lacks"] if missing else [])
        fix = advice_for_this_tool(
            "the model was built with settings other than the checkpoint's: drop the keys that add or remove "
            "parameters (a scheme's option such as hc_dynamic) from --model-overrides",
            "resume with the settings the checkpoint was trained with, or train this model in a new --save-dir")
        raise SettingError(f"the checkpoint does not fit this model: {'; '.join(parts)}. {fix}")


def _check_shapes(saved: dict, own: dict) -> None:
    """Refuse a state dict whose tensors do not have this model's shapes, naming the first three.

    Raises:
        SettingError: a model built with other shape-changing settings (a scheme's option such as the number of
            residual streams, a width) than the checkpoint was trained with: fairseq-generate's
            ``--model-overrides`` of such a key, or a checkpoint of another model; or, when only the embedding
            tables differ in their number of rows, data whose dictionaries are not the checkpoint's.
    """
    from .checkpoint_safety import dictionary_rows_differ

    differ = [k for k, v in saved.items()
              if k in own and torch.is_tensor(v) and tuple(v.shape) != tuple(own[k].shape)]
    named = [f"{k} is {tuple(saved[k].shape)} in the checkpoint, {tuple(own[k].shape)} in this model" for k in differ]
    words = dictionary_rows_differ(saved, own)
    if words:
        k, theirs, mine = words
        raise SettingError(
            f"the checkpoint's dictionary is not the data's: {k.split('.')[0]}'s embedding has "
            f"{theirs} rows in the checkpoint, {mine} with the dictionaries of this data "
            f"directory. Pass the data directory (fairseq-preprocess --destdir) the model was trained with, or "
            f"binarize the text with its dictionaries (fairseq-preprocess --srcdict/--tgtdict DATA_BIN/dict.*.txt)")
    if named:
        raise SettingError(
            f"the checkpoint does not fit this model: {'; '.join(named[:3])}{' ...' if len(named) > 3 else ''} "
            f"({len(named)} tensor{'s' if len(named) > 1 else ''}). The model was built with other settings than "
            f"the checkpoint was trained with: fairseq-generate, -interactive and -validate read them from the "
            f"checkpoint, so drop the keys that change shapes (a scheme's option such as hc_streams, a width) from "
            f"--model-overrides; fairseq-train: resume with the settings the checkpoint was trained with, or "
            f"train this model in a new --save-dir")


# ---------------------------------------------------------------------------------------------
# Architecture presets
# ---------------------------------------------------------------------------------------------


def _dropouts(args, dropout, attention_dropout, activation_dropout):
    args.dropout = getattr(args, "dropout", dropout)
    args.attention_dropout = getattr(args, "attention_dropout", attention_dropout)
    args.activation_dropout = getattr(args, "activation_dropout", activation_dropout)


def _dims(args, embed_dim, ffn_dim, heads, layers=6):
    for stack in ("encoder", "decoder"):
        setattr(args, f"{stack}_embed_dim", getattr(args, f"{stack}_embed_dim", embed_dim))
        setattr(args, f"{stack}_ffn_embed_dim", getattr(args, f"{stack}_ffn_embed_dim", ffn_dim))
        setattr(args, f"{stack}_attention_heads", getattr(args, f"{stack}_attention_heads", heads))
        setattr(args, f"{stack}_layers", getattr(args, f"{stack}_layers", layers))


def residual_base_architecture(args, scheme=DEFAULT_SCHEME):
    """fairseq's transformer base (6+6, 512 / 2048 / 8) with the residual defaults."""
    residual_defaults(args, scheme)
    base_architecture(args)


def residual_iwslt_de_en(args, scheme=DEFAULT_SCHEME):
    """IWSLT14 De-En as in the ResiDual authors' YAML (github.com/microsoft/ResiDual)."""
    _dims(args, 256, 1024, 4)
    _dropouts(args, 0.3, 0.1, 0.1)
    args.share_all_embeddings = getattr(args, "share_all_embeddings", True)
    residual_base_architecture(args, scheme)


def residual_wmt_en_de(args, scheme=DEFAULT_SCHEME):
    """WMT14 En-De as in the ResiDual authors' YAML (github.com/microsoft/ResiDual)."""
    _dims(args, 512, 2048, 8)
    _dropouts(args, 0.3, 0.1, 0.1)
    args.share_all_embeddings = getattr(args, "share_all_embeddings", True)
    residual_base_architecture(args, scheme)


def residual_opus100(args, scheme=DEFAULT_SCHEME):
    """OPUS-100 as in the ResiDual authors' YAML: 512 / 2048 / 8, dropout .1/.1/.1, decoder input and
    output embeddings shared (not the encoder's), and for ResiDual the dual-stream scale c = 0.05 (their
    fp16 setting; another scheme keeps ResiDual's options at their defaults)."""
    _dims(args, 512, 2048, 8)
    _dropouts(args, 0.1, 0.1, 0.1)
    args.share_decoder_input_output_embed = getattr(args, "share_decoder_input_output_embed", True)
    selected = getattr(args, "residual_scheme", None) or scheme
    if selected == "resi_dual" and getattr(args, "resi_dual_scale", None) is None:
        args.resi_dual_scale = 0.05  # an explicit value, 0 included, is validated
    residual_base_architecture(args, scheme)


def residual_wmt_en_de_big(args, scheme=DEFAULT_SCHEME):
    """fairseq's ``transformer_wmt_en_de_big`` (1024 / 4096 / 16, dropout 0.3, attention 0.1)."""
    residual_defaults(args, scheme)
    transformer_wmt_en_de_big(args)


def residual_tiny(args, scheme=DEFAULT_SCHEME):
    """fairseq's ``transformer_tiny`` (2+2 layers, 64 / 64 / 2 heads), for tests."""
    residual_defaults(args, scheme)
    tiny_architecture(args)


PRESETS = {
    MODEL_NAME: residual_base_architecture,
    f"{MODEL_NAME}_iwslt_de_en": residual_iwslt_de_en,
    f"{MODEL_NAME}_wmt_en_de": residual_wmt_en_de,
    f"{MODEL_NAME}_wmt_en_de_big": residual_wmt_en_de_big,
    f"{MODEL_NAME}_opus100": residual_opus100,
}


def _register_presets():
    """Register every preset and its ``_<scheme>`` variant for every registered scheme; return all arch names."""
    names = []
    for name, fn in PRESETS.items():
        register_model_architecture(MODEL_NAME, name)(fn)
        names.append(name)
        for scheme in SCHEME_NAMES:

            def variant(args, fn=fn, scheme=scheme):
                fn(args, scheme)

            variant.__name__ = f"{fn.__name__}_{scheme}"
            variant.__doc__ = f"{fn.__doc__} Default scheme: {scheme}."
            register_model_architecture(MODEL_NAME, f"{name}_{scheme}")(variant)
            names.append(f"{name}_{scheme}")
    register_model_architecture(MODEL_NAME, f"{MODEL_NAME}_tiny")(residual_tiny)
    names.append(f"{MODEL_NAME}_tiny")
    return names


ARCH_NAMES = _register_presets()
__all__ = ["ResidualTransformerModel", "ARCH_NAMES", "MODEL_NAME"]

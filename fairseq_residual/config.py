"""Options of the ``residual_transformer`` model: ``--residual-scheme`` and each scheme's own options.

The schemes, their formulas and their options live in :mod:`fairseq_residual.schemes` (one module per
scheme); this module adds them to fairseq's model parser, fills the defaults fairseq's ``--arch`` presets
leave open, and turns the parsed options into the validated :class:`~fairseq_residual.schemes.SchemeOptions`
that the encoder and decoder receive as ``cfg.residual_options``.
"""
import argparse
import numbers
import re
import sys

from .norms import add_norm_args, fill_norm_defaults, norm_options
from .schemes import DEFAULT_SCHEME, SCHEME_NAMES, SCHEMES, SchemeOptions, get_scheme
from .schemes.base import OptionError
from .user_errors import SettingError, advice_for_this_tool, closest, in_hydra_train, running_tool

# fp16's largest finite value; anything summed in fp16 (ResiDual's dual stream x_d) must stay below it.
FP16_MAX = 65504.0


def add_residual_args(parser):
    """Add ``--residual-scheme`` and every scheme's options to a fairseq model parser.

    No defaults are set here: fairseq parses model options with ``argparse.SUPPRESS`` so that the
    ``--arch`` presets (``residual_base_architecture`` and its variants) fill what the user left out.
    """
    parser.add_argument(
        "--residual-scheme",
        choices=SCHEME_NAMES,
        help="where LayerNorm and the residual connection go: "
        + "; ".join(f"{s.name} ({s.label}): {s.update}" for s in SCHEMES)
        + f". Default: {DEFAULT_SCHEME}, or the scheme named by the --arch preset",
    )
    add_norm_args(parser)
    for scheme in SCHEMES:
        scheme.add_args(parser)


def _residual_parser():
    """A parser of the residual options alone (:func:`add_residual_args`)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_residual_args(parser)
    return parser


def typed_residual_options(argv=None):
    """The residual options (``--residual-scheme``, ``--norm`` and its options, every scheme's) typed on this
    process's command line (``sys.argv``), in the order typed."""
    known = {o for a in _residual_parser()._actions for o in a.option_strings}
    argv = sys.argv[1:] if argv is None else argv
    return [a.split("=")[0] for a in argv if a.split("=")[0] in known]


def typed_training_keys(argv=None) -> frozenset:
    """The keys (``hc_streams``) of the residual options typed on this training command line: fairseq-train's
    ``--hc-streams`` (or a boolean option's negative flag), fairseq-hydra-train's ``model.hc_streams=...``
    (``+`` / ``++`` prefixed too); empty in any other program, whose model comes from a checkpoint or a script's
    own settings. Only what was typed: a Hydra config's keys are the config's, not the user's."""
    argv = sys.argv[1:] if argv is None else argv
    dests = {o: a.dest for a in _residual_parser()._actions for o in a.option_strings}
    if in_hydra_train():
        typed = (re.match(r"\+{0,2}model\.(\w+)=", a) for a in argv)
        return frozenset(m.group(1) for m in typed if m and m.group(1) in dests.values())
    if running_tool() == "fairseq-train":
        return frozenset(dests[a.split("=")[0]] for a in argv if a.split("=")[0] in dests)
    return frozenset()


def residual_defaults(args, scheme=DEFAULT_SCHEME):
    """Fill the residual options the user did not give (fairseq ``--arch`` preset convention).

    Args:
        args: argparse.Namespace or omegaconf DictConfig (open for writing) of the model.
        scheme: the scheme this preset stands for when ``--residual-scheme`` was not given.
    """
    args.residual_scheme = getattr(args, "residual_scheme", None) or scheme
    fill_norm_defaults(args)
    for s in SCHEMES:
        s.fill_defaults(args)


def residual_options(args, typed=frozenset()) -> SchemeOptions:
    """Read and validate the residual options of a Namespace / DictConfig filled by ``residual_defaults``.

    An option of another scheme than the selected one, set to something else than its default or among the
    keys ``typed`` (:func:`typed_training_keys`: typed on the training command line, at its default or not), is
    refused the same way for every scheme, before any range is checked (its value is moot); then every scheme's
    options are validated against their declared ranges; an option of another ``--norm`` is refused likewise;
    the stacks must have at
    least one layer; the selected scheme then checks the fairseq options it cannot honour, and whether it
    runs with the ``--norm`` given (:mod:`fairseq_residual.norms`).

    Raises:
        ValueError: unknown scheme, a stack without layers, an option outside its range or of another
            scheme (:class:`~fairseq_residual.schemes.base.OptionError`), or a fairseq option that
            contradicts the scheme (e.g. ``--encoder-normalize-before`` with a Post-LN-type scheme), each
            naming the flag and the fix.
    """
    selected = get_scheme(args.residual_scheme)
    depth = {}
    for stack in ("encoder", "decoder"):
        layers, keep = _stack_option(args, stack, "layers"), _stack_option(args, stack, "layers_to_keep")
        if layers is not None and (isinstance(layers, bool) or not isinstance(layers, numbers.Integral) and not (
                isinstance(layers, str) and layers.strip().isdecimal() and layers.strip().isascii())):
            raise OptionError(  # Hydra hands over what was typed (model.encoder_layers=two), past argparse's int
                f"--{stack}-layers (model.{stack}_layers) must be an integer, at least 1, got {layers!r}")
        if layers is not None and int(layers) < 1:
            raise OptionError(
                f"--{stack}-layers must be at least 1, got {layers}: every residual scheme needs a layer per "
                f"stack (--{stack}-layers / model.{stack}_layers)"
            )
        n = int(layers or 0)
        kept = tuple(range(n))
        if keep:
            try:  # fairseq's option is a list (argparse) or a comma-separated string (a legacy namespace)
                kept = tuple(int(i) for i in (keep.split(",") if isinstance(keep, str) else keep))
            except (TypeError, ValueError):
                kept = ()
            if not kept or len(set(kept)) != len(kept) or not all(0 <= i < n for i in kept):
                raise OptionError(
                    f"--{stack}-layers-to-keep {keep!r} must be distinct layer indices of the trained model, "
                    f"0..{n - 1}, comma-separated (fairseq's pruning of a LayerDrop-trained model)"
                )
        depth[stack] = (n, kept)
    for scheme in SCHEMES:  # first: a value of another scheme's option is moot, whatever its range
        given = scheme.given_options(args, typed) if scheme is not selected else []
        if given:
            named = [_with_hydra_key(scheme, flag) for flag in given]
            what = (f"{', '.join(named)} {'is an option' if len(given) == 1 else 'are options'} of "
                    f"--residual-scheme {scheme.name} (model.residual_scheme={scheme.name}), but the model's scheme "
                    f"is {selected.name}")
            loading = (f"if --model-overrides sets {'it' if len(given) == 1 else 'them'}, drop "
                       f"{'it' if len(given) == 1 else 'them'} there; if the checkpoint was trained with "
                       f"--residual-scheme {scheme.name} and saved {'it' if len(given) == 1 else 'them'}, load it "
                       f"with its own scheme (drop residual_scheme from --model-overrides)")
            training = (f"drop {' '.join(_hydra_key(scheme, f) for f in given)} or use "
                        f"model.residual_scheme={scheme.name}" if in_hydra_train() else
                        f"drop {' '.join(given)} or use --residual-scheme {scheme.name}")
            raise OptionError(f"{what}: {advice_for_this_tool(loading, training)}")
    for scheme in SCHEMES:
        scheme.validate(args)
    selected.check_args(args)
    norm = norm_options(args, typed)
    refusal = selected.norm_refusal(norm.kind, args)
    if refusal:
        raise OptionError(
            f"--norm {norm.kind} is not supported with --residual-scheme {selected.name}: {refusal}; use --norm "
            f"layernorm (model.norm=layernorm)")
    return SchemeOptions(scheme=selected, params=selected.options(args),
                         encoder_layers=depth["encoder"][0], decoder_layers=depth["decoder"][0],
                         encoder_kept=depth["encoder"][1], decoder_kept=depth["decoder"][1], norm=norm)


def _stack_option(args, stack, key):
    """``args.{stack}_{key}`` (a Namespace) or ``args.{stack}.{key}`` (a TransformerConfig), or None."""
    value = getattr(args, f"{stack}_{key}", None)
    if value is None and hasattr(args, stack):
        value = getattr(getattr(args, stack), key, None)
    return value


def _hydra_key(scheme, flag: str) -> str:
    """``model.hc_streams`` for ``--hc-streams``; a boolean option's negative flag: its option's key."""
    for o in scheme.OPTIONS:
        if o.type is bool and flag == o.negative:
            return f"model.{o.dest}"
    return f"model.{flag[2:].replace('-', '_')}"


def _with_hydra_key(scheme, flag: str) -> str:
    """``--hc-streams (model.hc_streams)``; a boolean option's negative flag with its value
    (``--no-x (model.x=false)``)."""
    negative = any(o.type is bool and flag == o.negative for o in scheme.OPTIONS)
    return f"{flag} ({_hydra_key(scheme, flag)}{'=false' if negative else ''})"


def check_model_keys(cfg, known) -> None:
    """Refuse a key of fairseq-hydra-train's ``model`` group that the model does not read: Hydra checks the keys
    a config declares, but a key added with ``+`` (``+model.decoder_layer=1``, a typo of ``decoder_layers``) is
    taken as given and ignored, so the run would train another model than the one asked for.

    Args:
        cfg: the ``model`` group (a DictConfig).
        known: the keys the model reads (its argparse options and what its architecture presets set).

    Raises:
        SettingError: naming each unknown key, the closest known one and the fix.
    """
    unknown = sorted(k for k in cfg.keys() if k != "_name" and k not in known)
    if unknown:
        names = []
        for key in unknown:
            close = closest(key, known)
            names.append(f"model.{key}" + (f" (did you mean model.{close}?)" if close else ""))
        raise SettingError(f"{', '.join(names)} {'is not an option' if len(names) == 1 else 'are not options'} of "
                           f"the model {cfg.get('_name')}, which would ignore {'it' if len(names) == 1 else 'them'} "
                           f"(a key added with '+' is not checked by Hydra): fix the name, or drop it")


def _keys(section) -> set:
    """The keys of a configuration section: a dict / DictConfig's, or a Namespace's attributes; none else."""
    if isinstance(section, argparse.Namespace):
        return set(vars(section))
    return set(section.keys()) if hasattr(section, "keys") else set()


def check_override_keys(overrides, cfg, model_keys) -> None:
    """Refuse a ``--model-overrides`` key that nothing reads. fairseq applies the overrides to a loaded
    checkpoint's configuration by name (``fairseq/dataclass/utils.py``, ``overwrite_args_by_name``): a key no
    section holds is dropped, and every key is set on a model configuration saved as a Namespace (this plugin's),
    where a misspelt one (``{'encoder_layer': 3}``) is read by nobody, so the tool runs the model as saved
    without a word. A section's dict (``{'task': {'data': ...}}``) is applied key by key to a section saved as a
    config, whose keys are checked; to a section saved as a Namespace (the model's) it is set as one more
    attribute and read by nobody, so it is refused with the top-level form.

    Args:
        overrides: the keys typed in ``--model-overrides`` (a dict, evaluated).
        cfg: the loaded checkpoint's configuration (a dict or DictConfig of sections), read before the
            overrides are applied (a model section saved as a Namespace may be read after: it is not read).
        model_keys: the keys the model reads (:meth:`ResidualTransformerModel.known_model_keys`), the known keys
            of a model section saved as a Namespace.

    Raises:
        SettingError: naming each unknown key (``section.key`` inside a section's dict), the closest known one
            and the fix; or a section's dict for the model.
    """
    sections = {name: cfg[name] for name in cfg.keys()}
    model = sections.get("model")
    # a model saved as a Namespace takes any key and reads its options; one saved as a config (by
    # fairseq-hydra-train) takes only the keys it holds
    known = set(sections) | (set(model_keys) if isinstance(model, argparse.Namespace) or model is None
                             else _keys(model))
    for name, section in sections.items():
        if name != "model":
            known |= _keys(section)
    unknown = []
    for key, value in overrides.items():
        if key not in known:
            unknown.append((key, closest(key, known)))
        elif isinstance(value, dict) and key in sections:
            section = sections[key]
            if isinstance(section, argparse.Namespace):
                inner = ", ".join(f"{k!r}: {v!r}" for k, v in value.items())
                raise SettingError(f"--model-overrides {{{key!r}: {{...}}}}: this checkpoint saved its {key} "
                                   f"settings as a Namespace, where fairseq sets the dict as one more setting and "
                                   f"nothing reads it; give its keys at the top level: {{{inner}}}")
            inner_known = _keys(section)
            unknown += [(f"{key}.{k}", None if (c := closest(k, inner_known)) is None else f"{key}.{c}")
                        for k in value if k not in inner_known]
    if unknown:
        names = [repr(k) + (f" (did you mean {c!r}?)" if c else "") for k, c in sorted(unknown)]
        raise SettingError(f"--model-overrides {', '.join(names)}: {'no option' if len(names) == 1 else 'no options'} "
                           f"of this checkpoint's model or of fairseq, so fairseq would ignore "
                           f"{'it' if len(names) == 1 else 'them'} and run the model as saved: fix the key, or drop it")


def as_namespace(args):
    """Return ``args`` as an ``argparse.Namespace`` (a resolved copy when it is an omegaconf config).

    fairseq-hydra-train hands legacy models a DictConfig; ``TransformerConfig.from_namespace``
    keeps only the keys it declares from a DictConfig but every key from a Namespace, so the
    residual options survive only in a Namespace.
    """
    if isinstance(args, argparse.Namespace):
        return args
    from omegaconf import OmegaConf

    if OmegaConf.is_config(args):
        return argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
    raise TypeError(f"expected an argparse.Namespace or an omegaconf config, got {type(args).__name__}")

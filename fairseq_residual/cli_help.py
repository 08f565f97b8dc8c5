"""fairseq's command line: the ``residual_transformer`` presets and options in ``fairseq-train --help``, and
argparse's errors in one line.

fairseq declares ``--arch`` with ``metavar='ARCH'`` and parses model options only once ``--arch`` is
known (``fairseq/options.py``, ``parse_args_and_arch``: a first parse, then the model's ``add_args``, then a
second parse), while ``--help`` exits during the first parse: its help names no architecture and no model
option, not even with ``--arch`` given. fairseq imports ``--user-dir`` before it builds the parser, so
wrapping :func:`fairseq.options.add_model_args` here

* extends the ``--arch`` help text with this plugin's presets and schemes, and
* lets ``--help`` with ``--arch <one of its presets>`` (before or after it) print the model's options
  (fairseq's transformer options and the residual ones, with their help, ranges and defaults) before it exits.

Parsing is unchanged: the model's options join the parser only in the help action, which exits.

argparse reports a misspelt option or a wrong choice after the whole usage, which for fairseq's parsers is
100-200 lines (every option of fairseq, the task and the model), so that the error scrolls out of sight.
Wrapping :func:`fairseq.options.add_dataset_args`, which every tool's parser calls after ``--user-dir`` is
imported, gives those parsers :func:`one_line_error` in fairseq's tools: the same message and exit status 2,
without the usage, with the closest option or choice.
"""
import argparse
import re
import sys

from fairseq import models as fairseq_models
from fairseq import options

from .model import ARCH_NAMES, MODEL_NAME, PRESETS
from .schemes import SCHEMES, SCHEME_NAMES
from .user_errors import LOADING_TOOLS, SettingError, closest, long_options, running_tool

_add_model_args = options.add_model_args
_add_dataset_args = options.add_dataset_args

ARCH_HELP = (
    f"; {MODEL_NAME} (fairseq_residual) presets: {', '.join(ARCH_NAMES)}. "
    f"Their --residual-scheme {{{','.join(SCHEME_NAMES)}}} "
    f"({'; '.join(f'{s.name}: {s.label}' for s in SCHEMES)}). "
    f"Give --arch {MODEL_NAME} (or a preset) with --help to list the model's options"
)


class ModelHelpAction(argparse._HelpAction):
    """``--help`` that, when ``--arch`` names one of this plugin's presets on the command line (before
    ``--help``, or after it: :func:`_arch_typed`), first adds the model's options to the parser (as fairseq's
    second parse would) so that the help lists them."""

    def __call__(self, parser, namespace, values, option_string=None):
        arch = _arch_typed(parser) or getattr(namespace, "arch", None)
        if arch in ARCH_NAMES:
            from fairseq.models import ARCH_MODEL_REGISTRY

            group = parser.add_argument_group(
                f"Model-specific configuration (--arch {arch}: {MODEL_NAME}, fairseq_residual)",
                argument_default=argparse.SUPPRESS)
            ARCH_MODEL_REGISTRY[arch].add_args(group)
        super().__call__(parser, namespace, values, option_string)


def _arch_typed(parser):
    """The value of the last ``--arch`` (any of its option strings: ``--arch X``, ``--arch=X``, ``-aX``) among the
    arguments ``parser`` is parsing (recorded by :func:`add_model_args`), or None: argparse runs ``--help``'s
    action as soon as it reads it, before the options after it are parsed."""
    arch_flags = [s for a in parser._actions if a.dest == "arch" for s in a.option_strings]
    typed, arch = getattr(parser, "arguments_parsed", []), None
    short = [f for f in arch_flags if len(f) == 2]  # -a: argparse also takes -aVALUE
    for i, argument in enumerate(typed):
        flag, equals, value = argument.partition("=")
        if argument in arch_flags and i + 1 < len(typed):
            arch = typed[i + 1]
        elif equals and flag in arch_flags:
            arch = value
        elif any(argument.startswith(f) and len(argument) > 2 for f in short):
            arch = argument[2:]
    return arch


def add_model_args(parser):
    """fairseq's ``add_model_args`` with this plugin's presets appended to the ``--arch`` help, and a
    ``--help`` that lists the model's options when ``--arch`` names a preset (:class:`ModelHelpAction`; the
    parser records the arguments each parse reads, for an ``--arch`` typed after ``--help``)."""
    group = _add_model_args(parser)
    for action in group._group_actions:
        if "--arch" in action.option_strings and ARCH_HELP not in (action.help or ""):
            action.help = (action.help or "model architecture") + ARCH_HELP
    for action in parser._actions:
        if type(action) is argparse._HelpAction:
            action.__class__ = ModelHelpAction
    stock_parse = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        parser.arguments_parsed = list(sys.argv[1:] if args is None else args)
        return stock_parse(args, namespace)

    parser.parse_known_args = parse_known_args
    return group


def _plugin_model_options() -> set:
    """Every ``--option`` of this plugin's model (fairseq's transformer options and the residual ones)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    parser = argparse.ArgumentParser(add_help=False)
    ARCH_MODEL_REGISTRY[MODEL_NAME].add_args(parser)
    return set(long_options(parser))


def _lists_model_options(parser) -> bool:
    """Whether ``parser``'s ``--help`` lists the model's options after ``--arch`` (:class:`ModelHelpAction`: the
    parsers :func:`add_model_args` extends, fairseq-train's)."""
    return any(isinstance(a, ModelHelpAction) for a in parser._actions)


def _owners_not_chosen(flag: str) -> list:
    """``--lr-scheduler inverse_sqrt_nowarmup`` for ``--decay-period``: the components of fairseq's registries
    (criterion, optimizer, learning-rate scheduler, tokenizer, BPE, scoring; tasks) whose dataclass declares the
    option ``flag``, at most four, sorted; ``[]`` when none does. argparse adds only the chosen component's options,
    so one of another component is "unrecognized", and the closest option name would point elsewhere."""
    import dataclasses

    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    key = flag[2:].replace("-", "_")
    kinds = {name: r["dataclass_registry"] for name, r in REGISTRIES.items()}
    kinds["task"] = TASK_DATACLASS_REGISTRY
    owners = sorted(f"--{kind.replace('_', '-')} {name}" for kind, registry in kinds.items()
                    for name, dc in registry.items()
                    if dataclasses.is_dataclass(dc) and any(f.name == key for f in dataclasses.fields(dc)))
    return owners[:4] + (["others"] if len(owners) > 4 else [])


def _join_or(items) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def did_you_mean(message: str, parser) -> str:
    """`` (did you mean X?)`` for argparse's error ``message`` about ``parser``'s command line: the closest
    option to the first unrecognized ``--option`` (compared without the dashes), or the closest choice to an
    invalid one; for an option of this plugin's model that this command line's ``--arch`` does not take, where
    it belongs (in a tool that loads a checkpoint: ``--model-overrides``); ``""`` when nothing is close (difflib's ratio below 0.6) or the message is of another kind."""
    unknown = re.match(r"unrecognized arguments: (.*)", message)
    if unknown:
        typed = [a.split("=")[0] for a in unknown.group(1).split() if a.startswith("--")]
        if not typed:
            return ""
        if typed[0] in _plugin_model_options():
            if running_tool() in LOADING_TOOLS or (not _lists_model_options(parser)
                                                   and "--arch" not in long_options(parser)):
                # a tool that loads a checkpoint (fairseq-generate's --arch, default wav2vec2, is a workaround of
                # fairseq_cli/generate.py for audio models: its model comes from the checkpoint too)
                key = typed[0][2:].replace("-", "_")
                if typed[0] in ("--residual-scheme", "--norm"):  # the weights are of the checkpoint's own
                    return (f" ({typed[0]} is a model option: this tool builds the model with the {key} the "
                            f"checkpoint was trained with, whose weights are that {key}'s; drop it)")
                return (f" ({typed[0]} is a model option: this tool reads the model's settings from the checkpoint; "
                        f"change one with --model-overrides \"{{'{key}': ...}}\")")
            return f" ({typed[0]} is an option of the {MODEL_NAME} presets: --arch {MODEL_NAME} or another of them)"
        owners = _owners_not_chosen(typed[0])
        if owners:
            return f" ({typed[0]} is an option of {_join_or(owners)}, not of the one this command line chose)"
        close = closest(typed[0][2:], [o[2:] for o in long_options(parser)])
        return f" (did you mean --{close}?)" if close else ""
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    tiny = re.fullmatch(rf"{MODEL_NAME}_tiny_(\w+)", choice.group(1)) if choice else None
    if tiny and tiny.group(1) in SCHEME_NAMES:  # the tiny preset has no per-scheme variants
        return f" (did you mean --arch {MODEL_NAME}_tiny --residual-scheme {tiny.group(1)}?)"
    if choice:
        close = closest(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        return f" (did you mean {close}?)" if close else ""
    return ""


def one_line_error(parser) -> None:
    """Make ``parser.error`` print ``<prog>: error: <argparse's message> (did you mean ...?)`` and where the
    options are listed, and exit with argparse's status 2, without the usage argparse prints first; a choice
    list of 30 or more (``--arch``: every architecture fairseq registers) is cut to its count when a close
    choice is named."""

    def error(message):
        hint = did_you_mean(message, parser)
        choices = re.search(r" \(choose from (.*)\)$", message)
        if hint and choices and choices.group(1).count("', '") >= 29:
            message = message[:choices.start()] + f" (one of {choices.group(1).count(', ') + 1} choices)"
        model = (" (with --arch <preset>, the model's too)"
                 if _lists_model_options(parser) else "")
        parser.exit(2, f"{parser.prog}: error: {message}{hint}; {parser.prog} --help lists the options{model}\n")

    parser.error = error


def add_dataset_args(parser, train=False, gen=False):
    """fairseq's ``add_dataset_args`` (called by every tool's parser), giving the parser of fairseq's tools
    :func:`one_line_error`."""
    group = _add_dataset_args(parser, train=train, gen=gen)
    if running_tool() is not None:
        one_line_error(parser)
    return group


def build_model(cfg, task, from_checkpoint=False):
    """fairseq's ``models.build_model``, refusing first a model name that no registry knows: Hydra's
    ``model._name`` is not checked against the ``--arch`` choices, and fairseq then ends on an assertion whose
    message formats the whole config (``KeyError: "'_name'"`` in struct mode).

    Raises:
        SettingError: the name is unknown, with the closest known one and the plugin's presets."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY

    try:
        name = getattr(cfg, "_name", None) or getattr(cfg, "arch", None)
    except Exception:  # noqa: BLE001 - a config without either: fairseq's own inference and errors
        name = None
    if isinstance(name, str) and name not in ARCH_MODEL_REGISTRY and name not in MODEL_DATACLASS_REGISTRY:
        close = closest(name, [*ARCH_MODEL_REGISTRY, *MODEL_DATACLASS_REGISTRY])
        raise SettingError(
            f"model._name={name} (--arch) is no model or architecture fairseq knows"
            + (f" (did you mean {close}?)" if close else "")
            + f": this plugin's are {', '.join(PRESETS)} (each also as <preset>_<scheme>) and {MODEL_NAME}_tiny "
              f"(fairseq-train --user-dir fairseq_residual --help lists them all); a model of another plugin needs "
              f"its --user-dir (common.user_dir)")
    return _stock_build_model(cfg, task, from_checkpoint)


if getattr(options.add_model_args, "__module__", None) != __name__:
    options.add_model_args = add_model_args
    options.add_dataset_args = add_dataset_args
if getattr(fairseq_models.build_model, "__module__", None) != __name__:
    _stock_build_model = fairseq_models.build_model
    fairseq_models.build_model = build_model

"""List the ``residual_transformer`` presets and options in ``fairseq-train --help``.

fairseq declares ``--arch`` with ``metavar='ARCH'`` and parses model options only once ``--arch`` is
known (``fairseq/options.py``, ``parse_args_and_arch``: a first parse, then the model's ``add_args``, then a
second parse), while ``--help`` exits during the first parse: its help names no architecture and no model
option, not even with ``--arch`` given. fairseq imports ``--user-dir`` before it builds the parser, so
wrapping :func:`fairseq.options.add_model_args` here

* extends the ``--arch`` help text with this plugin's presets and schemes, and
* lets ``--help`` after ``--arch <one of its presets>`` print the model's options (fairseq's transformer
  options and the residual ones, with their help, ranges and defaults) before it exits.

Parsing is unchanged: the model's options join the parser only in the help action, which exits.
"""
import argparse

from fairseq import options

from .model import ARCH_NAMES, MODEL_NAME
from .schemes import SCHEMES, SCHEME_NAMES

_add_model_args = options.add_model_args

ARCH_HELP = (
    f"; {MODEL_NAME} (fairseq_residual) presets: {', '.join(ARCH_NAMES)}. "
    f"Their --residual-scheme {{{','.join(SCHEME_NAMES)}}} "
    f"({'; '.join(f'{s.name}: {s.label}' for s in SCHEMES)}). "
    f"Give --arch {MODEL_NAME} (or a preset) before --help to list the model's options"
)


class ModelHelpAction(argparse._HelpAction):
    """``--help`` that, when ``--arch`` named one of this plugin's presets earlier on the command line, first
    adds the model's options to the parser (as fairseq's second parse would) so that the help lists them."""

    def __call__(self, parser, namespace, values, option_string=None):
        arch = getattr(namespace, "arch", None)
        if arch in ARCH_NAMES:
            from fairseq.models import ARCH_MODEL_REGISTRY

            group = parser.add_argument_group(
                f"Model-specific configuration (--arch {arch}: {MODEL_NAME}, fairseq_residual)",
                argument_default=argparse.SUPPRESS)
            ARCH_MODEL_REGISTRY[arch].add_args(group)
        super().__call__(parser, namespace, values, option_string)


def add_model_args(parser):
    """fairseq's ``add_model_args`` with this plugin's presets appended to the ``--arch`` help, and a
    ``--help`` that lists the model's options after ``--arch`` (:class:`ModelHelpAction`)."""
    group = _add_model_args(parser)
    for action in group._group_actions:
        if "--arch" in action.option_strings and ARCH_HELP not in (action.help or ""):
            action.help = (action.help or "model architecture") + ARCH_HELP
    for action in parser._actions:
        if type(action) is argparse._HelpAction:
            action.__class__ = ModelHelpAction
    return group


if getattr(options.add_model_args, "__module__", None) != __name__:
    options.add_model_args = add_model_args

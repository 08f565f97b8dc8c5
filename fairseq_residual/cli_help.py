"""List the ``residual_transformer`` presets and options in ``fairseq-train --help``.

fairseq declares ``--arch`` with ``metavar='ARCH'`` and parses model options only once ``--arch`` is
known, so its ``--help`` names no architecture and no model option: a user-dir model is invisible
there. fairseq imports ``--user-dir`` before it builds the parser, so wrapping :func:`fairseq.options.add_model_args` here
extends the ``--arch`` help text with this plugin's presets and options; parsing is unchanged.
"""
import argparse

from fairseq import options

from .schemes import SCHEME_NAMES, SCHEMES
from .model import ARCH_NAMES, MODEL_NAME

_add_model_args = options.add_model_args



def scheme_option_names():
    """Every scheme's own options as ``--flag METAVAR``, read from the schemes' ``add_args``."""
    parser = argparse.ArgumentParser(add_help=False)
    for scheme in SCHEMES:
        scheme.add_args(parser)
    return [" ".join(filter(None, (a.option_strings[0], a.metavar))) for a in parser._actions]


ARCH_HELP = (
    f"; {MODEL_NAME} (fairseq_residual) presets: {', '.join(ARCH_NAMES)}. "
    f"Their options: --residual-scheme {{{','.join(SCHEME_NAMES)}}} "
    f"({'; '.join(f'{s.name}: {s.label}' for s in SCHEMES)}), "
    f"{', '.join(scheme_option_names())}, plus fairseq's transformer options"
)


def add_model_args(parser):
    """fairseq's ``add_model_args`` with this plugin's presets appended to the ``--arch`` help."""
    group = _add_model_args(parser)
    for action in group._group_actions:
        if "--arch" in action.option_strings and ARCH_HELP not in (action.help or ""):
            action.help = (action.help or "model architecture") + ARCH_HELP
    return group


if getattr(options.add_model_args, "__module__", None) != __name__:
    options.add_model_args = add_model_args

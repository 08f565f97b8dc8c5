"""List the ``residual_transformer`` presets and options in ``fairseq-train --help``.

fairseq declares ``--arch`` with ``metavar='ARCH'`` and parses model options only once ``--arch`` is
known, so its ``--help`` names no architecture and no model option: a user-dir model is invisible
there (a failure users of comparable plugins reported, reference notes section 6). fairseq imports
``--user-dir`` before it builds the parser, so wrapping :func:`fairseq.options.add_model_args` here
extends the ``--arch`` help text with this plugin's presets and options; parsing is unchanged.
"""
from fairseq import options

from .config import SCHEMES
from .model import ARCH_NAMES, MODEL_NAME

_add_model_args = options.add_model_args

ARCH_HELP = (
    f"; {MODEL_NAME} (fairseq_residual) presets: {', '.join(ARCH_NAMES)}. "
    f"Their options: --residual-scheme {{{','.join(SCHEMES)}}}, --resi-dual-scale C, "
    "--encoder-resi-dual-scale C, --decoder-resi-dual-scale C, --encoder-resi-dual-alpha A, "
    "--decoder-resi-dual-alpha A, plus fairseq's transformer options"
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

"""The residual schemes of ``residual_transformer``: one module per scheme, one registry line each.

Every part of the project (options and ``--help``, presets, the checkpoint check, the analysis tool, the
speed benchmark, the demo, the studies, the benchmark scripts and the results tables) reads its list of
schemes from :data:`SCHEMES` here: first the eight of the ResiDual paper's tables (Xie et al. 2023,
arXiv 2304.14802, tables 1-2) in their order, then the schemes published after it. To add a scheme: write ``schemes/<name>.py`` defining ``SCHEME``,
an instance of a :class:`~fairseq_residual.schemes.base.ResidualScheme` subclass with a new
``scheme_id`` and the module's name as its ``name``, and add the module's name to ``registry_order.py``.
The README's scheme tables are generated from the registry by :mod:`.docs` (``python -m fairseq_residual.schemes``).
Beside the schemes: :mod:`.base` (the scheme interface), :mod:`.registry_order`, :mod:`.docs`, and
:mod:`.admin_profile` (Admin's profile file and ``fairseq-residual-admin-profile``).
"""
from importlib import import_module

from .base import STACKS, ResidualScheme, SchemeOptions
from .registry_order import SCHEME_MODULES as _SCHEME_MODULES
from ..user_errors import SettingError, closest

SCHEMES = tuple(import_module(f"{__name__}.{module}").SCHEME for module in _SCHEME_MODULES)
#: The schemes' registry names, in table order.
SCHEME_NAMES = tuple(s.name for s in SCHEMES)
if SCHEME_NAMES != _SCHEME_MODULES:
    raise RuntimeError(f"each scheme must be registered under its module's name (registry_order.py): modules "
                       f"{_SCHEME_MODULES}, names {SCHEME_NAMES}")
#: The scheme a model gets when neither ``--residual-scheme`` nor its preset names one.
DEFAULT_SCHEME = "resi_dual"

_BY_NAME = {s.name: s for s in SCHEMES}
_BY_ID = {s.scheme_id: s for s in SCHEMES}
if len(_BY_NAME) != len(SCHEMES) or len(_BY_ID) != len(SCHEMES):
    raise RuntimeError("two residual schemes share a name or a scheme_id: each must be unique")


def get_scheme(name) -> ResidualScheme:
    """The scheme registered as ``name`` (a :class:`ResidualScheme` given instead is returned as it is).

    Raises:
        ValueError: no such scheme, naming the choices and the flag.
    """
    if isinstance(name, ResidualScheme):
        return name
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        close = closest(str(name).lower(), SCHEME_NAMES) if isinstance(name, str) else None
        raise SettingError(
            f"unknown residual scheme {name!r}{f' (did you mean {close}?)' if close else ''}: choose one of "
            f"{', '.join(SCHEME_NAMES)} (--residual-scheme / model.residual_scheme)"
        ) from None


def scheme_by_id(scheme_id: int) -> ResidualScheme:
    """The scheme whose checkpoint id (buffer ``residual_scheme_id``) is ``scheme_id``.

    Raises:
        ValueError: an id no registered scheme has (a checkpoint from a newer fairseq-residual).
    """
    try:
        return _BY_ID[scheme_id]
    except KeyError:
        raise SettingError(
            f"the checkpoint names residual scheme id {scheme_id}, which this fairseq-residual does "
            f"not know (known: {', '.join(f'{s.scheme_id}={s.name}' for s in SCHEMES)}); it was saved "
            f"by a newer version: upgrade fairseq-residual"
        ) from None


def stock_scheme(has_final_layer_norm: bool) -> str:
    """The scheme of a stack of fairseq's stock ``transformer`` (no ``residual_scheme_id`` buffer): Pre-LN
    iff the stack has a final LayerNorm, else Post-LN; the one place this rule lives (checkpoint loading,
    the analysis tool)."""
    return "pre_ln" if has_final_layer_norm else "post_ln"


def labels():
    """``{name: label}`` of every scheme, in table order (``{'post_ln': 'Post-LN', ...}``)."""
    return {s.name: s.label for s in SCHEMES}


def colors():
    """``{name: matplotlib colour}`` of every scheme: the one palette of every plot of the project."""
    return {s.name: s.color for s in SCHEMES}


__all__ = [
    "DEFAULT_SCHEME", "SCHEMES", "SCHEME_NAMES", "STACKS", "ResidualScheme", "SchemeOptions",
    "colors", "get_scheme", "labels", "scheme_by_id", "stock_scheme",
]

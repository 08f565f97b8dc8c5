"""Refuse to load the plugin a second time under another module name, before it registers anything.

fairseq's registries are process-wide: the plugin imported under two module names in one process (for
instance the installed ``fairseq_residual`` and a copy given as ``--user-dir /elsewhere/fairseq_residual2``,
which fairseq's own advice "rename the directory" for a non-unique ``--user-dir`` leads to) would register
``residual_transformer`` twice. fairseq then stops with a bare ``Cannot register duplicate model
architecture (residual_transformer)``, after half of the second copy's registrations went through. This
check names both copies and the fix instead.
"""
import os
import sys

from fairseq.models import MODEL_REGISTRY

MODEL_NAME = "residual_transformer"


class DuplicatePluginError(ImportError):
    """The plugin is already loaded in this process under another module name."""


def check_single_copy(package_name: str, package_file: str):
    """Raise :class:`DuplicatePluginError` if another copy of the plugin registered its model already.

    Args:
        package_name: the importing package's module name (``__name__`` of ``fairseq_residual``).
        package_file: its ``__init__.py`` path.
    """
    registered = MODEL_REGISTRY.get(MODEL_NAME)
    if registered is None:
        return
    other = registered.__module__.split(".")[0]
    if other == package_name:
        return
    other_file = getattr(sys.modules.get(other), "__file__", None) or "?"
    raise DuplicatePluginError(
        f"fairseq-residual is being loaded a second time, as module '{package_name}' from "
        f"{os.path.dirname(package_file)}, but module '{other}' from {os.path.dirname(other_file)} already "
        f"registered the model '{MODEL_NAME}' in this process. Load one copy only: drop the second "
        f"--user-dir (or common.user_dir) or point it at the same directory as the first, and do not "
        f"rename a copy of the plugin to work around fairseq's 'not globally unique' --user-dir error; "
        f"`pip uninstall fairseq-residual` if an installed copy gets in the way of a checkout"
    )

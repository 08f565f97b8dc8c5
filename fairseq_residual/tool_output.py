"""Quieter fairseq tools: the deprecation warnings hydra-core >= 1.1 prints about fairseq 0.12's own use of its
API, about 20 lines at the top of every ``fairseq-train``, ``-generate``, ``-interactive`` and ``-validate`` run,
are silenced in those tools. They concern fairseq's code (``fairseq/dataclass/initialize.py`` and
``fairseq/dataclass/utils.py``: ``hydra.experimental.initialize`` / ``compose``, ``strict=True``, no
``version_base``, the ``# @package _group_`` headers of fairseq's own config files, the schema named like its
config), not the user's: nothing in the command line can change them.

fairseq's ``models/wav2vec/wav2vec2_classification.py`` calls ``logging.basicConfig(level=logging.DEBUG)`` when
fairseq's models are imported, so fairseq-generate (which configures logging after that import) logs at DEBUG:
the root logger is set back to fairseq's ``LOGLEVEL`` (default INFO) in those tools.

torch's deprecation of ``torch.cuda.amp.autocast``, which fairseq's training step calls, is silenced in every
fairseq tool, fairseq-hydra-train included.

Only those messages, matched from their start, and only in the tools :func:`.user_errors.tool_name` names
(``fairseq-hydra-train`` is left alone: there the package-header warning may be about the user's own config
files); every other warning, Hydra's included, is printed as before. ``PYTHONWARNINGS`` and ``-W`` options set
before still apply to everything else.
"""
import logging
import os
import warnings

from .user_errors import in_hydra_train, running_tool

#: the start of each silenced message (``warnings.filterwarnings`` matches a message's start, ignoring case)
FAIRSEQ_HYDRA_DEPRECATIONS = (
    r"hydra\.experimental\.initialize\(\) is no longer experimental",
    r"hydra\.experimental\.compose\(\) is no longer experimental",
    r"\s*The version_base parameter is not specified",
    r"In '[^']*': Usage of deprecated keyword in package header '# @package _group_'",
    r"\s*'[^']*' is validated against ConfigStore schema with the same name",
    r"\s*The strict flag in the compose API is deprecated",
)


#: deprecation warnings about fairseq 0.12's own calls into torch, silenced in every fairseq tool (the training
#: step's ``torch.cuda.amp.autocast(...)`` in ``fairseq/tasks/fairseq_task.py``, once per run)
FAIRSEQ_TORCH_DEPRECATIONS = (r"\s*`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated",)


def install() -> None:
    """Silence :data:`FAIRSEQ_TORCH_DEPRECATIONS` in fairseq's command-line tools and fairseq-hydra-train, and
    :data:`FAIRSEQ_HYDRA_DEPRECATIONS` and set the root logger from DEBUG back to fairseq's ``LOGLEVEL`` (its tools'
    own default, INFO) in the tools but fairseq-hydra-train; a no-op elsewhere."""
    tool = running_tool()
    if tool is None and not in_hydra_train():
        return
    for message in FAIRSEQ_TORCH_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)
    if tool is None:  # fairseq-hydra-train: Hydra's warnings may be about the user's own config files
        return
    for message in FAIRSEQ_HYDRA_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    level = logging.getLevelName(os.environ.get("LOGLEVEL", "INFO").upper())
    if logging.root.level == logging.DEBUG and isinstance(level, int) and level > logging.DEBUG:
        logging.root.setLevel(level)

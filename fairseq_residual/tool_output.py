"""Quieter fairseq tools: the deprecation warnings hydra-core >= 1.1 prints about fairseq 0.12's own use of its
API, about 20 lines at the top of every ``fairseq-train``, ``-generate``, ``-interactive`` and ``-validate`` run,
are silenced in those tools. They concern fairseq's code (``fairseq/dataclass/initialize.py`` and
``fairseq/dataclass/utils.py``: ``hydra.experimental.initialize`` / ``compose``, ``strict=True``, no
``version_base``, the ``# @package _group_`` headers of fairseq's own config files, the schema named like its
config), not the user's: nothing in the command line can change them.

fairseq's ``models/wav2vec/wav2vec2_classification.py`` calls ``logging.basicConfig(level=logging.DEBUG)`` when
fairseq's models are imported, so fairseq-generate (which configures logging after that import) logs at DEBUG:
the root logger is set back to fairseq's ``LOGLEVEL`` (default INFO) in those tools.

torch's deprecation of ``torch.cuda.amp.autocast``, which fairseq's training step calls, its warning about the
``pin_memory=True`` fairseq's data iterators pass on a machine without a GPU, and its deprecation of the mixed
attention masks fairseq's attention passes are silenced in every fairseq tool, fairseq-hydra-train included.

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


#: warnings about fairseq 0.12's own calls into torch, silenced in every fairseq tool, each with its category: the
#: training step's ``torch.cuda.amp.autocast(...)`` (``fairseq/tasks/fairseq_task.py``, once per run), and the
#: ``pin_memory=True`` fairseq's data iterators always pass (``fairseq/data/iterators.py``), which torch warns
#: about on a machine without a GPU (once per data loader), and the decoder's causal float ``attn_mask`` beside a
#: boolean ``key_padding_mask`` that fairseq's ``MultiheadAttention`` hands to torch's fused attention
#: (``fairseq/modules/multihead_attention.py``, once per run)
FAIRSEQ_TORCH_WARNINGS = (
    (r"\s*`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated", FutureWarning),
    (r"'pin_memory' argument is set as true but no accelerator is found", UserWarning),
    (r"Support for mismatched key_padding_mask and attn_mask is deprecated", UserWarning),
)


def install() -> None:
    """Silence :data:`FAIRSEQ_TORCH_WARNINGS` in fairseq's command-line tools and fairseq-hydra-train, and
    :data:`FAIRSEQ_HYDRA_DEPRECATIONS` and set the root logger from DEBUG back to fairseq's ``LOGLEVEL`` (its tools'
    own default, INFO) in the tools but fairseq-hydra-train; a no-op elsewhere."""
    tool = running_tool()
    if tool is None and not in_hydra_train():
        return
    for message, category in FAIRSEQ_TORCH_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    if tool is None:  # fairseq-hydra-train: Hydra's warnings may be about the user's own config files
        return
    for message in FAIRSEQ_HYDRA_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    level = logging.getLevelName(os.environ.get("LOGLEVEL", "INFO").upper())
    if logging.root.level == logging.DEBUG and isinstance(level, int) and level > logging.DEBUG:
        logging.root.setLevel(level)

"""fairseq-residual: a fairseq user-dir plugin with Post-LN, Pre-LN and ResiDual Transformers.

Load it with ``--user-dir fairseq_residual`` (fairseq-train, -generate, -interactive, -validate) or
``common.user_dir=...`` (fairseq-hydra-train); it registers the model ``residual_transformer`` and its
``--arch`` presets. One module per concern: ``config`` (options and schemes), ``layers`` (ResiDual
layers), ``encoder_decoder`` (stacks), ``model`` (registration and presets), ``checkpoint_compat``
(loading fairseq checkpoints under torch >= 2.6).
"""
from . import checkpoint_compat, config, encoder_decoder, layers, model  # noqa: F401

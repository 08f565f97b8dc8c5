"""fairseq-residual: a fairseq user-dir plugin with Post-LN, Pre-LN and ResiDual Transformers.

Load it with ``--user-dir fairseq_residual`` (fairseq-train, -generate, -interactive, -validate) or
``common.user_dir=...`` (fairseq-hydra-train); it registers the model ``residual_transformer`` and its
``--arch`` presets. One module per concern: ``config`` (options and schemes), ``layers`` (ResiDual
layers), ``encoder_decoder`` (stacks), ``model`` (registration and presets), ``checkpoint_compat``
(loading fairseq checkpoints under torch >= 2.6), ``tasks`` (the ``translation_with_grad_norms``
task). ``analyze`` (the ``fairseq-residual-analyze`` command) registers nothing: not imported here.
"""
from . import checkpoint_compat, cli_help, config, encoder_decoder, layers, model, tasks  # noqa: F401

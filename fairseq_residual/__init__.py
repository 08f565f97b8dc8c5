"""fairseq-residual: a fairseq user-dir plugin with selectable residual schemes for the Transformer.

Load it with ``--user-dir fairseq_residual`` (fairseq-train, -generate, -interactive, -validate) or
``common.user_dir=...`` (fairseq-hydra-train); it registers the model ``residual_transformer`` and its
``--arch`` presets. One module per concern: ``schemes`` (one module per residual scheme behind one
registry; ``schemes/admin_profile`` is Admin's profile file and its command line), ``residual`` (the
residual protocol), ``stream_ops`` (the multi-stream connections' projection and update with closed-form
backwards), ``config`` (options), ``norms`` (``--norm``: RMSNorm, DyT or Derf in place of every LayerNorm),
``layers`` (the protocol's encoder and decoder layers), ``encoder_decoder`` (stacks), ``model`` (registration and presets), ``checkpoint_compat`` (loading
fairseq checkpoints under torch >= 2.6), ``checkpoint_safety`` (kill-safe saving and resuming), ``tasks`` (the
``translation_with_grad_norms`` task), ``lr_scheduler`` (``inverse_sqrt_nowarmup``, T-Fixup's schedule),
``optim_groups`` (per-parameter optimizer overrides, e.g. no weight decay, for every fairseq optimizer),
``optimizer_order`` (resumed optimizer state onto the parameters of the same name), ``optimizer_step`` (the
scheme's hook after every optimizer step: nGPT's renormalisation), ``training_checks`` (the scheme's check of the
training settings, which fairseq-hydra-train's model config lacks), ``data_checks`` (a missing or wrong data
directory named with its fix), ``pruning`` (loading
models pruned with ``--*-layers-to-keep``, also trained pruned),
``process_group`` (gloo process groups end before the interpreter shuts down, so that a finished torchrun run
exits 0), ``precision`` (warns of mixed precision a run without CUDA does not honour: ``--amp`` trains in fp32,
``--fp16`` fails), ``cli_help`` (``--help`` lists the presets), ``paper_results`` (the ResiDual paper's numbers,
``paper_results.json``).
``analyze`` (the ``fairseq-residual-analyze`` command) registers nothing: not imported here. The study
tooling is not part of the package: it runs from the checkout (``scripts/residual_studies``).
``registration_guard`` refuses a second copy of the plugin in one process; ``user_errors`` ends fairseq's tools on
the plugin's errors about the user's input with one message instead of a traceback; ``tool_output`` silences
Hydra's deprecation warnings about fairseq's own code in those tools.
"""
from .registration_guard import check_single_copy

check_single_copy(__name__, __file__)  # before any registration: one copy of the plugin per process

from . import (  # noqa: E402,F401
    checkpoint_compat, checkpoint_safety, cli_help, config, data_checks, encoder_decoder, layers, lr_scheduler, model,
    optim_groups, optimizer_step, precision, process_group, schemes, tasks, tool_output, training_checks, user_errors,
)

user_errors.install()  # fairseq's tools end on a wrong input with one message, not a traceback
tool_output.install()  # ... and do not print Hydra's deprecation warnings about fairseq's own code

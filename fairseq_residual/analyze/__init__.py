"""``fairseq-residual-analyze``: why depth breaks, measured per layer.

The ResiDual paper (Xie et al. 2023, arXiv 2304.14802) argues that Post-LN's gradients vanish in the
lower layers and that Pre-LN's layer outputs collapse into each other, while ResiDual avoids both.
This tool measures both effects, and the fp16 range of ResiDual's dual stream, on a trained
checkpoint or a freshly initialised model, over K batches of a binarized data set::

    fairseq-residual-analyze data-bin/ding-de-en --arch residual_transformer_iwslt_de_en \\
        --residual-scheme all --layers 24 --embed-dim 64 --ffn-dim 128 --heads 4 \\
        --batches 2 --output-dir analysis/
    fairseq-residual-analyze data-bin/ding-de-en --checkpoint run/checkpoint_best.pt --output-dir a/

What is measured (``analysis.json``, and one PNG per quantity with every model overlaid):

* ``param_grad_norm``: the L2 norm of the gradient of each encoder / decoder layer's parameters.
  The loss is fairseq's criterion (``label_smoothed_cross_entropy``, or ``cross_entropy`` with
  ``--loss cross_entropy``) summed over the K batches and divided by their number of target tokens,
  exactly as fairseq-train normalises an update of ``--update-freq K`` before clipping. The model is
  in train mode with every dropout (and LayerDrop) set to 0, unless ``--keep-dropout``.
  ``grad_norm_low_top`` = layer 1's norm / the top layer's norm (Post-LN's vanishing gradient
  shows as a ratio well below 1).
* ``sublayer_output_grad_norm``: the L2 norm of the gradient with respect to each sub-layer's output
  ``h`` (self-attention, cross-attention, FFN; the branch that is added to the residual stream),
  taken over all positions of the K batches (T x B x C each). Forward hooks on the sub-modules
  ``self_attn``, ``encoder_attn`` and ``fc2`` (fairseq's names) capture the output and
  ``retain_grad`` keeps its gradient, so the same code serves every scheme. With dropout off
  this output *is* the branch ``h``; with ``--keep-dropout`` it is the output before the dropout.
* ``cosine_consecutive``: for l = 1 .. L-1, the mean over non-padding token positions of
  ``cos(y_l, y_{l+1})``, where ``y_l`` is layer l's output (the residual stream before any final
  LayerNorm; for ResiDual the Post-LN stream ``x_a``). Values near 1 mean the layers hardly change
  the representation (Pre-LN's collapse). The layer output is what the stack reports after the layer
  (fairseq's ``inner_states``; for a scheme of the residual protocol its stack residual's ``view`` of
  the state); ``cosine_consecutive_streams`` gives the same for every extra stream the scheme names
  (``cosine_consecutive_dual``: ResiDual's dual stream ``x_d``).
* ``stream_cosine`` and ``mixing_distance`` (schemes with several residual streams): after each layer the
  mean pairwise cosine between the streams (hyper-connections' and mHC's h1..hn; for two-stream schemes the
  view and the extra stream: ResiDual's x_a and x_d, SiameseNorm's x and y), and for hyper-connections and
  mHC the distance ``||M - I||_F / sqrt(n)`` of the layer's effective stream mixing M (the product of its
  sub-layers' mixings, h' = M h, averaged over the real tokens) from the identity: streams that stay alike
  with a mixing near the identity are the "stream collapse" of arXiv 2606.03483. Plot ``streams.png``.
* ``dual_stream`` (the stream a scheme's stack residual declares ranged,
  :meth:`~fairseq_residual.residual.StackResidual.ranged_stream`: ResiDual's ``x_d``, the only one today;
  None for the other schemes): ``max_abs``, the largest ``|x_d|`` after each layer over all
  positions (padding included: an overflow there is just as fatal), the ``headroom`` to fp16's
  largest value 65504 (``config.FP16_MAX``), and ``safe_scale``, the ``--resi-dual-scale`` this rule
  recommends:

      c_safe = the largest number of the 1-2-5 series 1, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, ...
               with c_safe * M <= safety * 65504,

  where ``M`` is the largest ``|x_d|`` with c = 1 (the measured value divided by the model's c; the
  dual stream is linear in c) and ``safety`` is ``--fp16-safety`` (default 0.1: a factor 10 of room
  for the growth of ``x_d`` during training, for longer sentences and other batches). A smaller c
  does not change the model's function, since ``LN_final(c * x_d) = LN_final(x_d)`` (its eps is
  1e-7 * c^2); ``ln_eps_relative`` = 1e-7 / (the smallest per-token variance of the top layer's ``x_d``
  at c = 1) says how much that eps weighs at all (it should be far below 1e-3). Measured on a fresh
  model, ``M`` is a lower bound of what training produces: run the tool on a checkpoint for a
  number that reflects training.
* ``running_sums`` (every scheme): the largest magnitude over the forward passes of every running sum
  (:class:`.ranges.RunningSums`: every LayerNorm input and every tensor the residual objects return,
  padding included), the site where it was seen and ``fp16_headroom`` = 65504 / it; the summary names a
  model whose headroom is below ``1 / --fp16-safety`` (below 1: that sum overflows fp16).

Bad input (a missing checkpoint, a checkpoint of another scheme than ``--residual-scheme``, a
missing data directory or an empty subset) ends with one message naming the problem and the fix,
and exit code 2.

One module per concern: :mod:`.loading` (input checks, models, batches), :mod:`.measure` (the
measurement: :class:`~.measure.LayerStatistics` registers its hooks, accumulates batches and returns
the result), :mod:`.plots` (the figures) and :mod:`.cli` (the command line).
"""
from .cli import build_parser, cli_main, main, run, summary_table
from .common import (
    ALL, DEFAULT_ARCH, HOOKED_MODULE, PKG_DIR, POST_LN, PRE_LN, PROG, RESI_DUAL, STACKS, SUBLAYERS,
    AnalyzeError,
)
from .loading import (
    build_criterion, build_fresh_model, check_data, checkpoint_scheme, fairseq_model_argv, load_batches,
    load_checkpoint_model,
)
from .measure import (
    LayerStatistics, analyze_model, disable_dropout, model_scheme, safe_dual_scale, scale_ladder,
)
from .plots import write_plots

__all__ = [
    "ALL", "AnalyzeError", "DEFAULT_ARCH", "HOOKED_MODULE", "PKG_DIR", "POST_LN", "PRE_LN", "PROG",
    "RESI_DUAL", "STACKS", "SUBLAYERS", "LayerStatistics", "analyze_model", "disable_dropout",
    "model_scheme", "safe_dual_scale", "scale_ladder", "build_criterion", "build_fresh_model",
    "check_data", "checkpoint_scheme", "fairseq_model_argv", "load_batches",
    "load_checkpoint_model", "build_parser", "cli_main", "main", "run", "summary_table",
    "write_plots",
]

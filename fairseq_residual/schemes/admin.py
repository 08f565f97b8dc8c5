"""Admin (Liu et al. 2020, "Understanding the Difficulty of Training Transformers", EMNLP, arXiv 2004.08249,
the Admin initialisation): ``x = LN(omega_k * x + drop(F_k(x)))`` after every sub-layer k.

``omega_k`` is a trainable vector of width d per sub-layer (self-attention and FFN in the encoder;
self-attention, cross-attention and FFN in the decoder), filled with one profiled scalar at the start of
training, as LiyuanLucasLiu/Transformer-Clinic computes it (``fairseq/fairseq/modules/transformer_layer.py``,
``--init-type adaptive-profiling`` then ``adaptive``). Per stack, sub-layer by sub-layer in order,
with a running value r starting at 1::

    omega_k = r                                     (all d entries)
    out_k   = LN(omega_k * x_k + F_k(x_k))          (computed with that omega_k)
    r       = sqrt(Var[omega_k * x_k] + Var[F_k(x_k)])

on one training batch in training mode (dropout active: F_k is the dropped-out branch output), Var the
population variance over every element of the T x B x d tensor, padding included; x_1 is the stack's
embedding output. No stack LayerNorm. Other weights: fairseq 0.12's initialisation (the reference's
fairseq 0.9 fork draws fc1/fc2 with xavier).

Over the residual protocol: :class:`AdminResidual` per sub-layer holds ``omega``
(``{encoder,decoder}.layers.i.{self_attn,encoder_attn,ffn}_residual.omega``; the reference's names
``attention_ratio_change``, ``self_ratio_change``, ``encoder_ratio_change``, ``fc_ratio_change``, which
checkpoints of earlier versions of this plugin use, are renamed on load), :class:`AdminStack` per stack
holds the buffers ``profiled`` (0 until profiled) and ``profile`` (the profiled scalars, k = 1..2N resp.
1..3M).

Profiling is the scheme's training hook (:meth:`Admin.training_hook`): before the first training forward
of an unprofiled model it runs a profiling forward of that batch under ``no_grad`` (every layer, layer-drop
off, so that every sub-layer gets its omega), broadcasts rank 0's omegas when ``torch.distributed`` is
initialised (every rank uses one profile), sets the buffers and logs one line per stack; the normal
forward follows. The buffers are saved in checkpoints, so a resumed run never re-profiles (and logs that
it does not). The reference instead runs a separate profiling process that writes ``profile.ratio.init``
and exits; ``--admin-profile FILE`` reads that format ("k r" per line, encoder k = 1..2N then decoder
k = 1..3M) at model build, and ``fairseq-residual-admin-profile CHECKPOINT [OUT]`` writes it from
a checkpoint's profile (both in :mod:`.admin_profile`).

fp16: fairseq's ``--fp16`` / ``--bf16`` optimiser keeps an fp32 copy of the weights that it builds before
the first batch and copies back after every step, so an omega profiled at the first batch would be
overwritten. Automatic profiling is therefore refused with them (when the options are visible to the
model, i.e. ``fairseq-train``); ``--admin-profile FILE`` (applied at build, before that copy),
``--amp`` or ``--memory-efficient-fp16`` work. ``--memory-efficient-bf16`` keeps the profile too, but without
an fp32 copy a bf16 weight takes no update below half its spacing (2^-9 of its size): the omegas stay at their
profile unless the learning rate is above about 4e-3.
"""
import logging
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn

from ..pruning import held_layers
from ..residual import NORM_OUTPUT, StackResidual, SublayerResidual, with_main
from .admin_profile import main, read_profile  # noqa: F401  (main: python -m fairseq_residual.schemes.admin)
from .base import STACKS, Option, ResidualScheme, setting
from ..user_errors import SettingError

logger = logging.getLogger(__name__)

#: the reference's omega names per sub-layer kind (checkpoints of earlier versions of this plugin)
REFERENCE_NAMES = {
    "encoder": {"attention_ratio_change": "self_attn", "fc_ratio_change": "ffn"},
    "decoder": {"self_ratio_change": "self_attn", "encoder_ratio_change": "encoder_attn",
                "fc_ratio_change": "ffn"},
}


@dataclass(frozen=True)
class AdminOptions:
    """Admin's options of one model.

    Attributes:
        profile: path of a profile in the reference's ``profile.ratio.init`` format, or None
            (profile automatically on the first training batch).
    """

    profile: Optional[str] = None


class _Profiler:
    """Running state of the profiling forward of one stack (the reference's global ``*_ratio``)."""

    def __init__(self):
        self.r = 1.0
        self.ratios: List[float] = []

    def step(self, omega: Tensor, x: Tensor, h: Tensor):
        """Set ``omega = r`` and advance ``r = sqrt(Var[omega*x] + Var[h])`` (population variances)."""
        omega.data.fill_(self.r)
        self.ratios.append(self.r)
        var_in = (omega * x).double().var(unbiased=False).item()
        var_out = h.double().var(unbiased=False).item()
        self.r = math.sqrt(var_in + var_out)


class AdminResidual(SublayerResidual):
    """``x = LN(omega * x + h)``, ``h = drop(F(x))``, ``omega`` a trainable vector of width C (init 1,
    profiled before training).

    Args:
        site: the sub-layer.
    """

    NORM = NORM_OUTPUT

    def __init__(self, site):
        super().__init__(site)
        self.omega = nn.Parameter(torch.ones(site.embed_dim))
        self.profiling = False

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        if self.profiling:
            self._profile(state[0], out)
        return with_main(state, state[0] * self.omega + out)

    @torch.jit.unused
    def _profile(self, x: Tensor, out: Tensor) -> None:
        """Profiling forward only: set ``omega`` from the stack's running value (the reference's recursion)."""
        self.profiler.step(self.omega, x, out)


class AdminStack(StackResidual):
    """One stream (no stack LayerNorm) and the stack's profile: buffers ``profiled`` (0/1) and ``profile``
    (one scalar per sub-layer, in order)."""

    def __init__(self, stack: str, num_layers: int, embed_dim: int, per_layer: int):
        super().__init__(stack, num_layers, embed_dim)
        self.register_buffer("profiled", torch.tensor(0, dtype=torch.long))
        self.register_buffer("profile", torch.zeros(per_layer * num_layers))


# ---------------------------------------------------------------------------------------------
# the profile in the model: applying, measuring, sharing, logging (its file: admin_profile.py)
# ---------------------------------------------------------------------------------------------


def _admin_residuals(stack) -> List[AdminResidual]:
    """The Admin residuals of every layer of ``stack`` in sub-layer order (indexing the layers: iterating a
    LayerDropModuleList in training mode would skip some)."""
    layers = [stack.layers[i] for i in range(len(stack.layers))]
    return [m for layer in layers for m in layer.modules() if isinstance(m, AdminResidual)]


def omega_parameters(stack) -> List[nn.Parameter]:
    """The omegas of ``stack`` (an encoder or decoder of ``residual_transformer``) in sub-layer order,
    k = 1..2N (encoder) or 1..3M (decoder)."""
    return [m.omega for m in _admin_residuals(stack)]


def apply_profile(stack, ratios) -> None:
    """Fill every omega of ``stack`` with its profiled scalar and mark the stack profiled."""
    with torch.no_grad():
        for omega, r in zip(omega_parameters(stack), ratios):
            omega.fill_(float(r))
        prof = stack.residual.profile
        prof.copy_(torch.tensor([float(r) for r in ratios], dtype=prof.dtype, device=prof.device))
        stack.residual.profiled.fill_(1)


def _sync_profile(model) -> None:
    """Broadcast rank 0's omegas and profile to every rank (no-op without torch.distributed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    tensors = [model.encoder.residual.profile, model.decoder.residual.profile]
    for stack in (model.encoder, model.decoder):
        tensors += [p.data for p in omega_parameters(stack)]
    flat = torch.cat([t.reshape(-1).to(torch.float32) for t in tensors])
    dist.broadcast(flat, src=0)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset: offset + t.numel()].view_as(t))
        offset += t.numel()


def profile_model(model, net_input) -> None:
    """Run the profiling forward of ``model`` on one batch (``model(**net_input)``) under no_grad, in the
    model's current mode with every layer (layer-drop off), filling every omega as the reference's
    recursion does."""
    from fairseq.modules import LayerDropModuleList

    saved = []
    for stack_name in STACKS:
        stack = getattr(model, stack_name)
        profiler = _Profiler()
        for res in _admin_residuals(stack):
            res.profiler, res.profiling = profiler, True
        if isinstance(stack.layers, LayerDropModuleList):
            saved.append((stack.layers, stack.layers.p))
            stack.layers.p = 0.0
    try:
        with torch.no_grad():
            model.forward(**net_input)
    finally:
        for layers, p in saved:
            layers.p = p
        ratios = {}
        for stack_name in STACKS:
            residuals = _admin_residuals(getattr(model, stack_name))
            ratios[stack_name] = residuals[0].profiler.ratios if residuals else []
            for res in residuals:
                res.profiling = False
                del res.profiler
    for stack_name in STACKS:
        apply_profile(getattr(model, stack_name), ratios[stack_name])


def is_profiled(model) -> bool:
    return bool(model.encoder.residual.profiled) and bool(model.decoder.residual.profiled)


def _log_profile(model, how: str) -> None:
    for stack_name in STACKS:
        profile = getattr(model, stack_name).residual.profile
        values = " ".join(f"{v:.4f}" for v in profile.tolist())
        logger.info(f"Admin omegas of the {stack_name} ({how}), sub-layers 1..{profile.numel()}: {values}")


def _warn_unprofiled(model) -> None:
    """Warn (once per model) that an Admin model that never trained runs with every omega = 1."""
    if is_profiled(model) or getattr(model, "_admin_warned", False):
        return
    # A warning, not an error: evaluating or decoding a model that never trained is legitimate
    # (fairseq-generate smoke tests, the analysis tool at init, decoding tests) and computes a
    # well-defined network (Post-LN with every omega = 1); it just is not the paper's Admin model.
    logger.warning(
        "Admin model used in eval mode before it was profiled: every omega is 1 (plain Post-LN "
        "with extra weights); train at least one update (the first training batch profiles it) "
        "or build it with --admin-profile FILE"
    )
    model._admin_warned = True


class Admin(ResidualScheme):
    name = "admin"
    label = "Admin"
    scheme_id = 4
    builds_on = "post_ln"
    color = "tab:orange"
    update = "x = LN(omega*x + drop(F(x))), one trainable omega of width d per sub-layer"
    output = "x"
    init = ("`omega_k` profiled on the first training batch: `omega_1 = 1`, "
            "`omega_(k+1)^2 = omega_k^2 Var[x_k] + Var[F_k(x_k)]` per stack")
    source = "Liu et al. 2020, arXiv 2004.08249 (Admin)"
    reference = (
        "LiyuanLucasLiu/Transformer-Clinic `fairseq/fairseq/modules/transformer_layer.py` "
        "(`--init-type adaptive-profiling` / `adaptive`: one training batch with dropout and padding, where the "
        "paper states accumulated variances)"
    )
    recipe = ("profiling is automatic: the first training batch of a new run (before update 1) sets every omega "
              "with the reference's recursion (every layer profiled, layer-drop off while it profiles), on one rank, "
              "broadcast to all; the profile is stored in the checkpoint (buffers `residual.profile`), never redone "
              "on resume, and logged. `--admin-profile FILE` reads a profile in the reference's `profile.ratio.init` "
              "format instead (a file of another depth is refused, naming it); "
              "`fairseq-residual-admin-profile CHECKPOINT [OUT]` writes one. IWSLT14: RAdam/Adam (0.9, 0.98), lr "
              "7e-4, warm-up 6000, dropout 0.3, weight decay 1e-4.")
    fp16_advice = ("without `--admin-profile FILE`, use `--amp` or `--memory-efficient-fp16` (fairseq's fp32 master "
                   "copy would overwrite the omegas profiled on the first batch); its sums are renormalised after every "
                   "sub-layer")
    final_norm_eps = None
    norm_refusals = dict.fromkeys(("dyt", "derf"), (
        "the profiled omegas, omega_(k+1)^2 = omega_k^2 Var[x_k] + Var[F_k(x_k)], rest on each LN(omega x + F(x)) "
        "bringing its sum back to unit variance (arXiv 2004.08249); DyT's tanh(a x) and Derf's erf(a x + s) do "
        "not, so the recursion would not describe the model"))
    OPTIONS = (
        Option("admin_profile", str, None, "read the omegas from FILE (the reference's profile.ratio.init "
               "format, 'k r' per line, encoder k = 1..2N then decoder k = 1..3M) instead of profiling the "
               "first training batch; write one with fairseq-residual-admin-profile CHECKPOINT OUT",
               metavar="FILE", default_text="none: profile the first training batch"),
    )

    def given_options(self, args, typed=frozenset()):
        return ["--admin-profile"] if getattr(args, "admin_profile", None) or "admin_profile" in typed else []

    def validate(self, args):
        pass  # a path: checked when it is read (read_profile)

    def options(self, args):
        return AdminOptions(profile=getattr(args, "admin_profile", None) or None)

    def check_training(self, cfg, model):
        """Refuse fairseq's fp32 master copy of the weights without ``--admin-profile``: made before the first batch
        and copied back after every step, it would overwrite the omegas profiled on that batch.

        Raises:
            ValueError: ``--fp16`` / ``--bf16`` (``common.fp16`` / ``common.bf16``) without ``--memory-efficient-*``
                and without ``--admin-profile``, naming the alternatives.
        """
        super().check_training(cfg, model)
        if getattr(model, "admin_profile_path", None):
            return
        for flag in ("fp16", "bf16"):
            if setting(cfg, "common", flag, False) and not setting(cfg, "common", f"memory_efficient_{flag}", False):
                others = ("use --amp or --memory-efficient-fp16" if flag == "fp16" else
                          "use memory-efficient bf16 (fairseq-hydra-train: common.memory_efficient_bf16=true), "
                          "which keeps the profile but, with no fp32 copy, applies no "
                          "update smaller than 2^-9 of a bf16 weight: omegas of 1-2 stay at their profile unless "
                          "the learning rate is above about 4e-3")
                raise SettingError(
                    f"--{flag} (common.{flag}) keeps an fp32 copy of the weights made before the first batch, which "
                    f"would overwrite the omegas Admin profiles on that batch: profile once in fp32 (train 1 "
                    f"update, then fairseq-residual-admin-profile CHECKPOINT profile.ratio.init) "
                    f"and pass --admin-profile profile.ratio.init, or {others}"
                )

    def sublayer_residual(self, cfg, site):
        return AdminResidual(site)

    def stack_residual(self, cfg, stack, num_layers, embed_dim):
        if stack == "decoder" and cfg.no_cross_attention:
            raise SettingError(
                "--residual-scheme admin needs the decoder's cross-attention (its profile has three "
                "sub-layers per decoder layer): drop --no-cross-attention or use another scheme"
            )
        return AdminStack(stack, num_layers, embed_dim, 2 if stack == "encoder" else 3)

    def initialize(self, model, options):
        """Apply ``--admin-profile`` (:attr:`AdminOptions.profile`; when its file exists: a missing file fails at the
        first training batch, so that a checkpoint still loads for generation where the file is gone)."""
        path = options.params.profile
        model.admin_profile_path = path
        if path is not None and os.path.exists(path):
            enc, dec = read_profile(path, len(model.encoder.layers), len(model.decoder.layers))
            apply_profile(model.encoder, enc)
            apply_profile(model.decoder, dec)
            logger.info(f"Admin omegas read from --admin-profile {path}")

    needs_training_hook = True

    def warn_before_hook(self, model):
        _warn_unprofiled(model)

    def training_hook(self, model, net_input):
        """Before the first training forward: profile the batch (unless the model is profiled: from the
        checkpoint or ``--admin-profile``), broadcast rank 0's profile, log it."""
        if is_profiled(model):
            logger.info("Admin omegas already profiled (profiled=1, from the checkpoint or --admin-profile): "
                        "not re-profiling")
            _log_profile(model, "kept")
            return
        path = getattr(model, "admin_profile_path", None)
        if path is not None:  # --admin-profile whose file was missing at build: fail before any update
            read_profile(path, len(model.encoder.layers), len(model.decoder.layers))
        profile_model(model, net_input)
        _sync_profile(model)
        _log_profile(model, "profiled on the first training batch")

    def upgrade_state_dict(self, state_dict, prefix, stack, options):
        """Rename the reference-named omegas and the stack buffers of earlier versions of this plugin; keep
        the profile of the layers a pruned model (``--*-layers-to-keep``) holds."""
        names = REFERENCE_NAMES[stack]
        pattern = re.compile(rf"^{re.escape(prefix)}layers\.(\d+)\.({'|'.join(names)})$")
        for key in list(state_dict):
            m = pattern.match(key)
            if m:
                state_dict[f"{prefix}layers.{m.group(1)}.{names[m.group(2)]}_residual.omega"] = state_dict.pop(key)
        for old, new in (("admin_profile", "residual.profile"), ("admin_profiled", "residual.profiled")):
            if prefix + old in state_dict:
                state_dict[prefix + new] = state_dict.pop(prefix + old)
        profile, kept = state_dict.get(prefix + "residual.profile"), options.kept(stack)
        # a checkpoint of the whole stack (not one trained pruned, which holds only the kept layers' profile)
        whole = held_layers(state_dict, prefix) == list(range(options.depth(stack)))
        if profile is not None and kept and len(kept) < options.depth(stack) and whole:
            per_layer = profile.numel() // options.depth(stack)
            state_dict[prefix + "residual.profile"] = profile.view(-1, per_layer)[list(kept)].reshape(-1)


SCHEME = Admin()


if __name__ == "__main__":
    sys.exit(main())

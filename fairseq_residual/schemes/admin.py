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
embedding output. Parameter names are the reference's: ``encoder.layers.i.attention_ratio_change``,
``encoder.layers.i.fc_ratio_change``, ``decoder.layers.i.self_ratio_change``,
``decoder.layers.i.encoder_ratio_change``, ``decoder.layers.i.fc_ratio_change``. No stack LayerNorm.
Other weights: fairseq 0.12's initialisation (the reference's fairseq 0.9 fork draws fc1/fc2 with xavier).

Profiling is one command: the model holds buffers ``{encoder,decoder}.admin_profiled`` (0 until profiled)
and ``{encoder,decoder}.admin_profile`` (the profiled scalars, k = 1..2N resp. 1..3M). The first forward
in training mode of an unprofiled model first runs a profiling forward on that batch under ``no_grad``,
broadcasts rank 0's omegas when ``torch.distributed`` is initialised (every rank uses one profile), sets
the buffers, logs one line per stack, then runs the normal forward. The buffers are saved in checkpoints,
so a resumed run never re-profiles (and logs that it does not). The reference instead runs a separate
profiling process that writes ``profile.ratio.init`` and exits; ``--admin-profile FILE`` reads that
format ("k r" per line, encoder k = 1..2N then decoder k = 1..3M) at model build, and
``python -m fairseq_residual.schemes.admin CHECKPOINT [OUT]`` writes it from a checkpoint's profile.

fp16: fairseq's ``--fp16`` / ``--bf16`` optimiser keeps an fp32 copy of the weights that it builds before
the first batch and copies back after every step, so an omega profiled at the first batch would be
overwritten. Automatic profiling is therefore refused with them (when the options are visible to the
model, i.e. ``fairseq-train``); ``--admin-profile FILE`` (applied at build, before that copy),
``--amp`` or ``--memory-efficient-fp16`` work.
"""
import logging
import math
import os
import sys
from dataclasses import dataclass
from typing import List, Optional

import torch
from torch import Tensor, nn

from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from ..layers import DecoderSublayers, EncoderSublayers, additive_attn_mask, refuse_decoder_extras
from .base import STACKS, ResidualScheme

logger = logging.getLogger(__name__)

#: omega parameters of one layer, in sub-layer order (the reference's names).
OMEGAS = {
    "encoder": ("attention_ratio_change", "fc_ratio_change"),
    "decoder": ("self_ratio_change", "encoder_ratio_change", "fc_ratio_change"),
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


class _AdminResidual:
    """``omega * x + h``, profiling omega first while the stack's profiling forward runs."""

    admin_profiler: Optional[_Profiler] = None

    def admin_residual(self, omega: Tensor, x: Tensor, h: Tensor) -> Tensor:
        """Args: omega [C]; x the sub-layer input and h its dropped-out output, T x B x C."""
        if self.admin_profiler is not None:
            self.admin_profiler.step(omega, x, h)
        return x * omega + h


class AdminEncoderLayer(_AdminResidual, EncoderSublayers, TransformerEncoderLayerBase):
    """fairseq's Post-LN encoder layer with ``x = LN(omega * x + h)`` for self-attention and FFN.

    Args:
        cfg: fairseq ``TransformerConfig`` (``cfg.encoder.normalize_before`` must be False).
    """

    def __init__(self, cfg):
        if cfg.encoder.normalize_before:
            raise ValueError("Admin encoder layers need encoder.normalize_before=False")
        super().__init__(cfg, return_fc=False)
        self.attention_ratio_change = nn.Parameter(torch.ones(self.embed_dim))
        self.fc_ratio_change = nn.Parameter(torch.ones(self.embed_dim))

    def forward(self, x: Tensor, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        """x: T x B x C; encoder_padding_mask: B x T (True at padding) or None. Returns T x B x C."""
        h = self.self_attn_sublayer(x, encoder_padding_mask, additive_attn_mask(attn_mask, x))
        x = self.self_attn_layer_norm(self.admin_residual(self.attention_ratio_change, x, h))
        h = self.ffn_sublayer(x)
        return self.final_layer_norm(self.admin_residual(self.fc_ratio_change, x, h))


class AdminDecoderLayer(_AdminResidual, DecoderSublayers, TransformerDecoderLayerBase):
    """fairseq's Post-LN decoder layer with ``x = LN(omega * x + h)`` for its three sub-layers.

    Args:
        cfg: fairseq ``TransformerConfig``; NormFormer options and ``--cross-self-attention`` are refused.
        no_encoder_attn: refused (Admin's decoder profile has three sub-layers per layer).
    """

    def __init__(self, cfg, no_encoder_attn=False):
        if cfg.decoder.normalize_before:
            raise ValueError("Admin decoder layers need decoder.normalize_before=False")
        refuse_decoder_extras(cfg, "admin")
        if no_encoder_attn:
            raise ValueError(
                "--residual-scheme admin needs the decoder's cross-attention (its profile has three "
                "sub-layers per decoder layer): drop --no-cross-attention or use another scheme"
            )
        super().__init__(cfg, no_encoder_attn=False)
        self.self_ratio_change = nn.Parameter(torch.ones(self.embed_dim))
        self.encoder_ratio_change = nn.Parameter(torch.ones(self.embed_dim))
        self.fc_ratio_change = nn.Parameter(torch.ones(self.embed_dim))

    def forward(
        self,
        x: Tensor,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state=None,
        prev_self_attn_state=None,
        prev_attn_state=None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        """fairseq's decoder-layer call; returns ``(x [T x B x C], cross-attention or None, None)``."""
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("Admin decoder layers take their attention state from incremental_state")
        if need_head_weights:
            need_attn = True
        h = self.self_attn_sublayer(x, incremental_state, self_attn_mask, self_attn_padding_mask)
        x = self.self_attn_layer_norm(self.admin_residual(self.self_ratio_change, x, h))
        attn: Optional[Tensor] = None
        if encoder_out is not None:
            h, attn = self.cross_attn_sublayer(
                x, encoder_out, encoder_padding_mask, incremental_state, need_attn, need_head_weights
            )
            x = self.encoder_attn_layer_norm(self.admin_residual(self.encoder_ratio_change, x, h))
        h = self.ffn_sublayer(x)
        x = self.final_layer_norm(self.admin_residual(self.fc_ratio_change, x, h))
        return x, attn, None


# ---------------------------------------------------------------------------------------------
# the profile: reading, writing, applying, measuring
# ---------------------------------------------------------------------------------------------


def omega_parameters(stack) -> List[nn.Parameter]:
    """The omegas of ``stack`` (an encoder or decoder of ``residual_transformer``) in sub-layer order,
    k = 1..2N (encoder) or 1..3M (decoder)."""
    return [getattr(layer, name) for layer in stack.layers for name in OMEGAS[stack.stack]]


def _depth_of(ks: List[int]) -> str:
    """Describe the model a list of profile indices belongs to ('6 encoder and 6 decoder layers')."""
    runs, run = [], 0
    for k in ks:
        if k == 1 and run:
            runs.append(run)
            run = 0
        run += 1
    runs.append(run)
    if len(runs) == 2 and runs[0] % 2 == 0 and runs[1] % 3 == 0:
        return f"{runs[0] // 2} encoder and {runs[1] // 3} decoder layers"
    return "indices " + ", ".join(f"1..{n}" for n in runs)


def read_profile(path: str, encoder_layers: int, decoder_layers: int):
    """Read a profile in the reference's ``profile.ratio.init`` format.

    Returns:
        ``(encoder ratios [2N], decoder ratios [3M])``, lists of floats.

    Raises:
        FileNotFoundError: no such file, naming the fix.
        ValueError: a malformed line, a non-positive value, or a profile of another depth (wrong number
            of lines or indices), naming the file, the depth it fits and the fix.
    """
    n_enc, n_dec = 2 * encoder_layers, 3 * decoder_layers
    fix = (
        "drop --admin-profile (the first training batch then profiles the model), or pass the profile "
        f"of a {encoder_layers}+{decoder_layers}-layer model (write one from a checkpoint with "
        "python -m fairseq_residual.schemes.admin CHECKPOINT OUT)"
    )
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--admin-profile {path}: no such file; {fix}")
    ks, rs = [], []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            fields = line.split()
            try:
                k, r = float(fields[0]), float(fields[1])
                if len(fields) != 2 or k != int(k):
                    raise ValueError
            except (ValueError, IndexError):
                raise ValueError(
                    f"--admin-profile {path} line {lineno}: expected 'k r' (sub-layer index, ratio), got "
                    f"{line.strip()!r}; {fix}"
                ) from None
            if not (math.isfinite(r) and r > 0):
                raise ValueError(
                    f"--admin-profile {path} line {lineno}: ratio {r!r} must be finite and > 0; {fix}"
                )
            ks.append(int(k))
            rs.append(r)
    expected = list(range(1, n_enc + 1)) + list(range(1, n_dec + 1))
    if ks != expected:
        raise ValueError(
            f"--admin-profile {path} does not fit this model: it has {len(ks)} lines ({_depth_of(ks)}) but "
            f"a model of {encoder_layers} encoder and {decoder_layers} decoder layers needs {n_enc + n_dec} "
            f"(encoder k = 1..{n_enc}, then decoder k = 1..{n_dec}); it was profiled at another depth: {fix}"
        )
    return rs[:n_enc], rs[n_enc:]


def write_profile(path: str, encoder_ratios, decoder_ratios):
    """Write a profile in the reference's ``profile.ratio.init`` format ("k r" lines)."""
    with open(path, "w") as f:
        for ratios in (encoder_ratios, decoder_ratios):
            for k, r in enumerate(ratios, 1):
                f.write(f"{k} {float(r)!r}\n")


def apply_profile(stack, ratios) -> None:
    """Fill every omega of ``stack`` with its profiled scalar and mark the stack profiled."""
    with torch.no_grad():
        for omega, r in zip(omega_parameters(stack), ratios):
            omega.fill_(float(r))
        stack.admin_profile.copy_(torch.tensor([float(r) for r in ratios], dtype=stack.admin_profile.dtype))
        stack.admin_profiled.fill_(1)


def _sync_profile(model) -> None:
    """Broadcast rank 0's omegas and profile to every rank (no-op without torch.distributed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    tensors = [model.encoder.admin_profile, model.decoder.admin_profile]
    for stack in (model.encoder, model.decoder):
        tensors += [p.data for p in omega_parameters(stack)]
    flat = torch.cat([t.reshape(-1).to(torch.float32) for t in tensors])
    dist.broadcast(flat, src=0)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset: offset + t.numel()].view_as(t))
        offset += t.numel()


def profile_model(model, args, kwargs) -> None:
    """Run the profiling forward of ``model`` on one batch (``model.forward(*args, **kwargs)``) under
    no_grad, in the model's current mode, filling every omega as the reference's recursion does."""
    profilers = {}
    for stack_name in STACKS:
        stack = getattr(model, stack_name)
        profilers[stack_name] = _Profiler()
        for layer in stack.layers:
            layer.admin_profiler = profilers[stack_name]
    try:
        with torch.no_grad():
            model.forward(*args, **kwargs)
    finally:
        for stack_name in STACKS:
            for layer in getattr(model, stack_name).layers:
                layer.admin_profiler = None
    for stack_name in STACKS:
        apply_profile(getattr(model, stack_name), profilers[stack_name].ratios)


def is_profiled(model) -> bool:
    return bool(model.encoder.admin_profiled) and bool(model.decoder.admin_profiled)


def _log_profile(model, how: str) -> None:
    for stack_name in STACKS:
        stack = getattr(model, stack_name)
        values = " ".join(f"{v:.4f}" for v in stack.admin_profile.tolist())
        n = stack.admin_profile.numel()
        logger.info(f"Admin omegas of the {stack_name} ({how}), sub-layers 1..{n}: {values}")


def _admin_pre_forward(model, args, kwargs):
    """Forward pre-hook of an Admin model: profile (or load the profile) before the first training batch."""
    if model._admin_ready:
        return None
    if is_profiled(model):
        model._admin_ready = True
        if model.training:
            logger.info("Admin omegas already profiled (admin_profiled=1, from the checkpoint or "
                        "--admin-profile): not re-profiling")
            _log_profile(model, "kept")
        return None
    if not model.training:
        # A warning, not an error: evaluating or decoding a model that never trained is legitimate
        # (fairseq-generate smoke tests, the analysis tool at init, decoding tests) and computes a
        # well-defined network (Post-LN with every omega = 1); it just is not the paper's Admin model.
        if not model._admin_warned:
            logger.warning(
                "Admin model used in eval mode before it was profiled: every omega is 1 (plain Post-LN "
                "with extra weights); train at least one update (the first training batch profiles it) "
                "or build it with --admin-profile FILE"
            )
            model._admin_warned = True
        return None
    if model.admin_profile_path is not None:
        # --admin-profile whose file was missing at build: fail before any update
        read_profile(model.admin_profile_path, len(model.encoder.layers), len(model.decoder.layers))
    profile_model(model, args, kwargs)
    _sync_profile(model)
    _log_profile(model, "profiled on the first training batch")
    model._admin_ready = True
    return None


def _invalidate(module, incompatible_keys):
    """After load_state_dict the profiled flag may have changed: check it again on the next forward."""
    module._admin_ready = False


class Admin(ResidualScheme):
    name = "admin"
    label = "Admin"
    scheme_id = 4
    color = "tab:orange"
    update = "x = LN(omega*x + drop(F(x))); omega (per sub-layer, width d) profiled on the first training batch"
    output = "x"
    source = "Liu et al. 2020, arXiv 2004.08249, Admin (adaptive model initialization)"
    reference = (
        "LiyuanLucasLiu/Transformer-Clinic, fairseq/fairseq/modules/transformer_layer.py "
        "(--init-type adaptive-profiling / adaptive)"
    )

    def add_args(self, parser):
        parser.add_argument(
            "--admin-profile",
            metavar="FILE",
            help="Admin: read the omegas from FILE (the reference's profile.ratio.init format, 'k r' per "
            "line, encoder k = 1..2N then decoder k = 1..3M) instead of profiling the first training "
            "batch; write one with python -m fairseq_residual.schemes.admin CHECKPOINT OUT",
        )

    def fill_defaults(self, args):
        if getattr(args, "admin_profile", None) is None:
            args.admin_profile = None

    def options(self, args):
        profile = getattr(args, "admin_profile", None) or None
        if profile is not None and getattr(args, "residual_scheme", None) != self.name:
            raise ValueError(
                f"--admin-profile is an option of --residual-scheme admin, but the scheme is "
                f"{args.residual_scheme}: drop --admin-profile or use --residual-scheme admin"
            )
        return AdminOptions(profile=profile)

    def check_args(self, args):
        super().check_args(args)
        if getattr(args, "admin_profile", None):
            return
        for flag in ("fp16", "bf16"):
            if getattr(args, flag, False) and not getattr(args, f"memory_efficient_{flag}", False):
                raise ValueError(
                    f"--{flag} keeps an fp32 copy of the weights made before the first batch, which would "
                    f"overwrite the omegas Admin profiles on that batch: profile once in fp32 (train 1 "
                    f"update, then python -m fairseq_residual.schemes.admin CHECKPOINT profile.ratio.init) "
                    f"and pass --admin-profile profile.ratio.init, or use --amp or "
                    f"--memory-efficient-{flag}"
                )

    def encoder_layer(self, cfg):
        return AdminEncoderLayer(cfg)

    def decoder_layer(self, cfg, no_encoder_attn):
        return AdminDecoderLayer(cfg, no_encoder_attn)

    def init_stack(self, stack, cfg):
        per_layer = len(OMEGAS[stack.stack])
        stack.register_buffer("admin_profiled", torch.tensor(0, dtype=torch.long))
        stack.register_buffer("admin_profile", torch.zeros(per_layer * len(stack.layers)))

    def initialize(self, model, args):
        """Apply ``--admin-profile`` (when its file exists; a missing file fails at the first training
        batch, so that a checkpoint still loads for generation where the file is gone) and install the
        hook that profiles the first training batch."""
        path = getattr(args, "admin_profile", None) or None
        model.admin_profile_path = path
        model._admin_ready = False
        model._admin_warned = False
        if path is not None and os.path.exists(path):
            enc, dec = read_profile(path, len(model.encoder.layers), len(model.decoder.layers))
            apply_profile(model.encoder, enc)
            apply_profile(model.decoder, dec)
            logger.info(f"Admin omegas read from --admin-profile {path}")
        model.register_forward_pre_hook(_admin_pre_forward, with_kwargs=True)
        model.register_load_state_dict_post_hook(_invalidate)


SCHEME = Admin()


def export_profile(checkpoint: str, out: str) -> None:
    """Write the profile saved in an Admin checkpoint to ``out`` (``profile.ratio.init`` format).

    Raises:
        ValueError: the checkpoint is not of an Admin model, or was saved before it was profiled.
    """
    import fairseq_residual  # noqa: F401  (allow-lists fairseq's checkpoint globals)

    state = torch.load(checkpoint, map_location="cpu")["model"]
    if "encoder.admin_profile" not in state:
        raise ValueError(f"{checkpoint} is not a checkpoint of a --residual-scheme admin model")
    if not (int(state["encoder.admin_profiled"]) and int(state["decoder.admin_profiled"])):
        raise ValueError(f"{checkpoint} was saved before its first training batch: it has no profile yet")
    write_profile(out, state["encoder.admin_profile"].tolist(), state["decoder.admin_profile"].tolist())


def main(argv=None):
    """``python -m fairseq_residual.schemes.admin CHECKPOINT [OUT]``: export an Admin checkpoint's profile."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 2) or argv[0] in ("-h", "--help"):
        print("usage: python -m fairseq_residual.schemes.admin CHECKPOINT [OUT (default profile.ratio.init)]")
        return 2
    out = argv[1] if len(argv) == 2 else "profile.ratio.init"
    try:
        export_profile(argv[0], out)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""nGPT, the normalised Transformer (Loshchilov, Hsieh, Sun, Ginsburg 2025, "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere", arXiv 2410.01131, ICLR 2025, sec. 2): every hidden state, every
embedding and every matrix row along the embedding axis lies on the unit sphere, and no LayerNorm is left.
Per sub-layer F (self-attention, cross-attention, FFN), with ``Norm(x) = x / ||x||`` over the width C:

    h = Norm(Norm(h) + a (Norm(drop(F(h))) - Norm(h)))            h: T x B x C         (paper eq. 10-11)
    a = |alpha * (alpha_init / alpha_scale)|                      alpha: C, stored as alpha_scale * 1

with ``alpha_init = 0.05`` (``--ngpt-alpha-init``) and ``alpha_scale = 1/sqrt(C)``, as NVIDIA/ngpt computes it
(``model.py``, ``Block.forward``: ``lr = |attn_alpha * (0.05 / base_scale)|``,
``h = justnorm(A_norm + lr * (B_norm - A_norm))``). Inside the branches:

* attention: the queries and keys of every head are normalised over the head's features and scaled by
  ``s_qk`` (C, the head's slice per head; stored ``s_qk_scale * 1``, used ``s_qk / s_qk_scale``, so 1 at the start,
  ``s_qk_scale = 1/sqrt(C)``), and the softmax scale is ``sqrt(C/H)`` instead of ``1/sqrt(C/H)`` (paper sec. 2.3.2,
  eq. 15-16; ``Block.forward``: ``q = sqk * justnorm(q)``, ``softmax_scale = sqrt_head_dim``);
* FFN: the first projection's output is scaled by ``s_u sqrt(C)`` (``s_u``: ffn_dim, stored 1, used as stored)
  before the activation (paper sec. 2.4.2, eq. 20-21; ``Block.forward``: ``uv = suv * sqrt(n_embd) * c_fc(h)``);
* logits ``z = s_z (.) (E h)`` over the vocabulary (``s_z``: V, stored ``1/sqrt(C)``, used ``s_z sqrt(C)``, so 1 at the
  start; paper sec. 2.5, eq. 22; ``GPT.forward``: ``logits = sz * lm_head(x)``).

After every optimizer step, and once when the model is built, every matrix is renormalised along its embedding
axis, as ``normalize_matrices()`` of NVIDIA/ngpt ``train.py`` does after ``optimizer.step()`` (rows, axis 1, of the
token embeddings, the output projection, ``q_proj``, ``k_proj``, ``v_proj``, ``fc1``; columns, axis 0, of
``out_proj`` and ``fc2``), computed in fp32. :func:`renormalise` does it; the plugin calls it after fairseq's
``task.optimizer_step`` (:mod:`fairseq_residual.optimizer_step`), on the model's weights and on the fp32 master
copies of fairseq's ``--fp16`` / ``--bf16`` optimizer (flat or not), so that the master weights stay on the sphere
too. A checkpoint holds the renormalised weights, so a resumed run continues on the sphere.

What differs from NVIDIA/ngpt, by design of this plugin (fairseq's Transformer, not nanoGPT):

* positions: fairseq's sinusoidal (or learned) positions added to the token embedding, not RoPE; the stream starts
  at ``h_0 = Norm(embed_scale E[token] + P[position])`` after the embedding dropout, with fairseq's
  ``embed_scale = sqrt(C)`` kept: with unit rows it gives the token ``||.|| = sqrt(C)`` against the sinusoid's
  ``sqrt(C/2)``, the balance of fairseq's default initialisation (rows of norm about 1); learned position
  embeddings are not renormalised (nGPT has none). Padded source positions start at 0 (``Norm(0) = 0``: the norm is
  clamped at 1e-12, as ``F.normalize``);
* biases: fairseq's linear layers keep their biases (nGPT has ``bias=False``); they are not renormalised, and the
  scales above act on the projection's output bias included;
* the FFN is fairseq's, not gated: ``s_u`` scales ``fc1``'s output before the activation (ReLU by default, for
  which the scale changes the branch only through the bias and the dropout, since ``Norm`` removes a common scale;
  with ``--activation-fn gelu`` / ``swish`` it sets how non-linear the activation is, as in the paper's SwiGLU);
* ``s_qk`` multiplies the queries twice instead of the queries and the keys once each:
  ``(s q)(s k) = (s^2 q) k`` per feature, the same scores and the same gradients; fairseq's key cache then holds the
  normalised keys;
* dropout (none in the reference) acts where fairseq's does: on the branch output before its ``Norm``, in the
  attention weights and after the activation.

Averaged checkpoints (fairseq's ``scripts/average_checkpoints.py``) and EMA weights (``--ema``) are averages of unit
rows, slightly inside the sphere; they are used as they are (every state is normalised anyway), not renormalised.

Encoder-decoder (the project's reading; nGPT is decoder-only): cross-attention takes the same update with its own
``alpha`` and ``s_qk``; its queries (decoder positions) and keys (projections of the encoder output) are normalised
per head as in self-attention. Both stacks have no final LayerNorm: the encoder output is its last state, on the
sphere, and the decoder's last state goes to the scaled logits. Shared embeddings (``--share-all-embeddings``,
``--share-decoder-input-output-embed``) are one matrix, renormalised once per step (token rows, the reference's
``wte`` and ``lm_head`` axis).

Parameters: ``layers.i.{self_attn,encoder_attn,ffn}_residual.alpha`` (C), ``layers.i.{self_attn,encoder_attn}.q_proj.sqk``
(C), ``layers.i.fc1.suv`` (ffn_dim), ``decoder.output_projection.sz`` (V); every matrix keeps fairseq's initialisation,
renormalised.

Refused, naming the fix: ``--adaptive-softmax-cutoff`` (no output projection to renormalise and scale),
``--ddp-backend fully_sharded`` (FSDP's flat shards have no rows), a decoder input or output width other than its
embedding width (``--decoder-input-dim`` / ``--decoder-output-dim``: the projections in between would leave the
sphere).
"""
import logging
import math
from dataclasses import dataclass
from typing import Dict, List

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import ResidualDecoderLayer, ResidualEncoderLayer
from ..residual import NORM_NONE, StackResidual, SublayerResidual, with_main
from .base import Option, ResidualScheme, largest_setting, setting, unwrap_model
from ..user_errors import SettingError

logger = logging.getLogger(__name__)

#: the smallest norm divided by (as ``F.normalize``): a zero vector (a padded position, the padding row) stays 0
NORM_EPS = 1e-12
#: the effective initial values of NVIDIA/ngpt ``model.py`` (``*_init_value``)
SQK_INIT, SUV_INIT, SZ_INIT = 1.0, 1.0, 1.0


def sphere(x: Tensor, dim: int = -1) -> Tensor:
    """``x / ||x||`` over ``dim`` (norm clamped at :data:`NORM_EPS`), computed in fp32, returned in ``x``'s dtype."""
    y = x.float()
    return (y / torch.linalg.vector_norm(y, dim=dim, keepdim=True).clamp_min(1e-12)).to(x.dtype)  # NORM_EPS


@dataclass(frozen=True)
class NGPTOptions:
    """Attributes: alpha_init: the effective initial eigen learning rate of every sub-layer's update."""

    alpha_init: float = 0.05


class NGPTResidual(SublayerResidual):
    """``h = Norm(Norm(h) + a (Norm(out) - Norm(h)))``, ``a = |alpha (alpha_init / alpha_scale)|``, ``out`` the
    dropped-out branch of ``h`` (no LayerNorm). ``alpha`` (C) is stored as ``alpha_scale * 1``, ``alpha_scale =
    1/sqrt(C)``, as NVIDIA/ngpt stores ``attn_alpha`` / ``mlp_alpha``."""

    NORM = NORM_NONE

    def __init__(self, site, alpha_init: float):
        super().__init__(site)
        self.alpha_scale = 1.0 / math.sqrt(site.embed_dim)
        self.alpha_factor = alpha_init / self.alpha_scale
        self.alpha = nn.Parameter(torch.full((site.embed_dim,), self.alpha_scale))

    def update(self, state: List[Tensor], out: Tensor, ctx: Dict[str, Tensor]) -> List[Tensor]:
        a = torch.abs(self.alpha * self.alpha_factor).to(out.dtype)
        x = sphere(state[0])
        return with_main(state, sphere(x + a * (sphere(out) - x)))


class NGPTStackResidual(StackResidual):
    """One stream, started on the sphere: ``h_0 = Norm(x)`` of the embedding output ``x`` (T x B x C)."""

    def start(self, x: Tensor) -> List[Tensor]:
        return [sphere(x)]


def _linear_parts(linear: nn.Linear, what: str):
    if type(linear) is not nn.Linear or getattr(linear, "weight_orig", None) is not None:
        raise ValueError(f"--residual-scheme ngpt needs fairseq's plain nn.Linear as {what}, got "
                         f"{type(linear).__name__}: drop the option that wraps it")
    return linear.in_features, linear.out_features


class HeadNormProjection(nn.Module):
    """fairseq's ``k_proj`` followed by ``Norm`` over each head's features: input ... x C_in, output ... x C, each
    head's ``C/H`` features on the sphere. Keeps the projection's ``weight`` / ``bias`` (fairseq's initialisation)
    and its quant-noise hook."""

    def __init__(self, linear: nn.Linear, num_heads: int, what: str = "k_proj"):
        super().__init__()
        self.in_features, self.out_features = _linear_parts(linear, what)
        self.weight, self.bias = linear.weight, linear.bias
        self._forward_pre_hooks.update(linear._forward_pre_hooks)
        self.num_heads = num_heads
        self.head_dim = self.out_features // num_heads

    def forward(self, x: Tensor) -> Tensor:
        return self.per_head_sphere(x)

    def per_head_sphere(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight, self.bias)
        shape = y.shape
        return sphere(y.view(shape[:-1] + (self.num_heads, self.head_dim))).view(shape)


class ScaledHeadNormProjection(HeadNormProjection):
    """fairseq's ``q_proj`` as :class:`HeadNormProjection`, times ``s_qk^2`` (``sqk``: C, stored ``s_qk_scale * 1``,
    used ``sqk / s_qk_scale``, ``s_qk_scale = 1/sqrt(C)``): the keys' ``s_qk`` moved onto the queries."""

    def __init__(self, linear: nn.Linear, num_heads: int):
        super().__init__(linear, num_heads, what="q_proj")
        self.sqk_factor = SQK_INIT * math.sqrt(self.out_features)
        self.sqk = nn.Parameter(torch.full((self.out_features,), 1.0 / math.sqrt(self.out_features)))

    def forward(self, x: Tensor) -> Tensor:
        s = (self.sqk * self.sqk_factor).to(x.dtype)
        return self.per_head_sphere(x) * (s * s)


class ScaledFC1(nn.Module):
    """fairseq's ``fc1`` times ``s_u sqrt(C)``: ``(x W_1 + b_1) (.) suv sqrt(C)``, ``suv`` (ffn_dim) stored 1 (NVIDIA/ngpt
    ``suv_init_scaling = 1``). Keeps ``weight`` / ``bias`` and the quant-noise hook."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = _linear_parts(linear, "fc1")
        self.weight, self.bias = linear.weight, linear.bias
        self._forward_pre_hooks.update(linear._forward_pre_hooks)
        self.suv_factor = SUV_INIT * math.sqrt(self.in_features)
        self.suv = nn.Parameter(torch.ones(self.out_features))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias) * (self.suv * self.suv_factor).to(x.dtype)


class ScaledOutputProjection(nn.Module):
    """The decoder's output projection times ``s_z``: ``z = (h E^T) (.) sz sqrt(C)``, B x T x V, ``sz`` (V) stored
    ``1/sqrt(C)`` (NVIDIA/ngpt ``sz_init_scaling = base_scale``). ``weight`` is fairseq's (the shared embedding
    where it is shared)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if type(linear) is not nn.Linear or linear.bias is not None:
            raise ValueError(f"--residual-scheme ngpt needs fairseq's output projection (nn.Linear without bias), got "
                             f"{type(linear).__name__}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        sz_scale = 1.0 / math.sqrt(self.in_features)
        self.sz_factor = SZ_INIT / sz_scale
        self.sz = nn.Parameter(torch.full((self.out_features,), sz_scale))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight) * (self.sz * self.sz_factor).to(x.dtype)


def _normed_attention(attn):
    """fairseq's ``MultiheadAttention`` with per-head normalised queries (times ``s_qk^2``) and keys and the softmax
    scale ``sqrt(C/H)``, on fairseq's explicit path (which calls ``q_proj`` / ``k_proj``)."""
    attn.q_proj = ScaledHeadNormProjection(attn.q_proj, attn.num_heads)
    attn.k_proj = HeadNormProjection(attn.k_proj, attn.num_heads)
    _linear_parts(attn.v_proj, "v_proj")
    attn.scaling = float(attn.head_dim) ** 0.5
    attn._set_skip_embed_dim_check()
    return attn


class NGPTEncoderLayer(ResidualEncoderLayer):
    """The protocol's encoder layer with nGPT's attention and FFN scaling."""

    def build_self_attention(self, embed_dim, cfg):
        return _normed_attention(super().build_self_attention(embed_dim, cfg))

    def build_fc1(self, input_dim, output_dim, q_noise, qn_block_size):
        return ScaledFC1(super().build_fc1(input_dim, output_dim, q_noise, qn_block_size))


class NGPTDecoderLayer(ResidualDecoderLayer):
    """The protocol's decoder layer with nGPT's self- and cross-attention and FFN scaling."""

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return _normed_attention(super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn))

    def build_encoder_attention(self, embed_dim, cfg):
        return _normed_attention(super().build_encoder_attention(embed_dim, cfg))

    def build_fc1(self, input_dim, output_dim, q_noise, qn_block_size):
        return ScaledFC1(super().build_fc1(input_dim, output_dim, q_noise, qn_block_size))


def sphere_matrices(model):
    """``[(parameter, axis)]``: every matrix of an nGPT ``model`` with the axis its rows along the embedding run on
    (1: token embeddings, output projection, q/k/v projections, fc1; 0: attention output projections, fc2), each
    tensor once (shared embeddings are one)."""
    model = unwrap_model(model)
    found, seen = [], set()

    def add(p, axis):
        if p is not None and id(p) not in seen:
            seen.add(id(p))
            found.append((p, axis))

    for stack in (model.encoder, model.decoder):
        add(stack.embed_tokens.weight, 1)
    if getattr(model.decoder, "output_projection", None) is not None:
        add(model.decoder.output_projection.weight, 1)
    for stack in (model.encoder, model.decoder):
        for layer in stack.layers:
            for attn in (layer.self_attn, getattr(layer, "encoder_attn", None)):
                if attn is None:
                    continue
                for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                    add(proj.weight, 1)
                add(attn.out_proj.weight, 0)
            add(layer.fc1.weight, 1)
            add(layer.fc2.weight, 0)
    return found


def _master_copies(optimizer) -> Dict[int, Tensor]:
    """``{id(model parameter): its fp32 master copy (a view)}`` of fairseq's ``--fp16`` / ``--bf16`` optimizer
    (``FP16Optimizer``: a list of copies, or one flat copy per device, laid out as
    ``_sync_fp32_params_to_fp16`` reads it; also inside ``--use-bmuf``'s wrapper); ``{}`` for an optimizer that
    updates the model's weights itself."""
    inner = getattr(optimizer, "_optimizer", None)  # fairseq's --use-bmuf keeps the fp16 optimizer there
    if not hasattr(optimizer, "fp32_params") and hasattr(inner, "fp32_params"):
        optimizer = inner
    params = getattr(optimizer, "fp16_params", None)
    masters = getattr(optimizer, "fp32_params", None)
    if params is None or masters is None:
        return {}
    if isinstance(masters, dict) or torch.is_tensor(masters):
        flat = masters if isinstance(masters, dict) else {None: masters}
        found, offsets = {}, {}
        for p in params:
            device = p.device.index if isinstance(masters, dict) else None
            if device not in flat:
                continue
            offset = offsets.get(device, 0)
            found[id(p)] = flat[device].data[offset: offset + p.numel()].view_as(p)
            offsets[device] = offset + p.numel()
        return found
    return {id(p): m.data for p, m in zip(params, masters)}


@torch.no_grad()
def renormalise(model, optimizer=None) -> None:
    """Put every matrix of :func:`sphere_matrices` back on the sphere along its embedding axis (fp32 arithmetic),
    as NVIDIA/ngpt ``train.py`` ``normalize_matrices()``; where ``optimizer`` keeps fp32 master copies, the master is
    renormalised and copied into the model's weight."""
    masters = _master_copies(optimizer) if optimizer is not None else {}
    for p, axis in sphere_matrices(model):
        master = masters.get(id(p))
        if master is not None:
            master.copy_(sphere(master, axis))
            p.data.copy_(master)
        else:
            p.data.copy_(sphere(p.data, axis))


def on_sphere(model, tol: float = 1e-5) -> float:
    """The largest ``| ||row|| - 1 |`` over :func:`sphere_matrices` (zero rows, the padding embedding before any
    update, left out): 0 up to rounding for a renormalised model."""
    worst = 0.0
    for p, axis in sphere_matrices(model):
        n = torch.linalg.vector_norm(p.detach().float(), dim=axis)
        n = n[n > 0]
        if n.numel():
            worst = max(worst, float((n - 1).abs().max()))
    return worst


class NGPT(ResidualScheme):
    name = "ngpt"
    label = "nGPT"
    scheme_id = 26
    builds_on = "post_ln"
    color = "indigo"
    update = ("h = Norm(Norm(h) + a (Norm(drop(F(h))) - Norm(h))), Norm = x/||x||, a = |alpha| per feature; "
              "attention q, k normalised per head and scaled by s_qk, softmax scale sqrt(d_head); fc1 output x "
              "s_u sqrt(C); logits x s_z; no LayerNorm anywhere")
    output = "h (on the sphere); logits s_z (E h)"
    init = ("`a = 0.05` (`alpha` stored `1/sqrt(C)`), `s_qk = s_u = s_z = 1`; the stream starts at `Norm(emb)`; every "
            "matrix renormalised along the embedding axis at build and after every optimizer step")
    source = "Loshchilov et al. 2025 (nGPT), arXiv 2410.01131, sec. 2, eq. 10-11, 15-16, 20-22"
    reference = ("NVIDIA/ngpt `model.py` (`Block.forward`, `GPT.forward`), `train.py` (`normalize_matrices`); its "
                 "GPT baseline is not followed (NVIDIA/ngpt issue 1: it normalised the stream before adding the branch)")
    reading = ("cross-attention takes the same update with its own alpha and s_qk, its queries (decoder) and keys "
               "(encoder output) normalised per head; no final LayerNorm: the encoder output is its last state on the "
               "sphere; the stream starts at Norm(embed_scale E + positions) (fairseq's positions, not RoPE); fairseq's "
               "biases kept; the non-gated FFN scales fc1's output by s_u sqrt(C) before the activation")
    recipe = ("the reference: decoder-only LMs of 0.5B and 1B on OpenWebText, AdamW (0.9, 0.95), lr 15e-4 with a cosine "
              "decay to 0, **no warm-up and no weight decay** (here `--weight-decay 0` and no `--warmup-updates`), clip "
              "1.0, dropout 0, bf16; the paper reached GPT's loss in 4x / 10x / 20x fewer steps at 1k / 4k / 8k context; "
              "the public code's own speed-ups are larger than the paper's, which its README says they should not be "
              "(NVIDIA/ngpt README; issue 6: reproduction curves differ). No translation recipe. The plugin renormalises "
              "the weights after every optimizer step (`fairseq_residual/optimizer_step.py`), fp16/bf16 master weights "
              "included.")
    fp16_advice = "fp16 as is: every state, branch output and matrix row has norm 1 (norms computed in fp32)"
    final_norm_eps = None
    has_layer_norm = False
    formula_norms = ("its L2 normalisations `x/||x||` of the states, branch outputs, queries and keys (the scheme "
                     "itself: no LayerNorm to replace)")
    OPTIONS = (
        Option("ngpt_alpha_init", float, 0.05, "effective initial eigen learning rate a of every sub-layer's update "
               "h = Norm(h + a (Norm(F(h)) - h)) (alpha stored 1/sqrt(C), used |alpha a sqrt(C)|)", low=0.0,
               high=1.0, low_open=True, metavar="A"),
    )

    def options(self, args):
        return NGPTOptions(alpha_init=float(args.ngpt_alpha_init))

    def check_args(self, args) -> None:
        super().check_args(args)
        if getattr(args, "adaptive_softmax_cutoff", None):
            raise SettingError("--adaptive-softmax-cutoff replaces the output projection, which --residual-scheme ngpt "
                             "renormalises and scales by s_z: drop --adaptive-softmax-cutoff")
        width = getattr(args, "decoder_embed_dim", None)
        for key in ("decoder_input_dim", "decoder_output_dim"):
            value = getattr(args, key, None)
            if value is not None and width is not None and value != width:
                flag = "--" + key.replace("_", "-")
                raise SettingError(f"{flag} {value} differs from --decoder-embed-dim {width}: the projection in between "
                                 f"would leave the sphere of --residual-scheme ngpt; drop {flag}")

    def check_training(self, cfg, model) -> None:
        """Refuse FSDP; log weight decay (nGPT trains without: arXiv 2410.01131, NVIDIA/ngpt ``train.py``).

        Raises:
            ValueError: ``--ddp-backend fully_sharded`` (``distributed_training.ddp_backend``).
        """
        super().check_training(cfg, model)
        if setting(cfg, "distributed_training", "ddp_backend") == "fully_sharded":
            raise SettingError("--ddp-backend fully_sharded (distributed_training.ddp_backend) flattens the weights "
                             "into shards without rows, which --residual-scheme ngpt renormalises after every step: "
                             "use --ddp-backend pytorch_ddp (or c10d, no_c10d, legacy_ddp)")
        decay = largest_setting(cfg, "optimizer", "weight_decay")
        if decay > 0:
            logger.warning(
                "nGPT trains without weight decay (NVIDIA/ngpt train.py), but the optimizer decays weights by %g: it "
                "pulls the eigen learning rates and scalers (alpha, s_qk, s_u, s_z) toward 0 at every step, while "
                "the matrices are put back on the sphere after it; use --weight-decay 0 (optimizer.weight_decay=0)",
                decay)

    def sublayer_residual(self, cfg, site):
        return NGPTResidual(site, cfg.residual_options.params.alpha_init)

    def stack_residual(self, cfg, stack, num_layers, embed_dim):
        return NGPTStackResidual(stack, num_layers, embed_dim)

    def encoder_layer(self, cfg, residuals):
        return NGPTEncoderLayer(cfg, residuals)

    def decoder_layer(self, cfg, residuals, no_encoder_attn):
        return NGPTDecoderLayer(cfg, residuals, no_encoder_attn=no_encoder_attn, scheme=self.name)

    def initialize(self, model, options) -> None:
        """Scale the logits by ``s_z`` (the decoder's output projection becomes :class:`ScaledOutputProjection`) and
        put every matrix on the sphere, as NVIDIA/ngpt calls ``normalize_matrices()`` before its first step."""
        decoder = model.decoder
        if not isinstance(decoder.output_projection, ScaledOutputProjection):
            decoder.output_projection = ScaledOutputProjection(decoder.output_projection)
        renormalise(model)

    def after_optimizer_step(self, model, optimizer) -> None:
        renormalise(model, optimizer)


SCHEME = NGPT()

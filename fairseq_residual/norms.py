"""``--norm``: what every LayerNorm of a model computes: LayerNorm (the default), RMSNorm, DyT or Derf.

Every scheme's LayerNorms are fairseq's ``LayerNorm`` (``torch.nn.LayerNorm``, or apex's fused one on CUDA):
the sub-layer norms, the stacks' final norms, ``--layernorm-embedding`` and the schemes' own (ResiDual's
final norm, Peri-LN's output norms, SiameseNorm's, HybridNorm's per-head q/k/v norms, DLCL's history norms,
...). With ``--norm`` other than ``layernorm`` the model is built as usual (the scheme's initialisation
included) and then each of those modules is replaced by the chosen one (:func:`replace_layer_norms`), with
the LayerNorm's width, its eps (RMSNorm) and its affine parameters as they were initialised (gamma, beta);
a scheme added later is covered without edits. Per position ``x`` of width C (T x B x C in, T x B x C out;
HybridNorm's per-head norms: width head_dim)::

    layernorm  y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta
    rmsnorm    y = x / sqrt(mean(x^2) + eps) * gamma                   torch.nn.RMSNorm (no beta; torch < 2.4: ours)
    dyt        y = tanh(alpha x) * gamma + beta                          alpha: one learned scalar per norm
    derf       y = erf(alpha x + s) * gamma + beta                       alpha, s: learned scalars per norm

Sources: DyT, Zhu, Chen, He, LeCun, Liu 2025, arXiv 2503.10622 (facebookresearch/DyT ``dynamic_tanh.py``,
``DynamicTanh``: ``alpha`` a one-element parameter, init ``alpha_init_value`` 0.5, ``weight`` 1, ``bias`` 0;
``convert_ln_to_dyt`` replaces every LayerNorm); its LLaMA runs (``other_tasks/LLaMA/README.md``) start the
attention norms, the FFN norms and the final norm at different alphas (7B: 0.8 / 0.2 / 0.2; 13B: 0.6 / 0.15 /
0.15; 34B and 70B: 0.2 / 0.05 / 0.05), which ``--dyt-attn-alpha``, ``--dyt-ffn-alpha`` and
``--dyt-final-alpha`` set. Derf, Chen, Lu, Zhu, Sun, Liu 2025, arXiv 2512.10938 (lucidrains/x-transformers
``x_transformers/x_transformers.py``, ``Derf``: ``alpha`` init 0.5, ``s`` init 0, ``gamma`` 1, ``beta`` 0).
RMSNorm: Zhang, Sennrich 2019, arXiv 1910.07467 (``torch.nn.RMSNorm``).

Positions of the per-position alphas, by fairseq's module names: ``self_attn_layer_norm`` and
``encoder_attn_layer_norm`` (the attention norms), ``final_layer_norm`` of a layer (the FFN norm) and the
stack's ``layer_norm`` (the final norm); every other norm (a scheme's own, ``--layernorm-embedding``) starts
at ``--dyt-alpha``.

Not replaced: norms that are part of a scheme's formula rather than a LayerNorm module: hyper-connections'
parameter-free ``LN_hc`` inside its dynamic coefficients, mHC's parameter-free RMSNorm of its coefficients,
the reordered norm's QK-norm RMSNorm (each scheme's docstring gives it).

A model with a norm other than ``layernorm`` stores its id in the buffer ``residual_norm_id`` of each stack
(``layernorm`` models hold no such buffer, so their checkpoints are what they were); loading a checkpoint
into a model of another norm fails naming both (:class:`NormMismatchError`).
"""
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from .schemes.base import Option, OptionError
from .user_errors import SettingError, UserInputError, advice_for_this_tool, in_hydra_train

#: the values of ``--norm``, the default first
NORMS = ("layernorm", "rmsnorm", "dyt", "derf")
DEFAULT_NORM = "layernorm"
#: the id stored in a checkpoint (buffer ``residual_norm_id``); fixed forever, never reused
NORM_IDS = {"layernorm": 0, "rmsnorm": 1, "dyt": 2, "derf": 3}
NORM_BY_ID = {i: n for n, i in NORM_IDS.items()}
#: the field's name of each norm (tables, messages)
NORM_LABELS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm", "dyt": "DyT", "derf": "Derf"}

#: module names (the last component) of each alpha position
POSITION_OF = {"self_attn_layer_norm": "attn", "encoder_attn_layer_norm": "attn", "final_layer_norm": "ffn"}

_ALPHA = dict(low=0.0, high=100.0, low_open=True)

#: the options of ``--norm`` (``model.<dest>``), for every scheme; each but ``norm`` belongs to one norm
NORM_OPTIONS = (
    Option("norm", str, DEFAULT_NORM, choices=NORMS,
           help="what every LayerNorm of the scheme computes: layernorm (fairseq's LayerNorm, as the scheme's "
                "reference), rmsnorm (torch.nn.RMSNorm with gain, arXiv 1910.07467), dyt (tanh(alpha x) gamma + "
                "beta, arXiv 2503.10622) or derf (erf(alpha x + s) gamma + beta, arXiv 2512.10938); a scheme "
                "whose maths needs LayerNorm refuses the others, saying why"),
    Option("dyt_alpha", float, 0.5, metavar="A", **_ALPHA,
           help="--norm dyt: initial alpha of every DyT (facebookresearch/DyT dynamic_tanh.py, "
                "alpha_init_value 0.5)"),
    Option("dyt_attn_alpha", float, None, metavar="A", default_text="--dyt-alpha", **_ALPHA,
           help="--norm dyt: initial alpha of the attention norms (self- and cross-attention); the DyT LLaMA "
                "runs use 0.8 (7B), 0.6 (13B), 0.2 (34B, 70B) (facebookresearch/DyT other_tasks/LLaMA/README.md)"),
    Option("dyt_ffn_alpha", float, None, metavar="A", default_text="--dyt-alpha", **_ALPHA,
           help="--norm dyt: initial alpha of the FFN norms; DyT LLaMA: 0.2 (7B), 0.15 (13B), 0.05 (34B, 70B)"),
    Option("dyt_final_alpha", float, None, metavar="A", default_text="--dyt-alpha", **_ALPHA,
           help="--norm dyt: initial alpha of each stack's final norm; DyT LLaMA: 0.2 (7B), 0.15 (13B), "
                "0.05 (34B, 70B)"),
    Option("derf_alpha", float, 0.5, metavar="A", **_ALPHA,
           help="--norm derf: initial alpha of every Derf (lucidrains/x-transformers Derf, init_alpha 0.5; "
                "arXiv 2604.01563 reports 0.3 better under Muon)"),
    Option("derf_shift", float, 0.0, metavar="S", low=-10.0, high=10.0,
           help="--norm derf: initial shift s of every Derf (x-transformers init_bias 0)"),
    Option("rmsnorm_eps", float, None, metavar="E", low=0.0, high=1.0, low_open=True,
           default_text="the replaced LayerNorm's eps",
           help="--norm rmsnorm: eps of every RMSNorm; by default each keeps the eps of the LayerNorm it replaces "
                "(1e-5, ResiDual's final 1e-7 c^2, which keeps LN_final(c x) = LN_final(x) exact)"),
)
#: the norm each option other than ``norm`` belongs to
OPTION_NORM = {"dyt_alpha": "dyt", "dyt_attn_alpha": "dyt", "dyt_ffn_alpha": "dyt", "dyt_final_alpha": "dyt",
               "derf_alpha": "derf", "derf_shift": "derf", "rmsnorm_eps": "rmsnorm"}


class _RMSNorm(nn.Module):
    """``torch.nn.RMSNorm`` for a torch before 2.4, which lacks it: ``y = x / sqrt(mean(x^2) + eps) * weight``."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5, elementwise_affine: bool = True):
        super().__init__()
        self.normalized_shape = (int(normalized_shape),)
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(normalized_shape)) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return y * self.weight if self.weight is not None else y


#: torch's RMSNorm (torch >= 2.4), else the same computation
RMSNorm = getattr(nn, "RMSNorm", None) or _RMSNorm


class NormMismatchError(UserInputError, ValueError):
    """A checkpoint of one ``--norm`` was loaded into a model of another."""


@dataclass(frozen=True)
class NormOptions:
    """The validated ``--norm`` options of a model (:func:`norm_options`)."""

    kind: str = DEFAULT_NORM
    dyt_alpha: float = 0.5
    dyt_attn_alpha: Optional[float] = None
    dyt_ffn_alpha: Optional[float] = None
    dyt_final_alpha: Optional[float] = None
    derf_alpha: float = 0.5
    derf_shift: float = 0.0
    rmsnorm_eps: Optional[float] = None

    def alpha(self, position: str) -> float:
        """DyT's initial alpha at ``position`` (``attn``, ``ffn``, ``final`` or ``other``)."""
        value = {"attn": self.dyt_attn_alpha, "ffn": self.dyt_ffn_alpha,
                 "final": self.dyt_final_alpha}.get(position)
        return self.dyt_alpha if value is None else value


class DynamicTanh(nn.Module):
    """DyT: ``y = tanh(alpha x) * weight + bias`` over the last dimension (any leading shape, e.g. T x B x C).

    Args:
        normalized_shape: C.
        alpha: the initial alpha (a learned one-element parameter).

    As facebookresearch/DyT ``dynamic_tanh.py`` (``DynamicTanh``, channels last), arXiv 2503.10622.
    """

    def __init__(self, normalized_shape: int, alpha: float = 0.5):
        super().__init__()
        self.normalized_shape = (int(normalized_shape),)
        self.alpha_init = float(alpha)
        self.alpha = nn.Parameter(torch.full((1,), float(alpha)))
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.alpha * x) * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, alpha_init={self.alpha_init}"


class DynamicErf(nn.Module):
    """Derf: ``y = erf(alpha x + shift) * weight + bias`` over the last dimension (e.g. T x B x C).

    Args:
        normalized_shape: C.
        alpha: the initial alpha, shift: the initial shift s (both learned scalars).

    As lucidrains/x-transformers ``Derf`` (``alpha``, ``s``, ``gamma``, ``beta``; here ``alpha``, ``shift``,
    ``weight``, ``bias``, as LayerNorm's names), arXiv 2512.10938.
    """

    def __init__(self, normalized_shape: int, alpha: float = 0.5, shift: float = 0.0):
        super().__init__()
        self.normalized_shape = (int(normalized_shape),)
        self.alpha = nn.Parameter(torch.full((1,), float(alpha)))
        self.shift = nn.Parameter(torch.full((1,), float(shift)))
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x: Tensor) -> Tensor:
        return torch.erf(self.alpha * x + self.shift) * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}"


def is_layer_norm(module: nn.Module) -> bool:
    """fairseq's LayerNorm: ``torch.nn.LayerNorm`` (its subclasses: fairseq's ``Fp32LayerNorm``) or apex's
    ``FusedLayerNorm`` (matched by its class name)."""
    return isinstance(module, nn.LayerNorm) or type(module).__name__ in ("FusedLayerNorm", "MixedFusedLayerNorm")


def is_norm(module: nn.Module) -> bool:
    """Any of the four norms (the modules the range report reads the inputs of)."""
    return is_layer_norm(module) or isinstance(module, (RMSNorm, DynamicTanh, DynamicErf))


def position(name: str) -> str:
    """The alpha position of the module called ``name`` in the model: ``attn``, ``ffn``, ``final`` (a stack's
    ``layer_norm``: ``encoder.layer_norm``, ``decoder.layer_norm``) or ``other``."""
    parts = name.split(".")
    if len(parts) == 2 and parts[1] == "layer_norm":
        return "final"
    return POSITION_OF.get(parts[-1], "other")


def make_norm(layer_norm: nn.Module, options: NormOptions, where: str) -> nn.Module:
    """The ``options.kind`` norm that replaces ``layer_norm``: its width, eps and initialised gamma / beta."""
    shape = tuple(layer_norm.normalized_shape)
    if len(shape) != 1:
        raise ValueError(f"--norm {options.kind}: the LayerNorm {where} normalises over {shape}, not one dimension")
    c = shape[0]
    affine = getattr(layer_norm, "weight", None) is not None
    if options.kind == "rmsnorm":
        eps = options.rmsnorm_eps if options.rmsnorm_eps is not None else float(layer_norm.eps)
        new = RMSNorm(c, eps=eps, elementwise_affine=affine)
    elif options.kind == "dyt":
        new = DynamicTanh(c, options.alpha(position(where)))
    elif options.kind == "derf":
        new = DynamicErf(c, options.derf_alpha, options.derf_shift)
    else:
        raise ValueError(f"make_norm: unknown norm {options.kind!r}")
    with torch.no_grad():
        if affine:
            new.weight.copy_(layer_norm.weight)
            if getattr(new, "bias", None) is not None and getattr(layer_norm, "bias", None) is not None:
                new.bias.copy_(layer_norm.bias)
        elif options.kind in ("dyt", "derf"):  # a LayerNorm without parameters: gamma 1, beta 0, kept fixed
            new.weight.requires_grad_(False)
            new.bias.requires_grad_(False)
    ref = getattr(layer_norm, "weight", None)
    return new.to(device=ref.device, dtype=ref.dtype) if ref is not None else new


def replace_layer_norms(model: nn.Module, options: NormOptions) -> int:
    """Replace every LayerNorm module of ``model`` in place by ``options.kind``'s norm; return how many.
    A LayerNorm registered at two places is replaced by one module at both.

    Raises:
        ValueError: the model's layers are wrapped by FSDP (``--ddp-backend fully_sharded`` wraps each layer as
            it is built and flattens its parameters, which a later replacement would bypass).
        RuntimeError: a LayerNorm is left (a module that holds one outside its registered children).
    """
    if options.kind == DEFAULT_NORM:
        return 0
    for name, module in model.named_modules():
        if type(module).__name__ == "FullyShardedDataParallel":
            raise SettingError(
                f"--norm {options.kind} is not supported with --ddp-backend fully_sharded (FSDP wraps {name} with its "
                f"LayerNorms flattened before they can be replaced): use --ddp-backend c10d / no_c10d, or --norm "
                f"layernorm")
    replaced = {}
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent._modules.items()):
            if child is None or not is_layer_norm(child):
                continue
            where = f"{parent_name}.{child_name}" if parent_name else child_name
            if id(child) not in replaced:
                replaced[id(child)] = make_norm(child, options, where)
            setattr(parent, child_name, replaced[id(child)])
    left = [name for name, m in model.named_modules() if is_layer_norm(m)]
    if left:
        raise RuntimeError(f"--norm {options.kind}: LayerNorms left after the replacement: {', '.join(left)}")
    return len(replaced)


def add_norm_args(parser) -> None:
    """Add :data:`NORM_OPTIONS` to a fairseq model parser (no defaults: the ``--arch`` presets fill them)."""
    for o in NORM_OPTIONS:
        extra = {"choices": o.choices} if o.choices else {"type": o.type}
        default = f"; default {o.default_text}" if o.default_text else f"; default {o.default}"
        rng = "" if o.choices else f"; range {o.range_text()}"
        parser.add_argument(o.flag, metavar=o.metavar, help=f"{o.help}{rng}{default}", **extra)


def fill_norm_defaults(args) -> None:
    """Fill the ``--norm`` options the user did not give (so that checkpoints hold every key)."""
    for o in NORM_OPTIONS:
        if getattr(args, o.dest, None) is None and o.default is not None:
            setattr(args, o.dest, o.default)


def norm_options(args, typed=frozenset()) -> NormOptions:
    """The validated ``--norm`` options of ``args`` (a Namespace or DictConfig; missing keys: defaults, as in a
    checkpoint saved before the option existed).

    Args:
        typed: keys typed on the training command line (``dyt_alpha``); one of another norm is refused even at
            its default.

    Raises:
        OptionError: a value outside its range, or an option of another norm than the selected one.
    """
    values = {}
    for o in NORM_OPTIONS:
        value = getattr(args, o.dest, None)
        if o.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        o.check(value, getattr(args, "residual_scheme", None) or "any")
        values[o.dest] = o.default if value is None else value
    kind = values.pop("norm")
    given = [o.flag for o in NORM_OPTIONS if o.dest in OPTION_NORM and OPTION_NORM[o.dest] != kind
             and (o.dest in typed or values[o.dest] is not None and values[o.dest] != o.default)]
    if given:
        dests = {f: f[2:].replace("-", "_") for f in given}
        owners = sorted({OPTION_NORM[d] for d in dests.values()})
        them = "it" if len(given) == 1 else "them"
        loading = (f"if --model-overrides sets norm or {them}, drop {them} there; the checkpoint's weights are "
                   f"those of the norm it was trained with, which it names")
        training = (f"drop {' '.join('model.' + d for d in dests.values())} or use model.norm={owners[0]}"
                    if in_hydra_train() else f"drop {' '.join(given)} or use --norm {owners[0]}")
        raise OptionError(
            f"{', '.join(f'{f} (model.{d})' for f, d in dests.items())} "
            f"{'is an option' if len(given) == 1 else 'are options'} of --norm {' / '.join(owners)} "
            f"(model.norm={' / '.join(owners)}), but the norm is {kind}: {advice_for_this_tool(loading, training)}")
    return NormOptions(kind=kind, **values)

"""What a residual scheme is: the base class every scheme module subclasses.

A scheme is either fairseq's own code (:attr:`ResidualScheme.fairseq_path`: Post-LN and Pre-LN run
fairseq's layers and loops untouched), or a set of residual objects over the protocol of
:mod:`fairseq_residual.residual`, which the one encoder/decoder layer (:mod:`fairseq_residual.layers`) and
the one loop per stack (:mod:`fairseq_residual.encoder_decoder`) run. A protocol scheme says only:

* the residual of each sub-layer (:meth:`ResidualScheme.sublayer_residual`, given the sub-layer's
  :class:`~fairseq_residual.residual.Site`), by default Pre-LN's ``x + drop(F(LN(x)))``;
* the residual of each stack (:meth:`stack_residual`), by default one stream;
* the stack's final LayerNorm (:attr:`final_norm_eps`, None for none);
* how it is initialised after fairseq's initialisation (:meth:`initialize`, given the model and its validated
  :class:`SchemeOptions`, which carry the scheme object itself), what runtime machinery it
  needs on the first training batch (:meth:`training_hook`, Admin's profiling), how parameter names of
  older checkpoints map to today's (:meth:`upgrade_state_dict`);
* its own options (:attr:`OPTIONS`: flag, type, default, range; validated the same way for every
  scheme) and the fairseq options it cannot honour: the model's (:meth:`check_args`, given the model's config)
  and the training's (:meth:`check_training`, given fairseq's whole config where its Trainer is built: precision,
  distributed backend, optimizer, schedule, which ``fairseq-hydra-train``'s model config does not hold).

A new single-stream scheme is one module with a :class:`~fairseq_residual.residual.SublayerResidual`
subclass and a scheme class, plus its module name in ``schemes/registry_order.py``.
"""
import argparse
import math
from dataclasses import dataclass
from typing import Any, FrozenSet, Mapping, Optional, Tuple

import torch

from ..optim_groups import flat_master_copy_refusal
from ..residual import SublayerResidual, StackResidual
from ..user_errors import SettingError, UserInputError, advice_for_this_tool

STACKS = ("encoder", "decoder")



def stack_depth(args, stack: str):
    """The number of layers of ``stack`` ("encoder" or "decoder") the parsed arguments ask for:
    ``args.<stack>_layers`` (fairseq-train's flags), else ``args.<stack>.layers`` (a Hydra config); None
    where neither is set."""
    value = getattr(args, f"{stack}_layers", None)
    if value is None and hasattr(args, stack):
        value = getattr(getattr(args, stack), "layers", None)
    return value

class OptionError(UserInputError, ValueError):
    """A residual option outside its range, or given for a scheme that is not selected."""


@dataclass(frozen=True)
class SchemeOptions:
    """The validated residual options of one model: the scheme, its own constants, and which layers of the
    trained model each stack holds. The one object the stacks, their layers and :meth:`ResidualScheme.initialize`
    read the scheme from (it is resolved from ``--residual-scheme`` once per build).

    Attributes:
        scheme: the selected :class:`ResidualScheme` (a registry name given here is resolved to it).
        params: the scheme's own options (a frozen dataclass defined by the scheme module, or None).
        encoder_layers, decoder_layers: the depth N, M of the model as trained.
        encoder_kept, decoder_kept: the indices (in the trained model) of the layers this model holds: all of
            them, or those of ``--{encoder,decoder}-layers-to-keep`` (fairseq's pruning of a LayerDrop-trained
            model), so that a kept layer's residual keeps its index and depth constants.
        norm: the validated ``--norm`` options (:class:`fairseq_residual.norms.NormOptions`; None: LayerNorm).
    """

    scheme: "ResidualScheme"
    params: Any = None
    encoder_layers: int = 0
    decoder_layers: int = 0
    encoder_kept: Tuple[int, ...] = ()
    decoder_kept: Tuple[int, ...] = ()
    norm: Any = None

    def __post_init__(self):
        if isinstance(self.scheme, str):
            from . import get_scheme  # the registry imports this module

            object.__setattr__(self, "scheme", get_scheme(self.scheme))

    @property
    def name(self) -> str:
        """The scheme's registry name (``--residual-scheme``)."""
        return self.scheme.name

    def depth(self, stack: str) -> int:
        """N or M of the model as trained: the one source of a scheme's depth constants."""
        return self.encoder_layers if stack == "encoder" else self.decoder_layers

    def kept(self, stack: str) -> Tuple[int, ...]:
        """The trained indices of the layers ``stack`` holds, in order."""
        return self.encoder_kept if stack == "encoder" else self.decoder_kept


@dataclass(frozen=True)
class Option:
    """One option of a scheme (``--<dest with dashes>``, Hydra key ``model.<dest>``).

    Attributes:
        dest: the attribute name (``resi_dual_scale``).
        type: ``float``, ``int`` or ``str``.
        default: the value a model gets when the option is not given; None means "filled by the
            scheme's :meth:`ResidualScheme.fill_defaults`" (e.g. a per-stack value that defaults to the
            shared one).
        help: the ``--help`` text (without the default and range, which are appended).
        low, high: the closed range of a number (None: unbounded on that side); finiteness is always
            required. ``low_open`` / ``high_open`` make an end open.
        choices: the allowed values of a string option.
        metavar: for ``--help``.
        negative: for a ``bool`` option, the flag that sets it False (``--hc-static``); ``flag`` sets it True.
        default_text: the default in words where :attr:`default` is None (``--help`` and README).
    """

    dest: str
    type: type
    default: Any
    help: str
    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    choices: Optional[Tuple[str, ...]] = None
    metavar: Optional[str] = None
    negative: Optional[str] = None
    default_text: Optional[str] = None

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")

    def range_text(self) -> str:
        if self.type is bool:
            return f"{self.flag} or {self.negative}"
        if self.choices:
            return "one of " + ", ".join(self.choices)
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        return f"{'(' if self.low_open or self.low is None else '['}{lo}, {hi}{')' if self.high_open or self.high is None else ']'}"

    def check(self, value, scheme: str) -> None:
        """Raise :class:`OptionError` naming the flag, the range and the value when ``value`` is outside."""
        if value is None:
            return
        if self.type is bool:
            ok = isinstance(value, bool)
        elif self.choices is not None:
            ok = value in self.choices
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if ok and self.type is int:
                ok = float(value) == int(value)
            if ok and self.low is not None:
                ok = value > self.low if self.low_open else value >= self.low
            if ok and self.high is not None:
                ok = value < self.high if self.high_open else value <= self.high
        if not ok:
            raise OptionError(
                f"{self.flag} (model.{self.dest}) must be "
                f"{'an integer in ' if self.type is int else '' if self.choices else 'in '}{self.range_text()}"
                f" for --residual-scheme {scheme}, got {value!r}: {self.help}"
            )


@dataclass(frozen=True)
class SpeedGoal:
    """A scheme's speed goal in the speed benchmark (``scripts/speed_benchmark.py``, ``docs/speed.md``): the
    smallest ratio to the stock fairseq model it builds on (:attr:`ResidualScheme.builds_on`) for training and
    generation throughput, the largest for peak training memory. The default holds a scheme that adds
    computation to fairseq's layers within 3% of stock."""

    train: float = 0.97
    memory: float = 1.05
    generate: float = 0.97


#: the goal of the schemes with n residual streams per position (hyper-connections, mHC, mHC-lite), at n = 4:
#: they cost time and memory by construction; at least 0.8x stock Pre-LN's training and generation throughput,
#: at most 1.35x its peak memory (docs/speed.md)
MULTI_STREAM_GOAL = SpeedGoal(train=0.80, memory=1.35, generate=0.80)


def setting(cfg, group: str, key: str, default=None):
    """``cfg.<group>.<key>`` of fairseq's config (``FairseqConfig`` / ``DictConfig``), or ``default`` where the group
    or key is absent or None."""
    value = getattr(getattr(cfg, group, None), key, None)
    return default if value is None else value


def largest_setting(cfg, group: str, keys, default=0):
    """The largest ``cfg.<group>.<key>`` over ``keys`` (one name, or its aliases across fairseq's optimizers and
    schedules), and over every parameter group of ``--optimizer composite`` (``cfg.optimizer.groups[name].<group>``,
    ``fairseq/optim/composite.py``), which trains each group with its own optimizer and schedule; ``default`` where
    none is set. For settings where any group's value counts (weight decay, warm-up)."""
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    sources = [getattr(cfg, group, None)]
    groups = setting(cfg, "optimizer", "groups")
    if groups is not None and setting(cfg, "optimizer", "_name") == "composite":
        sources += [getattr(g, group, None) for g in groups.values()]
    found = [getattr(source, key, None) for source in sources for key in keys]
    return max([v for v in found if v is not None], default=default)


def unwrap_model(model):
    """The model inside fairseq's and torch's wrappers (DDP, FSDP and its flattening wrapper keep it as ``.module``)."""
    while not hasattr(model, "encoder") and isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def scheme_of(model) -> Optional["ResidualScheme"]:
    """The residual scheme of a ``residual_transformer`` (wrapped or not), or None for a model of another kind."""
    return getattr(getattr(unwrap_model(model), "encoder", None), "scheme", None)


class ResidualScheme:
    """One residual/normalisation scheme of ``residual_transformer``.

    Class attributes every scheme sets:
        name: the ``--residual-scheme`` value and preset suffix (``post_ln``).
        label: the field's name for it (``Post-LN``), used in tables and plots.
        scheme_id: the integer stored in every checkpoint (buffer ``residual_scheme_id``); fixed
            forever once released, never reused.
        color: matplotlib colour of the scheme in every plot of the project.
        update: the update of one sub-layer ``F`` as a formula (README's scheme table and ``--help``).
        output: the stack output as a formula.
        init: what the scheme initialises after fairseq's initialisation (Markdown), or "".
        source: the paper (and equation or section) the formula comes from (Markdown).
        reference: the reference implementation followed (repository and file; where the references
            disagree, which one and what the other does), or "" (Markdown).
        reading: where the authors never defined the encoder-decoder case, the project's reading of it
            (README and the module docstring say it is ours), or "".
        recipe: the training recipe the scheme's authors used (docs/schemes.md, Markdown), or "".
        fp16_advice: what its running sums need in fp16, from the measurements of ``docs/precision.md``
            (the compatibility table of docs/schemes.md, Markdown); what the code refuses is found by
            :func:`fairseq_residual.schemes.docs.refusals`, not written here.
        optim_overrides: what the scheme's parameters set for themselves through fairseq's per-parameter
            ``optim_overrides`` (:mod:`fairseq_residual.optim_groups`), as "trains ..." completes it, or "" for
            none. fairseq's flat ``--fp16`` master copy has no room for per-parameter settings: such a scheme
            refuses it (:meth:`check_training`) and ``scripts/train.sh`` adds ``common.fp16_no_flatten_grads=true``.
        optim_overrides_keys: the settings those overrides touch; ``{"weight_decay"}`` alone is harmless
            with ``--weight-decay 0``.
        fairseq_path: True for the schemes that are fairseq's own layers and loops (Post-LN, Pre-LN).
        builds_on: the stock fairseq transformer the scheme modifies, ``post_ln`` or ``pre_ln`` (the
            baseline of its speed and memory ratios): ``pre_ln`` for schemes with a final LayerNorm.
        normalize_before: fairseq's ``normalize_before`` of a fairseq-path scheme; for any scheme, True
            means ``--{encoder,decoder}-normalize-before`` is accepted (it would otherwise contradict
            where the scheme puts LayerNorm, and is refused).
        final_norm_eps: eps of the final LayerNorm of each stack of a protocol scheme, None for none
            (:meth:`final_norm` may make it depend on the model's options).
        final_norm_needed: why the stack output's formula holds the final LayerNorm (``--no-decoder-final-norm``
            is then refused), or "" where the output is the last state, which ``--no-decoder-final-norm``
            leaves unnormalised in the decoder as fairseq's Pre-LN does.
        has_layer_norm: False for schemes without any LayerNorm (``--layernorm-embedding`` is refused, and
            every ``--norm`` but ``layernorm``).
        norm_refusals: ``{norm: why}``, the ``--norm`` values the scheme refuses (docs/schemes.md's compatibility
            table shows the reasons): where its maths (its exactness, or the argument behind its initialisation)
            holds for LayerNorm's statistics only; :meth:`norm_refusal` may make a refusal conditional.
        formula_norms: the normalisations of the scheme's own formula that are not LayerNorm modules and that
            ``--norm`` leaves as they are (Markdown, docs/schemes.md's compatibility table), or "".
        layerdrop: True when ``--{encoder,decoder}-layerdrop`` is allowed; else :attr:`no_layerdrop_reason`.
        OPTIONS: the scheme's own options (:class:`Option`).
        speed_goal: its goal in the speed benchmark (:class:`SpeedGoal`), or None for a scheme that is slower
            and larger than stock by construction (its ratios are measured and reported, not judged).
    """

    name: str = ""
    label: str = ""
    scheme_id: int = -1
    color: str = "tab:gray"
    update: str = ""
    output: str = ""
    init: str = ""
    source: str = ""
    reference: str = ""
    reading: str = ""
    recipe: str = ""
    fp16_advice: str = ""
    optim_overrides: str = ""
    optim_overrides_keys: FrozenSet[str] = frozenset()
    fairseq_path: bool = False
    builds_on: str = "pre_ln"
    normalize_before: bool = False
    final_norm_eps: Optional[float] = 1e-5
    final_norm_needed: str = ""
    has_layer_norm: bool = True
    norm_refusals: Mapping[str, str] = {}
    formula_norms: str = ""
    layerdrop: bool = True
    no_layerdrop_reason: str = ""
    OPTIONS: Tuple[Option, ...] = ()
    speed_goal: Optional[SpeedGoal] = SpeedGoal()

    # ------------------------------------------------------------------ options
    def add_args(self, parser: argparse.ArgumentParser) -> None:
        """Add :attr:`OPTIONS` to the model parser (no defaults: fairseq's presets fill them)."""
        for o in self.OPTIONS:
            if o.type is bool:
                default = o.flag if o.default else o.negative
                parser.add_argument(o.flag, dest=o.dest, action="store_const", const=True,
                                    help=f"{self.label}: {o.help}; default {default}")
                parser.add_argument(o.negative, dest=o.dest, action="store_const", const=False,
                                    help=f"{self.label}: see {o.flag}")
                continue
            extra = {"choices": o.choices} if o.choices else {"type": o.type}
            default = f"; default {o.default_text}" if o.default_text else "" if o.default is None else f"; default {o.default}"
            rng = "" if o.choices or o.type is str else f"; range {o.range_text()}"  # a str: a path, a name
            parser.add_argument(o.flag, metavar=o.metavar, help=f"{self.label}: {o.help}{rng}{default}", **extra)

    def fill_defaults(self, args) -> None:
        """Fill this scheme's options the user did not give (fairseq ``--arch`` preset convention).
        Called for every registered scheme, whichever is selected, so checkpoints hold every key."""
        for o in self.OPTIONS:
            if getattr(args, o.dest, None) is None and o.default is not None:
                setattr(args, o.dest, o.default)

    def given_options(self, args, typed=frozenset()):
        """The flags of this scheme's options set to something else than their default, or whose key
        (``hc_streams``) is in ``typed`` (typed on the command line, at the default or not)."""
        given = []
        for o in self.OPTIONS:
            value = getattr(args, o.dest, None)
            if o.dest in typed or o.default is not None and value is not None and value != o.default:
                given.append(o.negative if o.type is bool and not value else o.flag)
        return given

    def validate(self, args) -> None:
        """Check every option of this scheme against its range (whichever scheme is selected).

        Raises:
            OptionError: naming the flag, its range and the value.
        """
        for o in self.OPTIONS:
            o.check(getattr(args, o.dest, None), self.name)

    def options(self, args) -> Any:
        """This scheme's constants read from validated ``args`` (None when it has none)."""
        return None

    def check_args(self, args) -> None:
        """Refuse fairseq options this scheme cannot honour (called only for the selected scheme).

        Raises:
            ValueError: naming the option and the fix.
        """
        if not self.normalize_before:
            for stack in STACKS:
                if getattr(args, f"{stack}_normalize_before", False):
                    loading = (f"a checkpoint saves {stack}_normalize_before=True with the Pre-LN-type scheme it "
                               f"was trained with, so if --model-overrides sets residual_scheme or "
                               f"{stack}_normalize_before, drop it (the checkpoint names its scheme, and its weights "
                               f"are that scheme's)")
                    training = (f"the scheme decides where LayerNorm goes; drop --{stack}-normalize-before or use "
                                f"--residual-scheme pre_ln")
                    raise SettingError(
                        f"--{stack}-normalize-before asks for Pre-LN but --residual-scheme is "
                        f"{self.name}: {advice_for_this_tool(loading, training)}"
                    )
        if self.final_norm_needed and getattr(args, "no_decoder_final_norm", False):
            raise SettingError(
                f"--no-decoder-final-norm drops the decoder's final LayerNorm, which --residual-scheme {self.name} "
                f"needs: {self.final_norm_needed}; drop --no-decoder-final-norm"
            )
        if not self.has_layer_norm and getattr(args, "layernorm_embedding", False):
            raise SettingError(
                f"--layernorm-embedding adds a LayerNorm but --residual-scheme {self.name} has none anywhere: "
                f"drop --layernorm-embedding"
            )
        if not self.layerdrop:
            for stack in STACKS:
                if (getattr(args, f"{stack}_layerdrop", 0) or 0) > 0:
                    raise SettingError(
                        f"--{stack}-layerdrop is not supported with --residual-scheme {self.name}: "
                        f"{self.no_layerdrop_reason}; drop --{stack}-layerdrop"
                    )
                if getattr(args, f"{stack}_layers_to_keep", None):
                    raise SettingError(
                        f"--{stack}-layers-to-keep is not supported with --residual-scheme {self.name}: "
                        f"{self.no_layerdrop_reason}; drop --{stack}-layers-to-keep"
                    )

    def norm_refusal(self, norm: str, args) -> Optional[str]:
        """Why this scheme cannot run with ``--norm norm`` given the options ``args``, or None (default: none
        for ``layernorm``; every other norm refused where the scheme has no LayerNorm; else
        :attr:`norm_refusals`)."""
        if norm == "layernorm":
            return None
        if not self.has_layer_norm:
            return "it has no LayerNorm to replace"
        return self.norm_refusals.get(norm)

    # ------------------------------------------------------------------ building (protocol schemes)
    def sublayer_residual(self, cfg, site) -> SublayerResidual:
        """The residual of the sub-layer at ``site`` (default: Pre-LN's)."""
        return SublayerResidual(site)

    def stack_residual(self, cfg, stack: str, num_layers: int, embed_dim: int) -> StackResidual:
        """The residual of a stack (default: one stream)."""
        return StackResidual(stack, num_layers, embed_dim)

    def final_norm(self, cfg, stack: str) -> Optional[float]:
        """The eps of ``stack``'s final LayerNorm, None for none (default :attr:`final_norm_eps`)."""
        return self.final_norm_eps

    def encoder_layer(self, cfg, residuals):
        """The encoder layer holding ``residuals`` (``{kind: SublayerResidual}``)."""
        from ..layers import ResidualEncoderLayer

        return ResidualEncoderLayer(cfg, residuals)

    def decoder_layer(self, cfg, residuals, no_encoder_attn: bool):
        """The decoder layer holding ``residuals``."""
        from ..layers import ResidualDecoderLayer

        return ResidualDecoderLayer(cfg, residuals, no_encoder_attn=no_encoder_attn, scheme=self.name)

    def initialize(self, model, options: SchemeOptions) -> None:
        """Re-initialise parameters after fairseq's own initialisation (depth-scaled schemes); ``options`` are the
        model's validated options (:class:`SchemeOptions`: this scheme's constants in ``options.params``, the
        trained depth in ``options.depth(stack)``)."""

    #: True when :meth:`training_hook` must run before the first training forward of a new model
    needs_training_hook: bool = False

    def training_hook(self, model, net_input) -> None:
        """Runtime machinery before the first training forward (``model(**net_input)`` follows)."""

    def warn_before_hook(self, model) -> None:
        """Called when ``model`` runs in eval mode (or is scripted) before its training hook ran."""

    def check_training(self, cfg, model) -> None:
        """Refuse or log training settings this scheme cannot honour, before fairseq's Trainer is built
        (:mod:`fairseq_residual.training_checks`): ``cfg`` is fairseq's whole config (``common``,
        ``distributed_training``, ``optimizer``, ``lr_scheduler``, ...; read it with :func:`setting`), which
        ``fairseq-hydra-train`` does not give :meth:`check_args`; ``model`` the built model (unwrapped). Default:
        refuse fairseq's flat fp32 master copy (``--fp16`` without ``--fp16-no-flatten-grads``,
        ``fairseq/optim/fp16_optimizer.py``) where the scheme has :attr:`optim_overrides`: the copy is one tensor in
        one parameter group, with no room for them. A scheme that overrides this calls it first.

        Raises:
            ValueError: naming the setting and the fix (fairseq-train's flag and the Hydra key); here flat ``--fp16``
                (not memory-efficient, not bf16) for a scheme with overrides (those of weight decay only: when
                ``--weight-decay`` > 0).
        """
        flat = setting(cfg, "common", "fp16", False) and not any(
            setting(cfg, "common", key, False) for key in ("memory_efficient_fp16", "fp16_no_flatten_grads", "bf16"))
        why = flat_master_copy_refusal(flat, self.optim_overrides_keys if self.optim_overrides else (),
                                       setting(cfg, "optimizer", "weight_decay", 0))
        if why:
            raise SettingError(f"--residual-scheme {self.name} trains {self.optim_overrides}, but {why}")

    def after_optimizer_step(self, model, optimizer) -> None:
        """Called after every optimizer step of ``fairseq-train`` (fairseq's ``task.optimizer_step``), with the model
        (unwrapped from DDP) and fairseq's optimizer (:mod:`fairseq_residual.optimizer_step`): nGPT's renormalisation
        of its weights. Default: nothing."""

    def upgrade_state_dict(self, state_dict, prefix: str, stack: str, options: SchemeOptions) -> None:
        """Rename the parameters of older checkpoints of this scheme in place (keys start with ``prefix``,
        e.g. ``encoder.``); ``options`` say which trained layers the loading model keeps."""

    def __reduce__(self):
        """Copies and pickles (of the options that carry it) are the registered scheme itself."""
        from . import get_scheme

        return get_scheme, (self.name,)

    def __repr__(self):
        return f"<residual scheme {self.name} ({self.label})>"

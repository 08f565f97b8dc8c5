"""Options of the ``residual_transformer`` model: the residual scheme and ResiDual's two constants.

The three schemes (reference notes section 1; Xie et al. 2023, arXiv 2304.14802, section 3):

========== ======================================================= ==================================
scheme     update per sub-layer ``F`` (``drop`` = dropout)         stack output
========== ======================================================= ==================================
post_ln    ``x = LN(x + drop(F(x)))``                              ``x``
pre_ln     ``x = x + drop(F(LN(x)))``                              ``LN_final(x)``
resi_dual  ``h = drop(F(x_a)); x_a = LN(x_a + h); x_d = x_d + c*h`` ``alpha * x_a + LN_final(x_d)``
========== ======================================================= ==================================

``c`` (``--resi-dual-scale``) and ``alpha`` (``--{encoder,decoder}-resi-dual-alpha``) are per stack, as in
the authors' code.
"""
import argparse
import math
from dataclasses import dataclass

POST_LN = "post_ln"
PRE_LN = "pre_ln"
RESI_DUAL = "resi_dual"
SCHEMES = (POST_LN, PRE_LN, RESI_DUAL)
DEFAULT_SCHEME = RESI_DUAL

# Stored in every checkpoint (buffer ``{encoder,decoder}.residual_scheme_id``) so that a checkpoint
# of one scheme cannot be loaded silently into a model of another.
SCHEME_IDS = {POST_LN: 0, PRE_LN: 1, RESI_DUAL: 2}

# eps of ResiDual's final LayerNorm over the dual stream (the authors' value; fairseq's default is 1e-5).
# LN(c * x_d) == LN(x_d) only when eps is negligible against var(c * x_d), hence the tiny value.
RESI_DUAL_FINAL_LN_EPS = 1e-7

# fp16's largest finite value; the dual stream x_d must stay below it.
FP16_MAX = 65504.0


def add_residual_args(parser):
    """Add the residual-scheme options to a fairseq model parser.

    No defaults are set here: fairseq parses model options with ``argparse.SUPPRESS`` so that the
    ``--arch`` presets (``residual_base_architecture`` and its variants) fill what the user left out.
    """
    parser.add_argument(
        "--residual-scheme",
        choices=SCHEMES,
        help="where LayerNorm sits relative to the residual connection: post_ln (Vaswani et al. 2017), "
        "pre_ln (normalize_before), or resi_dual (Pre-Post-LN, Xie et al. 2023); default: resi_dual, "
        "or the scheme named by the --arch preset",
    )
    parser.add_argument(
        "--resi-dual-scale",
        type=float,
        metavar="C",
        help="ResiDual: scale c of the dual stream, x_d = c*emb + c*sum(h), for both stacks; "
        "0 < c <= 1 (default 1.0); a small c (e.g. 0.05) keeps x_d inside the fp16 range without "
        "changing the output, since LN(c*x) = LN(x)",
    )
    parser.add_argument(
        "--encoder-resi-dual-scale",
        type=float,
        metavar="C",
        help="ResiDual: dual-stream scale c of the encoder (default: --resi-dual-scale)",
    )
    parser.add_argument(
        "--decoder-resi-dual-scale",
        type=float,
        metavar="C",
        help="ResiDual: dual-stream scale c of the decoder (default: --resi-dual-scale)",
    )
    parser.add_argument(
        "--encoder-resi-dual-alpha",
        type=float,
        metavar="A",
        help="ResiDual: weight alpha of the Post-LN stream in the encoder output "
        "alpha*x_a + LN(x_d) (default 1.0)",
    )
    parser.add_argument(
        "--decoder-resi-dual-alpha",
        type=float,
        metavar="A",
        help="ResiDual: weight alpha of the Post-LN stream in the decoder output "
        "alpha*x_a + LN(x_d) (default 1.0)",
    )


def residual_defaults(args, scheme=DEFAULT_SCHEME):
    """Fill the residual options the user did not give (fairseq ``--arch`` preset convention).

    Args:
        args: argparse.Namespace or omegaconf DictConfig (open for writing) of the model.
        scheme: the scheme this preset stands for when ``--residual-scheme`` was not given.
    """
    args.residual_scheme = getattr(args, "residual_scheme", None) or scheme
    shared = getattr(args, "resi_dual_scale", None)
    args.resi_dual_scale = 1.0 if shared is None else shared
    for stack in ("encoder", "decoder"):
        key = f"{stack}_resi_dual_scale"
        if getattr(args, key, None) is None:
            setattr(args, key, args.resi_dual_scale)
        key = f"{stack}_resi_dual_alpha"
        if getattr(args, key, None) is None:
            setattr(args, key, 1.0)


@dataclass(frozen=True)
class ResidualOptions:
    """The validated residual options of one model.

    Attributes:
        scheme: one of ``post_ln``, ``pre_ln``, ``resi_dual``.
        encoder_scale, decoder_scale: ResiDual's dual-stream scale c per stack, 0 < c <= 1.
        encoder_alpha, decoder_alpha: ResiDual's output weight alpha per stack (finite).
    """

    scheme: str = DEFAULT_SCHEME
    encoder_scale: float = 1.0
    decoder_scale: float = 1.0
    encoder_alpha: float = 1.0
    decoder_alpha: float = 1.0

    def __post_init__(self):
        if self.scheme not in SCHEMES:
            raise ValueError(
                f"unknown residual scheme {self.scheme!r}: choose one of {', '.join(SCHEMES)} "
                f"(--residual-scheme / model.residual_scheme)"
            )
        for name in ("encoder_scale", "decoder_scale"):
            c = getattr(self, name)
            if not (isinstance(c, (int, float)) and math.isfinite(c) and 0.0 < c <= 1.0):
                flag = "--" + name.replace("_scale", "-resi-dual-scale")
                raise ValueError(
                    f"{flag} (or --resi-dual-scale) must be in (0, 1], got {c!r}: it scales the dual "
                    f"stream x_d = c*emb + c*sum(h); use 1.0 for fp32/bf16 and e.g. 0.05 for fp16"
                )
        for name in ("encoder_alpha", "decoder_alpha"):
            a = getattr(self, name)
            if not (isinstance(a, (int, float)) and math.isfinite(a)):
                flag = "--" + name.replace("_alpha", "-resi-dual-alpha")
                raise ValueError(f"{flag} must be a finite number, got {a!r}")

    @classmethod
    def from_args(cls, args):
        """Read and validate the options from a Namespace / DictConfig filled by ``residual_defaults``.

        Raises:
            ValueError: unknown scheme, c outside (0, 1], non-finite alpha, or a
                ``--{encoder,decoder}-normalize-before`` that contradicts the scheme.
        """
        opts = cls(
            scheme=args.residual_scheme,
            encoder_scale=float(args.encoder_resi_dual_scale),
            decoder_scale=float(args.decoder_resi_dual_scale),
            encoder_alpha=float(args.encoder_resi_dual_alpha),
            decoder_alpha=float(args.decoder_resi_dual_alpha),
        )
        if opts.scheme != PRE_LN:
            for stack in ("encoder", "decoder"):
                if getattr(args, f"{stack}_normalize_before", False):
                    raise ValueError(
                        f"--{stack}-normalize-before asks for Pre-LN but --residual-scheme is "
                        f"{opts.scheme}: the scheme decides where LayerNorm goes; drop "
                        f"--{stack}-normalize-before or use --residual-scheme pre_ln"
                    )
        return opts

    def scale(self, stack):
        """Dual-stream scale c of ``stack`` ('encoder' or 'decoder')."""
        return self.encoder_scale if stack == "encoder" else self.decoder_scale

    def alpha(self, stack):
        """Output weight alpha of ``stack`` ('encoder' or 'decoder')."""
        return self.encoder_alpha if stack == "encoder" else self.decoder_alpha


def as_namespace(args):
    """Return ``args`` as an ``argparse.Namespace`` (a resolved copy when it is an omegaconf config).

    fairseq-hydra-train hands legacy models a DictConfig; ``TransformerConfig.from_namespace``
    keeps only the keys it declares from a DictConfig but every key from a Namespace, so the
    residual options survive only in a Namespace (reference notes, section 5).
    """
    if isinstance(args, argparse.Namespace):
        return args
    from omegaconf import OmegaConf

    if OmegaConf.is_config(args):
        return argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
    raise TypeError(f"expected an argparse.Namespace or an omegaconf config, got {type(args).__name__}")

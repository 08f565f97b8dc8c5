"""Mixed precision, for every registered scheme (read from the registry).

* **Training in bf16 and fp16** through fairseq's Trainer and its reduced-precision optimizer wrappers on the
  CPU (bf16 with fairseq's fp32 master copy, Admin from a profile file; ``--memory-efficient-fp16`` with a small
  initial loss scale): finite losses, every weight in the reduced dtype, and every weight moved. fairseq's
  flat ``--bf16`` / ``--fp16`` cannot run on a CPU (its fp32 copy is made on ``torch.cuda.current_device()``):
  here the copy is per parameter (``--fp16-no-flatten-grads``), the same arithmetic. ``fairseq-train --bf16``
  also turns on ``--tpu`` (fairseq issue 4696), which fairseq-hydra-train (``scripts/train.sh``) does not: these
  tests build the Trainer as hydra does. Without a master copy (``--memory-efficient-bf16``) bf16 weights take
  no update below half their spacing (2^-9 of their size): LayerNorm gains at 1, Admin's omegas, stay where
  they are at learning rates below about 4e-3.
* **The forward in bf16 / fp16 agrees with fp32** (the same weights, rounded to the dtype; scheme parameters
  randomised; eval mode): log-probabilities within :data:`FORWARD_TOL`. Measured at 3+3 layers with the test's
  seed 0 (2026-12-04, every registered scheme): at most 0.049 in bf16 (Attention Residuals; ResiDual, whose output
  adds two normalised streams, 0.045) and 0.0064 in fp16; fairseq's own Pre-LN 0.025 and 0.0032. The seed is
  fixed, so the tolerances leave 1.6x / 1.9x for another CPU's kernels rounding the same weights differently; they
  do not bound every draw: over seeds 0-7 the largest were 0.060 (ResiDual) and 0.016 (Attention Residuals), and
  0.133 / 0.026 for hyper-connections at seed 1, whose random A_r grow the streams.
* **The residual arithmetic** (every call of every residual object during a forward, replayed with its inputs
  rounded to the dtype): (a) within :data:`RESIDUAL_UNITS` unit roundoffs of the exact result on the same
  rounded inputs, relative to the output's largest magnitude (two roundings: DeepNorm's ``alpha*x + h``
  measures 1.7, one rounding at most 1), and (b) no coefficient computed from the data in reduced precision:
  no exponential, logarithm, tanh, sigmoid, root, power, data-dependent division or reduction (sum, mean,
  norm, ...) runs on a bf16/fp16 tensor inside a residual object (LayerNorm is allowed: its kernels
  accumulate in fp32). Hyper-connection-type schemes compute their mixing coefficients in fp32; a test-local
  gate computing the same in bf16 fails (b) while its fp32 twin passes, so the check would catch a scheme that
  does not.
* **fairseq's fp32 master copy** (``--bf16`` / ``--fp16`` without ``--memory-efficient-*``; run here with
  ``--fp16-no-flatten-grads``, the same copy per parameter instead of one flat buffer) is made before the first
  batch and copied back after every step: a scheme that sets state on that batch (Admin's profiled omegas)
  would lose it. Every scheme either refuses those options, naming the alternative, or ends its first update
  with the state of a run without a master copy (``--memory-efficient-*``); Admin with its refusal removed
  shows the difference the refusal prevents.
* fp16 on a CPU: fairseq's Trainer answers the loss scaler's overflows (its normal first ones included) with
  ``torch.tensor(0.0).cuda()``; the Trainer's construction warns, naming the alternatives
  (``tests/test_training_checks.py``).
"""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import build_model, make_dictionary, random_batch
from references import CONFORMANCE_NOISE
from test_conformance import randomise_scheme_parameters
from fairseq_residual.residual import NORM_INPUT, Site, StackResidual, SublayerResidual, with_main
from fairseq_residual.schemes import SCHEME_NAMES, SCHEMES, get_scheme
from trainers import samples, trainer


LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: unit roundoff of each dtype (half the distance from 1 to the next number)
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
#: largest |log-probability difference| to fp32 (1.6x / 1.9x the largest measured at the test's seed, see the module
#: docstring)
FORWARD_TOL = {torch.bfloat16: 0.08, torch.float16: 0.012}
#: noise of the forward test's randomised scheme parameters where 0.3 is out of the scheme's working range:
#: hyper-connections' unconstrained A_r = I + N(0, 0.3^2) per sub-layer grows the streams 166-fold over 3+3
#: layers, and the rounding with it (bf16 0.34, fp16 0.070; at 0.1: 0.029 and 0.0040; at initialisation
#: 0.020 and 0.0034), the unbounded composite gain that mHC's doubly stochastic H_res removes (arXiv
#: 2512.24880, section 3.1); mHC at 0.3: 0.018 and 0.0033; and the conformance suite's smaller noises
FORWARD_NOISE = {"hyper_connections": 0.1, **CONFORMANCE_NOISE}
#: largest error of one residual call, in unit roundoffs of its output's largest magnitude, at the test's draws
#: (seed 0): a measured bound, not a derived one. A convex combination with rounded coefficients (LAuReL-RW's
#: alpha h + beta x) errs by up to 2 units of each term before their sum, which cancellation can make smaller
#: than the terms: over init seeds 0-39 LAuReL-RW reaches 2.49 (seed 24; 1.85 at seed 0), the other schemes
#: 1.59 at most at seed 0; so the test fixes its draws rather than taking them from whatever ran before
RESIDUAL_UNITS = 2.0
DEPTH = ["--encoder-layers", 3, "--decoder-layers", 3]
PROTOCOL = [s.name for s in SCHEMES if not s.fairseq_path]


def tiny(scheme, *flags, d):
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", scheme, *DEPTH, *flags, dictionary=d)
    randomise_scheme_parameters(model, scale=0.3, mark_profiled=True)
    return model


# ---------------------------------------------------------------------------------------------
# training


#: how each precision trains here: bf16 with fairseq's fp32 master copy (what fairseq-hydra-train's
#: common.bf16=true does; per parameter instead of one flat buffer, which needs CUDA), fp16 without one
TRAIN = {"bf16": ["--bf16", "--fp16-no-flatten-grads"], "fp16": ["--memory-efficient-fp16"]}


def _profile_file(scheme, tmp_path):
    """A scheme that refuses the master copy without a file of its state (Admin: ``--admin-profile``) gets
    one, written from one fp32 update; other schemes get no flag."""
    if scheme != "admin":
        return []
    from fairseq_residual.schemes.admin_profile import write_profile

    tr, d = trainer(scheme)
    tr.train_step(samples(d, 1))
    model = tr.get_model()
    path = tmp_path / "profile.ratio.init"
    write_profile(path, model.encoder.residual.profile.tolist(), model.decoder.residual.profile.tolist())
    return ["--admin-profile", path]


def _trained_weights(tr):
    """``{name: weight}`` the optimizer updates: fairseq's fp32 master copy when it keeps one, else the model's."""
    names = [n for n, p in tr.get_model().named_parameters() if p.requires_grad]
    master = getattr(tr.optimizer, "fp32_params", None)
    params = master if isinstance(master, list) else [p for _, p in tr.get_model().named_parameters()]
    return {n: p.detach().clone() for n, p in zip(names, params)}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_trains_in_reduced_precision_through_fairseqs_optimizer(scheme, precision, tmp_path):
    """Three updates with finite losses. bf16: every weight moves (in the master copy, which keeps the updates
    bf16 rounds away), except the attention key biases, whose gradient is zero up to rounding (softmax ignores
    a shift), and mHC's gates alpha_res, whose gradient is zero up to rounding while its n streams are still equal
    in bf16 (they part by about 1e-4 of their size in the first updates, below bf16's spacing; the mHC module
    docstring). fp16: most weights move; gradients that carry a small factor underflow (ReZero's first updates:
    a branch weight's gradient carries alpha, about lr per update, twice in the encoder; docs/precision.md)."""
    extra = _profile_file(scheme, tmp_path) if precision == "bf16" else []
    tr, d = trainer(scheme, "--dropout", "0.1", *TRAIN[precision], *extra)
    batches = samples(d, 3)
    losses = [float(tr.train_step([batches[0]])["loss"])]
    before = _trained_weights(tr)  # after the first update: the optimizer (and its copy) exists
    losses += [float(tr.train_step([b])["loss"]) for b in batches[1:]]
    assert all(math.isfinite(x) for x in losses), losses
    assert {p.dtype for p in tr.get_model().parameters()} == {LOW[precision]}
    after = _trained_weights(tr)
    exempt = ("k_proj.bias", "alpha_res") if scheme in ("mhc", "mhc_lite") else ("k_proj.bias",)
    still = [n for n, w in after.items() if torch.equal(w, before[n]) and not n.endswith(exempt)]
    if precision == "bf16":
        assert still == [], f"never moved: {still}"
    else:
        assert len(still) < len(after) / 2, f"never moved: {still}"


# ---------------------------------------------------------------------------------------------
# the forward


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_the_forward_in_bf16_and_fp16_agrees_with_fp32(scheme):
    torch.manual_seed(0)  # the same model whichever tests ran before in this process (the error depends on it)
    d = make_dictionary()
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", scheme, *DEPTH, dictionary=d)
    randomise_scheme_parameters(model, scale=FORWARD_NOISE.get(scheme, 0.3), mark_profiled=True)
    src, lengths, prev, _ = random_batch(d, bsz=5)
    keep = prev.ne(d.pad())
    for dtype, tol in FORWARD_TOL.items():
        low = copy.deepcopy(model).to(dtype)
        exact = copy.deepcopy(low).double()  # the same (rounded) weights
        with torch.no_grad():
            out = low(src, lengths, prev)
            assert out[0].dtype == dtype
            lp = low.get_normalized_probs(out, log_probs=True)
            lp_exact = exact.get_normalized_probs(exact(src, lengths, prev), log_probs=True)
        err = float((lp.double() - lp_exact)[keep].abs().max())
        assert err <= tol, f"{dtype}: log-probabilities differ from fp32's by {err:.4g} > {tol}"


# ---------------------------------------------------------------------------------------------
# the residual arithmetic

SUBLAYER_METHODS = ("prepare", "update")
STACK_METHODS = ("start", "between", "final_input", "finish", "view")
#: aten operations that compute a coefficient from the data; under bf16/fp16 they must see fp32 tensors
COEFFICIENT_OPS = {
    "exp", "exp2", "expm1", "log", "log1p", "log2", "tanh", "sigmoid", "softmax", "_softmax", "log_softmax",
    "_log_softmax", "logsumexp", "sqrt", "rsqrt", "pow", "reciprocal", "erf", "sum", "mean", "var", "std",
    "var_mean", "std_mean", "norm", "linalg_vector_norm", "amax", "amin", "max", "min", "cumsum", "prod",
    "softplus", "atan", "atan2", "sin", "cos", "clamp_min", "clamp",
}


class ReducedPrecisionCoefficients(TorchDispatchMode):
    """Record the :data:`COEFFICIENT_OPS` (and divisions by a tensor with dimensions) that run on a bf16 or
    fp16 tensor."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        low = [a for a in list(args) + list(kwargs.values()) if torch.is_tensor(a) and a.dtype in UNIT]
        divides = name in ("div", "div_") and len(args) > 1 and torch.is_tensor(args[1]) and args[1].dim() > 0
        if low and (name in COEFFICIENT_OPS or divides):
            self.ops.append(name)
        return func(*args, **kwargs)


def _tensors(o):
    if torch.is_tensor(o):
        return [o]
    if isinstance(o, (list, tuple)):
        return [t for x in o for t in _tensors(x)]
    return []


def _cast(o, dtype):
    if torch.is_tensor(o):
        return o.to(dtype) if o.is_floating_point() else o
    if isinstance(o, dict):  # the protocol's context: a copy, as it was at the call
        return {k: _cast(v, dtype) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return type(o)(_cast(x, dtype) for x in o)
    return o


def record_residual_calls(model):
    """Wrap every residual object's protocol methods; return the list each call appends
    ``(module, method, float64 copy of the arguments)`` to. The wrappers are instance attributes."""
    calls = []
    for module in model.modules():
        methods = SUBLAYER_METHODS if isinstance(module, SublayerResidual) else \
            STACK_METHODS if isinstance(module, StackResidual) else ()
        for method in methods:
            def wrapper(*args, _f=getattr(module, method), _m=module, _n=method):
                calls.append((_m, _n, _cast(args, torch.float64)))
                return _f(*args)
            setattr(module, method, wrapper)
    return calls


def replay(module, method, args, dtype):
    """Run ``module.method(*args)`` in ``dtype`` (module and arguments rounded to it) and exactly (float64 on
    the same rounded values). Returns ``(largest error in unit roundoffs of the output's largest magnitude,
    the coefficient operations that ran in dtype)``."""
    low = copy.deepcopy(module)
    for name in SUBLAYER_METHODS + STACK_METHODS:
        low.__dict__.pop(name, None)  # the recording wrappers
    low.to(dtype)
    exact = copy.deepcopy(low).double()
    args_low = _cast(args, dtype)
    with torch.no_grad():
        with ReducedPrecisionCoefficients() as ops:
            out_low = _tensors(getattr(low, method)(*args_low))
        out_exact = _tensors(getattr(exact, method)(*_cast(args_low, torch.float64)))
    worst = 0.0
    for a, b in zip(out_low, out_exact):
        if b.is_floating_point() and float(b.abs().max()) > 0:
            assert a.dtype == dtype, f"{method} returned {a.dtype} under {dtype}"
            worst = max(worst, float((a.double() - b).abs().max()) / (UNIT[dtype] * float(b.abs().max())))
    return worst, ops.ops


def check_residual_arithmetic(calls, where=None):
    """``{dtype: (largest error in units, {method: coefficient ops in reduced precision})}`` over ``calls``;
    ``where``, a dict, gets ``{dtype: "Module.method (call i of n)"}`` of each largest error."""
    result = {}
    for dtype in UNIT:
        worst, ops = 0.0, {}
        for i, (module, method, args) in enumerate(calls):
            err, bad = replay(module, method, args, dtype)
            if err > worst and where is not None:
                where[dtype] = f"{type(module).__name__}.{method} (call {i + 1} of {len(calls)})"
            worst = max(worst, err)
            if bad:
                ops.setdefault(f"{type(module).__name__}.{method}", set()).update(bad)
        result[dtype] = (worst, ops)
    return result


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_the_residual_arithmetic_in_bf16_and_fp16(scheme):
    d = make_dictionary()
    torch.manual_seed(0)  # the model's own draws, whatever ran before in this process
    model = tiny(scheme, d=d).double()
    calls = record_residual_calls(model)
    src, lengths, prev, _ = random_batch(d, bsz=5)
    with torch.no_grad():
        model(src, lengths, prev)
    if get_scheme(scheme).fairseq_path:
        assert calls == []  # fairseq's own layers: no residual object runs
        return
    assert {m for _, m, _ in calls} >= {"prepare", "update", "start", "finish"}
    where = {}
    for dtype, (worst, ops) in check_residual_arithmetic(calls, where).items():
        assert ops == {}, f"{dtype}: coefficients computed in {dtype}: {ops}"
        assert worst <= RESIDUAL_UNITS, f"{dtype}: a residual call is {worst:.2f} unit roundoffs off: {where[dtype]}"


class _Gate(SublayerResidual):
    """``x = x + g * h`` with a data-dependent gate ``g = 1 + s * tanh(LN(x) . w)`` per position, computed in fp32
    (``fp32=True``, as hyper-connections compute their coefficients) or in the model's dtype."""

    NORM = NORM_INPUT

    def __init__(self, site, fp32):
        super().__init__(site)
        self.fp32 = fp32
        self.w = nn.Parameter(torch.randn(site.embed_dim))
        self.s = nn.Parameter(torch.tensor(0.7))

    def update(self, state, out, ctx):
        x = state[0]
        if self.fp32:
            g = 1 + self.s.float() * torch.tanh(F.layer_norm(x.float(), x.shape[-1:]) @ self.w.float())
            return with_main(state, (x.float() + g.unsqueeze(-1) * out.float()).to(x.dtype))
        g = 1 + self.s * torch.tanh(F.layer_norm(x, x.shape[-1:]) @ self.w)
        return with_main(state, x + g.unsqueeze(-1) * out)


def test_the_check_catches_coefficients_computed_in_reduced_precision():
    """Negative control: the gate computed in bf16/fp16 is caught (tanh, and the LayerNorm's statistics never
    leave fp32); its fp32 twin passes."""
    site = Site(stack="decoder", kind="ffn", layer=0, layers=1, index=2, per_layer=3, embed_dim=64,
                encoder_layers=1, decoder_layers=1)
    torch.manual_seed(0)
    x, h = torch.randn(7, 5, 64, dtype=torch.float64), torch.randn(7, 5, 64, dtype=torch.float64)
    for fp32 in (True, False):
        gate = _Gate(site, fp32).double()
        result = check_residual_arithmetic([(gate, "update", ([x], h, {}))])
        for dtype, (worst, ops) in result.items():
            if fp32:
                assert ops == {} and worst <= RESIDUAL_UNITS, (dtype, worst, ops)
            else:
                assert ops == {"_Gate.update": {"tanh"}}, (dtype, ops)


# ---------------------------------------------------------------------------------------------
# fairseq's fp32 master copy

#: per precision: (the flags with fairseq's fp32 master copy, the flags without one)
MASTER_COPY = {
    "bf16": (["--bf16", "--fp16-no-flatten-grads"], ["--memory-efficient-bf16"]),
    "fp16": (["--fp16", "--fp16-no-flatten-grads", "--fp16-init-scale", 8],
             ["--memory-efficient-fp16", "--fp16-init-scale", 8]),
}


def _after_one_update(scheme, flags):
    tr, d = trainer(scheme, "--dropout", "0", *flags)
    tr.train_step(samples(d, 1))
    return {n: t.double() for n, t in tr.get_model().state_dict().items()}


def _largest_difference(a, b):
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def _largest_excess(a, b, spacing):
    """The largest ``|a - b| - spacing |a|`` over every entry: how far two trainings part beyond one rounding
    step of the low-precision weights (spacing: the distance between neighbouring numbers, relative)."""
    return max(float(((a[n] - b[n]).abs() - spacing * a[n].abs()).max()) for n in a)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_fairseqs_fp32_master_copy_keeps_the_schemes_state_or_is_refused(scheme, precision):
    master, plain = MASTER_COPY[precision]
    try:
        with_copy = _after_one_update(scheme, master)
    except ValueError as e:
        # fp16: fairseq-train's flag; bf16: Hydra's key (fairseq-train's --memory-efficient-bf16 turns on --tpu)
        flag = {"fp16": "--memory-efficient-fp16", "bf16": "common.memory_efficient_bf16=true"}[precision]
        assert flag in str(e), f"{scheme} refuses {master} without naming {flag}: {e}"
        return
    without = _after_one_update(scheme, plain)
    # the two optimizers round the same Adam step (about lr = 1e-3) differently: at most 3.1e-4 measured, and one
    # more rounding step of the weight where a scheme rounds it again after the step (nGPT's renormalisation of
    # unit rows, whose entries reach 0.25-0.5: 2^-7 of that in bf16); the state the negative control loses is
    # 0.3 or more
    spacing = 2 * UNIT[LOW[precision]]
    assert _largest_excess(with_copy, without, spacing) <= 1e-3, "the fp32 master copy undid part of the state"


def test_the_master_copy_check_catches_state_set_on_the_first_batch(monkeypatch):
    """Negative control: Admin without its refusal loses its profiled omegas to the master copy."""
    from fairseq_residual.schemes.admin import Admin
    from fairseq_residual.schemes.base import ResidualScheme

    monkeypatch.setattr(Admin, "check_training", ResidualScheme.check_training)
    master, plain = MASTER_COPY["bf16"]
    assert _largest_difference(_after_one_update("admin", master), _after_one_update("admin", plain)) > 0.1


# ---------------------------------------------------------------------------------------------
# Admin's refusal of the master copy


def test_admins_bf16_refusal_says_what_memory_efficient_bf16_does_to_the_omegas():
    """Admin refuses --bf16 (fairseq's master copy would overwrite its profile) and names the alternatives; the
    one without a master copy keeps the profile but freezes the omegas: bf16 weights take no update below half
    their spacing, 2^-9 of their size (0.003 at omega 1.5), and Adam moves a weight by about lr = 1e-3."""
    with pytest.raises(ValueError) as refusal:
        trainer("admin", "--bf16", "--fp16-no-flatten-grads")
    assert "--admin-profile" in str(refusal.value) and "common.memory_efficient_bf16=true" in str(refusal.value)
    assert "2^-9" in str(refusal.value)

    tr, d = trainer("admin", "--memory-efficient-bf16")
    batches = samples(d, 3)
    tr.train_step([batches[0]])
    model = tr.get_model()
    omegas = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith(".omega")}
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith("fc1.weight")}
    for b in batches[1:]:
        tr.train_step([b])
    params = dict(model.named_parameters())
    assert all(torch.equal(params[n], v) for n, v in omegas.items())  # frozen at their profile
    assert not any(torch.equal(params[n], v) for n, v in weights.items())  # small weights still train

"""The measurements of ``fairseq-residual-analyze``: per-layer gradient norms, consecutive-layer cosine
similarity, the extra streams a scheme names and the fp16 range of the one it declares ranged (ResiDual's dual
stream; see the package docstring), and the ``--resi-dual-scale`` rule. What a scheme's state holds is read
from its stack residual (:meth:`~fairseq_residual.residual.StackResidual.streams`,
:meth:`~fairseq_residual.residual.StackResidual.ranged_stream`), never named here."""
import math

import torch

from ..config import FP16_MAX
from ..schemes import SCHEME_NAMES as SCHEMES
from ..schemes import stock_scheme
from .common import HOOKED_MODULE, STACKS, SUBLAYERS

# ---------------------------------------------------------------------------------------------
# the --resi-dual-scale rule
# ---------------------------------------------------------------------------------------------


def scale_ladder(smallest=1e-6):
    """The 1-2-5 series 1, 0.5, 0.2, 0.1, 0.05, ... down to ``smallest``, largest first."""
    out, decade = [], 1.0
    while decade >= smallest:
        out += [decade, decade / 2, decade / 5]
        decade /= 10
    return [c for c in out if c >= smallest]


def safe_dual_scale(max_abs_unscaled, safety=0.1, fp16_max=FP16_MAX):
    """Largest 1-2-5 value ``c <= 1`` with ``c * max_abs_unscaled <= safety * fp16_max``, or None.

    Args:
        max_abs_unscaled: the largest ``|x_d|`` of the dual stream with c = 1.
        safety: fraction of the fp16 range the dual stream may use, 0 < safety <= 1.
    """
    limit = safety * fp16_max
    for c in scale_ladder():
        if c * max_abs_unscaled <= limit:
            return c
    return None


# ---------------------------------------------------------------------------------------------
# the measurements
# ---------------------------------------------------------------------------------------------


def model_scheme(model):
    """Residual scheme of a model (plugin attribute, else the stock transformer's rule)."""
    scheme = getattr(model.encoder, "residual_scheme", None)
    if scheme in SCHEMES:
        return scheme
    return stock_scheme(getattr(model.encoder, "layer_norm", None) is not None)


def disable_dropout(model):
    """Set every dropout probability (and LayerDrop) of ``model`` to 0; return how many were > 0."""
    from fairseq.modules import FairseqDropout, LayerDropModuleList

    changed = 0
    for module in model.modules():
        if isinstance(module, (FairseqDropout, torch.nn.Dropout, LayerDropModuleList)):
            if module.p > 0:
                changed += 1
            module.p = 0.0
    return changed


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


class LayerStatistics:
    """The measurement of one model over K batches: per-layer gradient norms, consecutive-layer cosine
    similarity and the dual stream (see the package docstring).

    Use as a context manager: entering puts the model in train mode (dropout set to 0 unless
    ``keep_dropout``), clears its gradients and registers forward hooks on every layer and on the
    sub-modules whose outputs are the sub-layers' branches; :meth:`add_batch` runs the criterion and
    the backward pass of one batch and accumulates; leaving removes the hooks; :meth:`result` returns
    the measurements (lists run from layer 1, the lowest, up).

    Args:
        model: a fairseq encoder-decoder (``encoder.layers`` / ``decoder.layers`` with fairseq's
            sub-module names); its gradients are overwritten.
        total_tokens: target tokens of all K batches (each batch's loss is divided by it, as
            fairseq-train normalises an update of ``--update-freq K``).
        keep_dropout: measure with the model's dropout probabilities.
        safety: fraction of the fp16 range the dual stream may use (``safe_dual_scale``).
    """

    def __init__(self, model, total_tokens, keep_dropout=False, safety=0.1):
        self.model, self.total_tokens = model, total_tokens
        self.keep_dropout, self.safety = keep_dropout, safety
        self.scheme = model_scheme(model)
        self.stacks = {name: getattr(model, name) for name in STACKS}
        self.n_layers = n_layers = {name: len(stack.layers) for name, stack in self.stacks.items()}
        self.pad = {"encoder": model.encoder.padding_idx, "decoder": model.decoder.padding_idx}
        self.captured = {}  # (stack, sublayer, i) -> tensor with retained grad; (stack, "out", i) -> outputs
        self.hooks = []
        self.dropouts_disabled = 0

        zeros = lambda n: torch.zeros(n, dtype=torch.float64)  # noqa: E731
        self.sub_sq = {(s, sub): zeros(n_layers[s]) for s in STACKS for sub in SUBLAYERS[s]}
        self.cos_sum = {s: zeros(max(n_layers[s] - 1, 0)) for s in STACKS}
        self.cos_stream_sum = {s: {} for s in STACKS}  # extra stream name -> per layer pair
        self.between_sum = {s: zeros(n_layers[s]) for s in STACKS}  # mean pairwise cos between streams, per layer
        self.between_count = {s: zeros(n_layers[s]) for s in STACKS}
        self.mixing = {s: [[] for _ in range(n_layers[s])] for s in STACKS}  # per layer: [(batch weight, M)]
        self._masks = {}
        self.cos_count = {s: zeros(max(n_layers[s] - 1, 0)) for s in STACKS}  # token positions per pair
        # the stream each stack declares ranged (StackResidual.ranged_stream), its largest magnitude per layer
        # and its smallest per-position variance after the top layer
        self.ranged = {s: _ranged_stream(stack) for s, stack in self.stacks.items()}
        self.range_max = {s: zeros(n_layers[s]) for s in STACKS}
        self.range_min_var = {s: math.inf for s in STACKS}
        self.loss_sum = self.nll_sum = 0.0
        self.sentences = self.src_tokens = self.batches = 0

    # hooks ------------------------------------------------------------------------------------

    def _sub_hook(self, key):
        def hook(module, inputs, output):
            h = _first(output)
            if h.requires_grad:
                h.retain_grad()
            self.captured[key] = h

        return hook

    def _layer_hook(self, key, stack):
        view = getattr(stack, "layer_view", None)  # a stock fairseq stack has none: its layers return x

        def hook(module, inputs, output):
            x, streams = view(output) if view is not None else (_first(output), {})
            self.captured[key] = (x.detach(), {name: t.detach() for name, t in streams.items()})

        return hook

    def _mixing_recorder(self, stack_name, layer_index, residual):
        """Wrap ``residual.prepare`` (eager only) to record its mean width mixing M (h' = M h) on real tokens."""
        prepare = residual.prepare

        def recording_prepare(state, ctx):
            mask = self._masks.get(stack_name)
            if mask is not None:
                per_layer = self.mixing[stack_name][layer_index]
                m = residual.width_mixing(state[0].detach(), mask).detach().double()
                if per_layer and per_layer[-1][0] == self.batches:  # the layer's later sub-layers: compose
                    per_layer[-1] = (self.batches, m @ per_layer[-1][1], int(mask.sum()))
                else:
                    per_layer.append((self.batches, m, int(mask.sum())))
            return prepare(state, ctx)

        residual.prepare = recording_prepare
        self._wrapped.append(residual)

    def __enter__(self):
        self._wrapped = []
        for name, stack in self.stacks.items():
            for i in range(len(stack.layers)):
                for kind in ("self_attn", "encoder_attn", "ffn"):
                    res = getattr(stack.layers[i], f"{kind}_residual", None)
                    if res is not None and hasattr(res, "width_mixing"):
                        self._mixing_recorder(name, i, res)
        self.model.train()
        self.dropouts_disabled = 0 if self.keep_dropout else disable_dropout(self.model)
        self.model.zero_grad(set_to_none=True)
        for name, stack in self.stacks.items():
            for i, layer in enumerate(stack.layers):
                for sub in SUBLAYERS[name]:
                    module = getattr(layer, HOOKED_MODULE[sub], None)
                    if module is not None:
                        self.hooks.append(module.register_forward_hook(self._sub_hook((name, sub, i))))
                self.hooks.append(layer.register_forward_hook(self._layer_hook((name, "out", i), stack)))
        return self

    def __exit__(self, *exc):
        for res in self._wrapped:
            del res.prepare  # the class's method again
        self._wrapped = []
        for handle in self.hooks:
            handle.remove()
        self.hooks = []
        self.captured.clear()
        return False

    # accumulation -----------------------------------------------------------------------------

    def add_batch(self, criterion, sample):
        """Forward and backward one fairseq sample through ``criterion``; accumulate its statistics."""
        n_layers, captured = self.n_layers, self.captured
        captured.clear()
        self._masks = {  # T x B, True at real tokens (read by the width-mixing recorders)
            "encoder": sample["net_input"]["src_tokens"].ne(self.pad["encoder"]).t(),
            "decoder": sample["net_input"]["prev_output_tokens"].ne(self.pad["decoder"]).t(),
        }
        loss, sample_size, logging_output = criterion(self.model, sample)
        (loss / self.total_tokens).backward()
        self.batches += 1
        self.loss_sum += float(logging_output["loss"])
        self.nll_sum += float(logging_output.get("nll_loss", logging_output["loss"]))
        self.sentences += int(sample["nsentences"])
        masks = {  # T x B, True at real tokens
            "encoder": sample["net_input"]["src_tokens"].ne(self.pad["encoder"]).t(),
            "decoder": sample["net_input"]["prev_output_tokens"].ne(self.pad["decoder"]).t(),
        }
        self.src_tokens += int(masks["encoder"].sum())
        for s in STACKS:
            mask = masks[s]
            for sub in SUBLAYERS[s]:
                for i in range(n_layers[s]):
                    h = captured.get((s, sub, i))
                    if h is not None and h.grad is not None:
                        self.sub_sq[s, sub][i] += float(h.grad.detach().double().pow(2).sum())
            # a layer skipped by LayerDrop (--keep-dropout) has no output: its pairs are skipped
            outs = [captured.get((s, "out", i)) for i in range(n_layers[s])]
            for i in range(n_layers[s] - 1):
                if outs[i] is None or outs[i + 1] is None:
                    continue
                self.cos_count[s][i] += int(mask.sum())
                cos = torch.nn.functional.cosine_similarity(
                    outs[i][0].float(), outs[i + 1][0].float(), dim=-1
                )
                self.cos_sum[s][i] += float(cos[mask].double().sum())
                for stream, t in outs[i][1].items():  # the scheme's extra streams (ResiDual's x_d)
                    cos = torch.nn.functional.cosine_similarity(t.float(), outs[i + 1][1][stream].float(), dim=-1)
                    sums = self.cos_stream_sum[s].setdefault(stream, torch.zeros_like(self.cos_sum[s]))
                    sums[i] += float(cos[mask].double().sum())
            for i, out in enumerate(outs):  # how alike the streams are within a layer's output
                if out is None or not out[1]:
                    continue
                streams = list(out[1].values()) if len(out[1]) > 1 else [out[0]] + list(out[1].values())
                pairs = [(a, b) for j, a in enumerate(streams) for b in streams[j + 1:]]
                cos = sum(torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1) for a, b in pairs)
                self.between_sum[s][i] += float((cos / len(pairs))[mask].double().sum())
                self.between_count[s][i] += int(mask.sum())
            ranged = self.ranged[s]
            if ranged is not None:
                values = [None if o is None else o[1].get(ranged.name) for o in outs]
                for i, t in enumerate(values):
                    if t is not None:
                        self.range_max[s][i] = max(float(self.range_max[s][i]), float(t.abs().max()))
                if values and values[-1] is not None:
                    top = values[-1].float().var(dim=-1, unbiased=False)  # T x B
                    self.range_min_var[s] = min(self.range_min_var[s], float(top[mask].min()))
        captured.clear()

    def result(self):
        """The measurements of the batches added so far (see the package docstring)."""
        from ..tasks import layer_grad_norms

        n_layers, total_tokens, model = self.n_layers, self.total_tokens, self.model
        param = {s: layer_grad_norms(self.stacks[s].layers).double().cpu() for s in STACKS}
        result = {
            "scheme": self.scheme,
            "encoder_layers": n_layers["encoder"],
            "decoder_layers": n_layers["decoder"],
            "embed_dim": int(model.encoder.embed_tokens.embedding_dim),
            "dropout": "kept" if self.keep_dropout else f"off ({self.dropouts_disabled} dropout modules set to 0)",
            "batches": self.batches,
            "sentences": self.sentences,
            "source_tokens": self.src_tokens,
            "target_tokens": total_tokens,
            # fairseq's convention: loss per target token in base 2
            "loss": self.loss_sum / total_tokens / math.log(2),
            "nll_loss": self.nll_sum / total_tokens / math.log(2),
            "param_grad_norm": {s: param[s].tolist() for s in STACKS},
            "grad_norm_low_top": {
                s: (float(param[s][0] / param[s][-1]) if n_layers[s] and param[s][-1] > 0 else None)
                for s in STACKS
            },
            "sublayer_output_grad_norm": {
                s: {sub: self.sub_sq[s, sub].sqrt().tolist() for sub in SUBLAYERS[s]} for s in STACKS
            },
            "cosine_consecutive": {s: _mean_or_none(self.cos_sum[s], self.cos_count[s]) for s in STACKS},
            "cosine_consecutive_streams": {
                stream: {s: _mean_or_none(self.cos_stream_sum[s][stream], self.cos_count[s]) for s in STACKS}
                for stream in self.cos_stream_sum["encoder"]
            },
            "cosine_consecutive_dual": None,
            "dual_stream": None,
        }
        result["stream_cosine"] = None
        if any(float(self.between_count[s].sum()) > 0 for s in STACKS):
            result["stream_cosine"] = {s: _mean_or_none(self.between_sum[s], self.between_count[s]) for s in STACKS}
        result["mixing_distance"] = None
        if any(any(per) for s in STACKS for per in self.mixing[s]):
            result["mixing_distance"] = {s: [_mixing_distance(per) for per in self.mixing[s]] for s in STACKS}
        ranged = {s: r for s, r in self.ranged.items() if r is not None}
        if len(ranged) == len(STACKS) and ranged["encoder"].name in result["cosine_consecutive_streams"]:
            result["cosine_consecutive_dual"] = result["cosine_consecutive_streams"][ranged["encoder"].name]
            result["dual_stream"] = {s: _range_report(ranged[s], self.range_max[s], self.range_min_var[s],
                                                     self.safety) for s in STACKS}
        return result


def analyze_model(model, criterion, batches, keep_dropout=False, safety=0.1):
    """Measure per-layer gradient norms, consecutive-layer cosine similarity and the dual stream of
    ``model`` over ``batches`` (fairseq samples on the model's device) with ``criterion`` (a fairseq
    criterion returning ``(summed loss, sample_size, logging_output)``): :class:`LayerStatistics`; and the
    largest running sum of the forward passes, ``running_sums`` (:meth:`.ranges.RunningSums.top`: peak, site,
    fp16 headroom; None for a model without LayerNorms or residual objects).

    Returns:
        dict of the measurements (see the package docstring); lists run from layer 1 (lowest) up.
    """
    from .ranges import RunningSums

    total_tokens = sum(int(sample["ntokens"]) for sample in batches)
    # RunningSums outside: LayerStatistics wraps some residuals' prepare on top of its wrappers and removes both
    with RunningSums(model) as sums, LayerStatistics(model, total_tokens, keep_dropout, safety) as stats:
        for sample in batches:
            stats.add_batch(criterion, sample)
        result = stats.result()
    result["running_sums"] = sums.top()
    return result


def _mixing_distance(records):
    """||M - I||_F / sqrt(n) of a layer's effective width mixing M (the product of its sub-layers' mean mixings,
    averaged over batches weighted by their tokens), or None when not measured."""
    if not records:
        return None
    weight = sum(w for _, _, w in records)
    m = sum(mat * w for _, mat, w in records) / weight
    n = m.shape[0]
    return float((m - torch.eye(n, dtype=m.dtype)).norm() / math.sqrt(n))


def _mean_or_none(total, count):
    """Element-wise total / count as a list, None where count is 0 (JSON has no NaN)."""
    return [float(t / n) if n > 0 else None for t, n in zip(total.tolist(), count.tolist())]


def _ranged_stream(stack):
    """The :class:`~fairseq_residual.residual.StreamRange` ``stack``'s residual declares, or None (a stack of
    fairseq's own code has no residual object)."""
    residual = getattr(stack, "residual", None)
    return None if residual is None else residual.ranged_stream()


def _range_report(ranged, max_abs, min_var, safety):
    """The fp16 range of the stream ``ranged`` (a :class:`~fairseq_residual.residual.StreamRange`) from its
    largest magnitude per layer and its smallest variance after the top layer."""
    c = float(ranged.scale)
    peak = float(max_abs.max()) if len(max_abs) else 0.0
    unscaled = peak / c
    safe = safe_dual_scale(unscaled, safety)
    var_unscaled = min_var / (c * c)
    eps_rel = None
    if safe is not None and var_unscaled > 0 and ranged.norm_eps is not None:
        eps_rel = ranged.norm_eps / var_unscaled  # the LayerNorm's eps scales with c^2: the same for every c
    return {
        "scale": c,
        "max_abs": max_abs.tolist(),
        "max_abs_peak": peak,
        "max_abs_unscaled": unscaled,
        "headroom": (FP16_MAX / peak) if peak > 0 else None,
        "fp16_max": FP16_MAX,
        "fp16_safety": safety,
        "safe_scale": safe,
        "ln_eps_relative": eps_rel,
    }

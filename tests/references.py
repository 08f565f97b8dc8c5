"""Independent plain-PyTorch transcriptions of every registered scheme's computation, one table.

Each transcription recomputes a ``residual_transformer``'s encoder output and decoder log-probabilities
from the model's raw weights (``F.linear``, ``F.layer_norm``, an explicit softmax attention), following
the scheme's reference code as its module docstring cites it, and never calls the plugin's layers,
residual objects or loops. :data:`REFERENCES` maps every scheme name to ``(flags, transcription,
negative control)``: the model options the check builds with, the transcription, and the same
transcription with the scheme's defining term changed (it must differ from the model). A scheme added to
the registry without an entry here fails ``tests/test_conformance.py``.

Post-LN and Pre-LN are fairseq's own code: their transcription here is the textbook formula, and
``tests/test_exactness.py`` also compares them with fairseq's stock ``transformer``.
"""
import math

import torch
import torch.nn.functional as F

EPS = 1e-5  # fairseq's LayerNorm eps


def ref_ln(ln, x, eps=EPS):
    """LayerNorm over the last dimension with the affine parameters of module ``ln``."""
    return F.layer_norm(x, (x.shape[-1],), ln.weight, ln.bias, eps)


def _head_ln(norm, t, heads):
    shape = t.shape
    d = shape[-1] // heads
    return F.layer_norm(t.view(*shape[:-1], heads, d), (d,), norm.weight, norm.bias, EPS).view(shape)


def ref_attention(mha, query, key_value, key_padding_mask=None, causal=False, head_norms=False):
    """Multi-head attention from the raw projection weights. query T x B x C, key_value S x B x C.
    ``head_norms``: LayerNorm over each head's features of q, k, v after their projections (QKV-Norm, with
    the parameters the model keeps in ``{q,k,v}_proj.norm``)."""
    T, B, C = query.shape
    S = key_value.shape[0]
    H = mha.num_heads
    d = C // H
    q = F.linear(query, mha.q_proj.weight, mha.q_proj.bias)
    k = F.linear(key_value, mha.k_proj.weight, mha.k_proj.bias)
    v = F.linear(key_value, mha.v_proj.weight, mha.v_proj.bias)
    if head_norms:
        q, k, v = (_head_ln(p.norm, t, H) for p, t in ((mha.q_proj, q), (mha.k_proj, k), (mha.v_proj, v)))
    q = q * d ** -0.5
    q = q.view(T, B, H, d).permute(1, 2, 0, 3)  # B x H x T x d
    k = k.view(S, B, H, d).permute(1, 2, 0, 3)
    v = v.view(S, B, H, d).permute(1, 2, 0, 3)
    scores = q @ k.transpose(-1, -2)  # B x H x T x S
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    if causal:
        scores = scores.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # B x H x T x d
    out = out.permute(2, 0, 1, 3).reshape(T, B, C)
    return F.linear(out, mha.out_proj.weight, mha.out_proj.bias)


def ref_ffn(layer, x):
    return F.linear(F.relu(F.linear(x, layer.fc1.weight, layer.fc1.bias)), layer.fc2.weight, layer.fc2.bias)


#: the sub-layer's own LayerNorm, by fairseq's name
LN_OF = {"self_attn": "self_attn_layer_norm", "encoder_attn": "encoder_attn_layer_norm", "ffn": "final_layer_norm"}


class Transcription:
    """One scheme's computation. The driver (:func:`reference_forward`) embeds the tokens as fairseq does
    (scaled token embedding + sinusoidal positions, padded source rows zeroed), then per stack calls
    :meth:`start`, for each layer and each sub-layer :meth:`sublayer` with the branch ``F`` (attention or
    FFN on the raw weights, no residual, dropout off), :meth:`between` after each layer, and :meth:`out`.
    The default is Pre-LN with a final LayerNorm."""

    head_norms = False  # attention with QKV-Norm (HybridNorm)
    final = True  # the stack ends with its final LayerNorm (eps :attr:`final_eps`)
    final_eps = EPS

    def start(self, stack, x):
        return x

    def sublayer(self, stack, layer, l, kind, state, branch):
        ln = getattr(layer, LN_OF[kind])
        return state + branch(ref_ln(ln, state))

    def between(self, stack, l, state):
        return state

    def out(self, stack, state):
        return ref_ln(stack.layer_norm, state, self.final_eps) if self.final else state


class PostLN(Transcription):
    """Vaswani et al. 2017: x = LN(x + F(x)), no final LayerNorm."""

    final = False

    def sublayer(self, stack, layer, l, kind, state, branch):
        return ref_ln(getattr(layer, LN_OF[kind]), state + branch(state))


class PreLNWithoutFinal(Transcription):
    """Pre-LN's sub-layers without the final LayerNorm (Post-LN's negative control)."""

    final = False


class PostLNWithFinal(PostLN):
    """Post-LN's sub-layers with a final LayerNorm (Pre-LN's negative control)."""

    final = True


class DeepNorm(PostLN):
    """torchscale: x = LN(alpha x + F(x)); alpha_enc = 0.81 (N^4 M)^(1/16), alpha_dec = (3M)^(1/4)."""

    def __init__(self, unit_alpha=False):
        self.unit_alpha = unit_alpha

    def sublayer(self, stack, layer, l, kind, state, branch):
        n, m = stack.n_enc, stack.n_dec
        alpha = 0.81 * (n ** 4 * m) ** (1 / 16) if stack.name == "encoder" else (3 * m) ** (1 / 4)
        alpha = 1.0 if self.unit_alpha else alpha
        return ref_ln(getattr(layer, LN_OF[kind]), alpha * state + branch(state))


class Admin(PostLN):
    """Transformer-Clinic: x = LN(omega * x + F(x)), one omega vector per sub-layer."""

    def __init__(self, unit_omega=False):
        self.unit_omega = unit_omega

    def sublayer(self, stack, layer, l, kind, state, branch):
        omega = getattr(layer, f"{kind}_residual").omega
        omega = torch.ones_like(omega) if self.unit_omega else omega
        return ref_ln(getattr(layer, LN_OF[kind]), omega * state + branch(state))


class TFixup(Transcription):
    """layer6ai-labs/T-Fixup (--dont-use-layernorm): x = x + F(x), no LayerNorm anywhere."""

    final = False

    def __init__(self, cross_attention=True):
        self.cross_attention = cross_attention

    def sublayer(self, stack, layer, l, kind, state, branch):
        if kind == "encoder_attn" and not self.cross_attention:
            return state
        return state + branch(state)


class DLCL(Transcription):
    """wangqiangneu/dlcl, pre-norm: x_{l+1} = sum_{k<=l} W[l,k] LN_k(y_k) (LN_0 = identity), Pre-LN layers,
    output LN_final(sum_{k<=L} W[L,k] LN_k(y_k)). ``drop`` = (stack, l, k) leaves one term out."""

    def __init__(self, drop=None):
        self.drop = drop

    def _combine(self, stack, row, ys):
        W = stack.residual.weight
        return sum(W[row, k] * ys[k] for k in range(row + 1) if self.drop != (stack.name, row, k))

    def start(self, stack, x):
        ys = [x]
        return {"x": self._combine(stack, 0, ys), "ys": ys}

    def sublayer(self, stack, layer, l, kind, state, branch):
        x = state["x"]
        return dict(state, x=x + branch(ref_ln(getattr(layer, LN_OF[kind]), x)))

    def between(self, stack, l, state):
        ys = state["ys"] + [ref_ln(stack.residual.layer_norms[l + 1], state["x"])]
        return {"x": self._combine(stack, l + 1, ys), "ys": ys}

    def out(self, stack, state):
        return ref_ln(stack.layer_norm, state["x"])


class B2T(PostLN):
    """takase/b2t_connection: Post-LN plus the layer input before the layer's last LayerNorm."""

    def __init__(self, bottom=True):
        self.bottom = bottom

    def sublayer(self, stack, layer, l, kind, state, branch):
        x, x_in = (state, state) if kind == "self_attn" else state
        if kind == "ffn":
            return ref_ln(layer.final_layer_norm, x + branch(x) + (x_in if self.bottom else 0))
        return ref_ln(getattr(layer, LN_OF[kind]), x + branch(x)), x_in


class ResiDual(Transcription):
    """microsoft/ResiDual: x_a = LN(x_a + h), x_d = x_d + c h per sub-layer (h = F(x_a)); start x_d = c emb;
    output alpha x_a + LN_final(x_d) with the authors' eps 1e-7. ``start`` multiplies the embedding x_d
    starts from (0: ``--resi-dual-start-from zeros``)."""

    final_eps = 1e-7

    def __init__(self, c, alpha, cross_attn_feeds_dual=True, start=1.0):
        self.c, self.alpha, self.cross_attn_feeds_dual, self.start_factor = c, alpha, cross_attn_feeds_dual, start

    def start(self, stack, x):
        return x, self.start_factor * self.c[stack.name] * x

    def sublayer(self, stack, layer, l, kind, state, branch):
        x_a, x_d = state
        h = branch(x_a)
        x_a = ref_ln(getattr(layer, LN_OF[kind]), x_a + h)
        if kind != "encoder_attn" or self.cross_attn_feeds_dual:
            x_d = x_d + self.c[stack.name] * h
        return x_a, x_d

    def out(self, stack, state):
        return self.alpha[stack.name] * state[0] + ref_ln(stack.layer_norm, state[1], self.final_eps)


class PeriLN(Transcription):
    """Peri-LN / Sandwich-LN: x = x + LN_out(F(LN_in(x))), final LayerNorm."""

    def __init__(self, out_norm=True):
        self.out_norm = out_norm

    def sublayer(self, stack, layer, l, kind, state, branch):
        h = branch(ref_ln(getattr(layer, LN_OF[kind]), state))
        return state + (ref_ln(getattr(layer, f"{kind}_residual").out_layer_norm, h) if self.out_norm else h)


class MixLN(Transcription):
    """pixeli99/MixLN: the lowest floor(a L) layers Post-LN, the others Pre-LN, final LayerNorm."""

    def __init__(self, fraction, shift=0):
        self.fraction, self.shift = fraction, shift

    def sublayer(self, stack, layer, l, kind, state, branch):
        ln = getattr(layer, LN_OF[kind])
        if l < math.floor(self.fraction * stack.num_layers) + self.shift:
            return ref_ln(ln, state + branch(state))
        return state + branch(ref_ln(ln, state))


class LNS(Transcription):
    """LayerNorm Scaling: x = x + F(LN(x) / sqrt(l)), l the 1-based layer index; final LayerNorm unscaled."""

    def __init__(self, scaled=True):
        self.scaled = scaled

    def sublayer(self, stack, layer, l, kind, state, branch):
        scale = 1 / math.sqrt(l + 1) if self.scaled else 1.0
        return state + branch(ref_ln(getattr(layer, LN_OF[kind]), state) * scale)


class ReZero(Transcription):
    """majumderb/rezero: x = x + alpha_l F(x), alpha per layer shared by its sub-layers, no LayerNorm."""

    final = False

    def __init__(self, shared_across_layers=False):
        self.shared = shared_across_layers

    def sublayer(self, stack, layer, l, kind, state, branch):
        alpha = (stack.layers[0] if self.shared else layer).self_attn_residual.resweight
        return state + alpha * branch(state)


class HybridNorm(Transcription):
    """BryceZhuo/HybridNorm: attention y = x + Attn(x) with q/k/v normalised per head; FFN z = LN(y),
    x = z + FFN(z); final LayerNorm. ``ffn_from_y``: the FFN's residual from the un-normalised y."""

    head_norms = True

    def __init__(self, ffn_from_y=False):
        self.ffn_from_y = ffn_from_y

    def sublayer(self, stack, layer, l, kind, state, branch):
        if kind != "ffn":
            return state + branch(state)
        z = ref_ln(layer.final_layer_norm, state)
        return (state if self.ffn_from_y else z) + branch(z)


class HyperConnections(Transcription):
    """Hyper-connections (Zhu et al. 2025, Algorithm 2): n streams; per sub-layer, per stream i,
    alpha_i = static_alpha[i] + s_a tanh(LN(h_i) W_a), beta_i = static_beta[i] + s_b tanh(LN(h_i) w_b) (LN without
    parameters; the static parts only with ``static``); h_in = sum_i alpha_i[0] h_i, o = F(LN_k(h_in)),
    h'_j = sum_i alpha_i[1 + j] h_i + beta_j o; output LN_final(sum_i h_i). ``skip_width``: h'_j = h_j + beta_j o,
    the width connection A_r left out (what lucidrains/hyper-connections computed from v0.1.7 to v0.3.10)."""

    def __init__(self, streams, static=False, skip_width=False):
        self.n, self.static, self.skip_width = streams, static, skip_width

    def start(self, stack, x):
        return [x for _ in range(self.n)]

    def sublayer(self, stack, layer, l, kind, hs, branch):
        res = getattr(layer, f"{kind}_residual")
        alphas, betas = [], []
        for i, h in enumerate(hs):
            a, b = res.static_alpha[i], res.static_beta[i]
            if not self.static:
                normed = F.layer_norm(h, (h.shape[-1],))
                a = a + res.dynamic_alpha_scale * torch.tanh(normed @ res.dynamic_alpha_fn)
                b = b + res.dynamic_beta_scale * torch.tanh(normed @ res.dynamic_beta_fn)
            alphas.append(a * torch.ones(h.shape[:-1] + (self.n + 1,)))
            betas.append(b * torch.ones(h.shape[:-1]))
        h_in = sum(alphas[i][..., 0:1] * hs[i] for i in range(self.n))
        o = branch(ref_ln(getattr(layer, LN_OF[kind]), h_in))
        if self.skip_width:
            return [hs[j] + betas[j][..., None] * o for j in range(self.n)]
        return [sum(alphas[i][..., 1 + j: 2 + j] * hs[i] for i in range(self.n)) + betas[j][..., None] * o
                for j in range(self.n)]

    def out(self, stack, hs):
        return ref_ln(stack.layer_norm, sum(hs))


class MHC(HyperConnections):
    """mHC (arXiv 2512.24880, eq. 3, 7-9): x' = RMSNorm(concatenated streams), H_pre = sigmoid(a_pre x' phi_pre +
    b_pre), H_post = 2 sigmoid(...), H_res = Sinkhorn-Knopp(a_res mat(x' phi_res) + b_res) (eq. 9: exp, then 20
    rounds of M = T_r(T_c(M)), column then row normalisation); h_in = sum_i H_pre[i] h_i,
    h'_j = sum_i H_res[j, i] h_i + H_post[j] o. ``rows_only``: H_res only row-normalised (a softmax), not doubly
    stochastic. ``row_first``: every round normalises the rows, then the columns (eq. 9 transposed)."""

    def __init__(self, streams, rows_only=False, row_first=False):
        super().__init__(streams)
        self.rows_only, self.row_first = rows_only, row_first

    def _normalise(self, m, dim):
        return m / m.sum(dim=dim, keepdim=True)

    @staticmethod
    def gates(res, hs):
        """mHC's eq. 7-8, which mHC-lite keeps: ``(x', H_pre, H_post)`` of sub-layer ``res`` on the streams ``hs``."""
        flat = torch.cat(hs, dim=-1)
        x = flat / torch.sqrt(flat.pow(2).mean(dim=-1, keepdim=True) + 1e-20)
        pre = torch.sigmoid(res.alpha_pre * (x @ res.phi_pre) + res.b_pre)
        post = 2 * torch.sigmoid(res.alpha_post * (x @ res.phi_post) + res.b_post)
        return x, pre, post

    def sublayer(self, stack, layer, l, kind, hs, branch):
        res = getattr(layer, f"{kind}_residual")
        n = self.n
        x, pre, post = self.gates(res, hs)
        logits = res.alpha_res * (x @ res.phi_res).view(*x.shape[:-1], n, n) + res.b_res
        m = torch.exp(logits)
        if self.rows_only:
            m = self._normalise(m, -1)
        for _ in range(0 if self.rows_only else 20):
            first, last = (-1, -2) if self.row_first else (-2, -1)  # eq. 9: T_c (dim -2) first, T_r (dim -1) last
            m = self._normalise(self._normalise(m, first), last)
        h_in = sum(pre[..., i: i + 1] * hs[i] for i in range(n))
        o = branch(ref_ln(getattr(layer, LN_OF[kind]), h_in))
        return [sum(m[..., j, i: i + 1] * hs[i] for i in range(n)) + post[..., j: j + 1] * o for j in range(n)]


class SiameseNorm(Transcription):
    """Qwen-Applications/SiameseNorm (post_pre): u = LN_post(x), o = F(LN_in(u + LN_pre(y))), x = u + o / c_l,
    y = y + o, c_l = sqrt(S (l + 1)) with S the sub-layers per layer; output LN_final(LN_a(x) + LN_b(y)).
    ``sublayers_per_layer``: force S (the reference's literal 2 everywhere: the negative control)."""

    def __init__(self, sublayers_per_layer=None):
        self.s = sublayers_per_layer

    def start(self, stack, x):
        return x, x

    def sublayer(self, stack, layer, l, kind, state, branch):
        x, y = state
        res = getattr(layer, f"{kind}_residual")
        s = self.s or (2 if stack.name == "encoder" else 3)
        c = math.sqrt(s * (l + 1))
        u = ref_ln(res.post_layer_norm, x)
        o = branch(ref_ln(getattr(layer, LN_OF[kind]), u + ref_ln(res.pre_layer_norm, y)))
        return u + o / c, y + o

    def out(self, stack, state):
        x, y = state
        return ref_ln(stack.layer_norm, ref_ln(stack.residual.x_layer_norm, x) + ref_ln(stack.residual.y_layer_norm, y))


class _Stack:
    """What a transcription may read of a stack: its name, depth, N and M, and its modules."""

    def __init__(self, name, module, n_enc, n_dec):
        self.name, self.module, self.n_enc, self.n_dec = name, module, n_enc, n_dec
        self.layers = module.layers
        self.num_layers = len(module.layers)

    def __getattr__(self, key):
        return getattr(self.module, key)


def reference_forward(model, src, prev, ref):
    """Encoder output (S x B x C) and decoder log-probabilities (B x T x V) of ``model`` computed by
    transcription ``ref`` from the model's raw weights (dropout off)."""
    enc, dec = model.encoder, model.decoder
    n_enc, n_dec = len(enc.layers), len(dec.layers)
    pad = enc.padding_idx
    src_pad, tgt_pad = src.eq(pad), prev.eq(pad)
    hn = ref.head_norms

    stack = _Stack("encoder", enc, n_enc, n_dec)
    x = enc.embed_scale * enc.embed_tokens(src) + enc.embed_positions(src)
    x = (x * (1 - src_pad.unsqueeze(-1).float())).transpose(0, 1)
    state = ref.start(stack, x)
    for l, layer in enumerate(enc.layers):
        branches = {"self_attn": lambda h, layer=layer: ref_attention(layer.self_attn, h, h, src_pad, head_norms=hn),
                    "ffn": lambda h, layer=layer: ref_ffn(layer, h)}
        for kind in ("self_attn", "ffn"):
            state = ref.sublayer(stack, layer, l, kind, state, branches[kind])
        state = ref.between(stack, l, state)
    enc_out = ref.out(stack, state)

    stack = _Stack("decoder", dec, n_enc, n_dec)
    y = (dec.embed_scale * dec.embed_tokens(prev) + dec.embed_positions(prev)).transpose(0, 1)
    state = ref.start(stack, y)
    for l, layer in enumerate(dec.layers):
        branches = {
            "self_attn": lambda h, layer=layer: ref_attention(layer.self_attn, h, h, tgt_pad, causal=True,
                                                              head_norms=hn),
            "encoder_attn": lambda h, layer=layer: ref_attention(layer.encoder_attn, h, enc_out, src_pad,
                                                                 head_norms=hn),
            "ffn": lambda h, layer=layer: ref_ffn(layer, h),
        }
        for kind in ("self_attn", "encoder_attn", "ffn"):
            state = ref.sublayer(stack, layer, l, kind, state, branches[kind])
        state = ref.between(stack, l, state)
    out = ref.out(stack, state)
    logits = F.linear(out.transpose(0, 1), dec.output_projection.weight)
    if hasattr(ref, "logit_scale"):  # a transcription that scales the logits per vocabulary entry (nGPT's s_z)
        logits = logits * ref.logit_scale(stack)
    return enc_out, torch.log_softmax(logits, dim=-1)


_C = {"encoder": 0.5, "decoder": 0.25}
_ALPHA = {"encoder": 0.7, "decoder": 1.3}

#: scheme -> (model flags, transcription, negative control); built with N = 3, M = 2
REFERENCES = {
    "post_ln": ([], PostLN(), PreLNWithoutFinal()),
    "pre_ln": ([], Transcription(), PostLNWithFinal()),
    "deepnorm": ([], DeepNorm(), DeepNorm(unit_alpha=True)),
    "admin": ([], Admin(), Admin(unit_omega=True)),
    "t_fixup": ([], TFixup(), TFixup(cross_attention=False)),
    "dlcl": ([], DLCL(), DLCL(drop=("decoder", 2, 1))),
    "b2t": ([], B2T(), B2T(bottom=False)),
    "resi_dual": (["--encoder-resi-dual-scale", _C["encoder"], "--decoder-resi-dual-scale", _C["decoder"],
                   "--encoder-resi-dual-alpha", _ALPHA["encoder"], "--decoder-resi-dual-alpha", _ALPHA["decoder"]],
                  ResiDual(_C, _ALPHA), ResiDual(_C, _ALPHA, cross_attn_feeds_dual=False)),
    "peri_ln": ([], PeriLN(), PeriLN(out_norm=False)),
    "mix_ln": (["--mix-ln-fraction", 0.5], MixLN(0.5), MixLN(0.5, shift=1)),
    "lns": ([], LNS(), LNS(scaled=False)),
    "rezero": ([], ReZero(), ReZero(shared_across_layers=True)),
    "hybrid_norm": ([], HybridNorm(), HybridNorm(ffn_from_y=True)),
    "hyper_connections": (["--hc-streams", 3], HyperConnections(3), HyperConnections(3, skip_width=True)),
    "mhc": (["--mhc-streams", 3], MHC(3), MHC(3, rows_only=True)),
    "siamese_norm": ([], SiameseNorm(), SiameseNorm(sublayers_per_layer=2)),
}


def _attention_with_values(mha, x, v, key_padding_mask, causal, k_in=None):
    """Self-attention of ``x`` (T x B x C) with the values ``v`` (T x B x C) given, from the raw weights; the keys
    from ``k_in`` (T x B x C) where given, else from ``x``."""
    T, B, C = x.shape
    H = mha.num_heads
    d = C // H
    heads = lambda t: t.reshape(T, B, H, d).permute(1, 2, 0, 3)  # noqa: E731  B x H x T x d
    q = heads(F.linear(x, mha.q_proj.weight, mha.q_proj.bias) * d ** -0.5)
    k = heads(F.linear(x if k_in is None else k_in, mha.k_proj.weight, mha.k_proj.bias))
    scores = q @ k.transpose(-1, -2)
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out = (torch.softmax(scores, dim=-1) @ heads(v)).permute(2, 0, 1, 3).reshape(T, B, C)
    return F.linear(out, mha.out_proj.weight, mha.out_proj.bias)


class ValueResidual(Transcription):
    """Zcchill/Value-Residual-Learning (modeling_llama_resformer.py): Pre-LN whose self-attention in every layer
    after the first takes the values 0.5 V_1 + 0.5 V_n, V_1 the first layer's values of the same stack;
    ``learned``: x-transformers' V_1.lerp(V_n, g), g = sigmoid(W_g LN(x) + b_g) per head
    (``v_proj.residual_mix_weight`` / ``_bias``). Cross-attention is Pre-LN's. The padded positions are the rows
    that fairseq's embedding leaves zero (pad token and pad position). ``swapped``: the gate weighs V_1, not V_n."""

    def __init__(self, learned=False, swapped=False):
        self.learned, self.swapped = learned, swapped

    def start(self, stack, x):
        pad = x.eq(0).all(-1).t()
        self.pad, self.first = (pad if pad.any() else None), None
        return x

    def sublayer(self, stack, layer, l, kind, state, branch):
        if kind != "self_attn":
            return super().sublayer(stack, layer, l, kind, state, branch)
        mha = layer.self_attn
        h = ref_ln(layer.self_attn_layer_norm, state)
        v = F.linear(h, mha.v_proj.weight, mha.v_proj.bias)
        if self.first is None:
            self.first = v
        elif not self.learned:
            v = 0.5 * self.first + 0.5 * v
        else:
            g = torch.sigmoid(F.linear(h, mha.v_proj.residual_mix_weight, mha.v_proj.residual_mix_bias))
            g = g.repeat_interleave(v.shape[-1] // mha.num_heads, dim=-1)
            v = (self.first + g * (v - self.first)) if not self.swapped else (v + g * (self.first - v))
        return state + _attention_with_values(mha, h, v, self.pad, causal=stack.name == "decoder")


REFERENCES["value_residual"] = (["--value-residual-mix", "learned"], ValueResidual(learned=True),
                                ValueResidual(learned=True, swapped=True))


class DenseFormer(Transcription):
    """epfml/DenseFormer (``DWAModules``): Pre-LN layers; after layer i (1-based) its output X_i joins the
    accumulator of residue class i mod k (X_0, the embedding, starts class 0), and where p divides i the next
    input is the tensordot of that DWA's weight vector ((i + k) // k entries, the reference's
    ``nn.Linear((i+1+dilation)//dilation, 1)`` of block i-1; here read in order from the stack's one vector)
    with the class's stored outputs; output LN_final of the last input. ``store_averages``: the accumulators
    take the averages Y_i instead of the layer outputs X_i (the negative control)."""

    def __init__(self, dilation=1, period=1, store_averages=False):
        self.k, self.p, self.store_averages = dilation, period, store_averages

    def _weights(self, stack):
        flat, out, n = stack.residual.alpha, {}, 0
        for i in range(1, stack.num_layers + 1):
            if i % self.p == 0:
                out[i] = flat[n: n + (i + self.k) // self.k]
                n += (i + self.k) // self.k
        assert n == flat.numel()
        return out

    def start(self, stack, x):
        accumulators = [[] for _ in range(self.k)]
        accumulators[0].append(x)
        return {"x": x, "acc": accumulators}

    def sublayer(self, stack, layer, l, kind, state, branch):
        x = state["x"]
        return dict(state, x=x + branch(ref_ln(getattr(layer, LN_OF[kind]), x)))

    def between(self, stack, l, state):
        i, x, acc = l + 1, state["x"], state["acc"]
        acc[i % self.k].append(x)
        if i % self.p == 0:
            w = self._weights(stack)[i]
            x = torch.tensordot(w, torch.stack(acc[i % self.k]), dims=1)
            if self.store_averages:
                acc[i % self.k][-1] = x
        return {"x": x, "acc": acc}

    def out(self, stack, state):
        return ref_ln(stack.layer_norm, state["x"])


REFERENCES["denseformer"] = ([], DenseFormer(), DenseFormer(store_averages=True))


class Laurel(Transcription):
    """Menghani et al. 2025 (LAuReL, arXiv 2411.07501) on Pre-LN, at every sub-layer with its own parameters,
    f = F(LN(x)), x_i the stream sub-layer i of the stack reads (x_0 the embedding output). RW (sec. 2.1):
    x = alpha f + beta x, (alpha, beta) = softmax(w). LR (eq. 3): x = f + W x, W = I + B A. PA (eq. 4):
    x_{i+1} = f + x_i + sum_{j=0}^{k-1} gamma_j B A x_{i-j}, each term on its own, over the x_{i-j} that exist.
    ``low_rank_on_branch_input`` (LR): B A reads LN(x) instead of x; ``skip_current`` (PA): the sum leaves out
    x_i (j = 1..k) - plausible misreadings."""

    def __init__(self, variant, low_rank_on_branch_input=False, skip_current=False):
        self.variant, self.on_input, self.skip_current = variant, low_rank_on_branch_input, skip_current

    def start(self, stack, x):
        self.history = []  # x_0, x_1, ... of this stack
        return x

    def sublayer(self, stack, layer, l, kind, state, branch):
        res = getattr(layer, f"{kind}_residual")
        u = ref_ln(getattr(layer, LN_OF[kind]), state)
        f = branch(u)
        self.history.append(state)
        if self.variant == "rw":
            alpha, beta = torch.softmax(res.w, dim=0)
            return alpha * f + beta * state
        BA = res.B @ res.A  # C x C
        if self.variant == "lr":
            if self.on_input:
                return f + state + u @ BA.t()
            return f + state @ (torch.eye(state.shape[-1]) + BA).t()
        i, k = len(self.history) - 1, len(res.gamma)
        out = f + state
        for j in range(k):
            src = i - j - (1 if self.skip_current else 0)
            if src >= 0:
                out = out + res.gamma[j] * (self.history[src] @ BA.t())
        return out


REFERENCES["laurel"] = (["--laurel-variant", "pa", "--laurel-rank", 3, "--laurel-activations", 3], Laurel("pa"),
                        Laurel("pa", skip_current=True))



def _rms(norm, t, eps=1e-6):
    """RMSNorm over the last dimension with the gain of module ``norm`` (OLMo 2's QK-norm)."""
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * norm.weight


def _qk_normed_attention(mha, query, key_value, key_padding_mask=None, causal=False, head_norms=False):
    """:func:`ref_attention` with the queries and keys RMS-normalised over the width C after their projections
    (OLMo-core ``q_norm`` / ``k_norm`` of size d_model, gains ``{q,k}_proj.norm``)."""
    T, B, C = query.shape
    S = key_value.shape[0]
    H = mha.num_heads
    d = C // H
    q = _rms(mha.q_proj.norm, F.linear(query, mha.q_proj.weight, mha.q_proj.bias)) * d ** -0.5
    k = _rms(mha.k_proj.norm, F.linear(key_value, mha.k_proj.weight, mha.k_proj.bias))
    v = F.linear(key_value, mha.v_proj.weight, mha.v_proj.bias)
    q, k, v = (t.reshape(n, B, H, d).permute(1, 2, 0, 3) for t, n in ((q, T), (k, S), (v, S)))
    scores = q @ k.transpose(-1, -2)
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    if causal:
        scores = scores.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))
    out = (torch.softmax(scores, dim=-1) @ v).permute(2, 0, 1, 3).reshape(T, B, C)
    return F.linear(out, mha.out_proj.weight, mha.out_proj.bias)


class ReorderedNorm(Transcription):
    """allenai/OLMo-core ``ReorderedNormTransformerBlock``: x = x + LN_out(F(x)), no input norm, final LayerNorm;
    ``qk_norm``: every attention's queries and keys RMS-normalised (``attention`` replaces :func:`ref_attention`
    for this transcription). ``input_norm``: the sub-layer's input normalised by LN_out too (the negative
    control: the norm moved back in front of the branch)."""

    def __init__(self, qk_norm=False, input_norm=False):
        self.qk_norm, self.input_norm = qk_norm, input_norm
        self.attention = _qk_normed_attention if qk_norm else None

    def sublayer(self, stack, layer, l, kind, state, branch):
        ln = getattr(layer, f"{kind}_residual").out_layer_norm
        if self.input_norm:
            return state + branch(ref_ln(ln, state))
        return state + ref_ln(ln, branch(state))


_forward_with_ref_attention = reference_forward


def reference_forward(model, src, prev, ref):  # noqa: F811  (the driver, with a transcription's own branches)
    """:func:`reference_forward` above; a transcription with an ``attention`` function computes every attention
    branch with it instead of :func:`ref_attention` (same arguments), one with an ``ffn`` function every FFN branch
    instead of :func:`ref_ffn`."""
    global ref_attention, ref_ffn
    attention, ffn = getattr(ref, "attention", None), getattr(ref, "ffn", None)
    plain_attention, plain_ffn = ref_attention, ref_ffn
    ref_attention, ref_ffn = attention or plain_attention, ffn or plain_ffn
    try:
        return _forward_with_ref_attention(model, src, prev, ref)
    finally:
        ref_attention, ref_ffn = plain_attention, plain_ffn


REFERENCES["reordered_norm"] = (["--reordered-norm-qk-norm"], ReorderedNorm(qk_norm=True),
                                ReorderedNorm(qk_norm=True, input_norm=True))


class AttnRes(Transcription):
    """MoonshotAI/Attention-Residuals ``README.md`` pseudo-code (Kimi Team 2026, arXiv 2603.15031): a list of
    completed ``blocks`` and a ``partial`` sum; before each sub-layer ``V = stack(blocks + [partial])``, ``K =
    RMSNorm(V)`` (eps 1e-6, gain ``key_gain``), ``h = einsum(softmax_n(w . K), V)``, then, at a block boundary,
    ``blocks.append(partial)`` and a new partial sum from the branch output ``F(LN(h))``. The stack starts with
    ``blocks = []``, ``partial = embedding``; a boundary is every sub-layer (``blocks = 0``: Full AttnRes) or the
    self-attention of the first layer of each of the N blocks (layer l in block ``l * N // L``); the output is
    ``LN_final`` of the same average with the stack's own ``residual.query`` / ``residual.key_gain``.
    ``rms_keys=False``: logits on the raw outputs (negative control); ``restart=False``: the partial sum is not
    restarted at a boundary, so it carries the whole stream (negative control of the block logic)."""

    def __init__(self, blocks=0, rms_keys=True, restart=True):
        self.blocks, self.rms_keys, self.restart = blocks, rms_keys, restart

    def _average(self, res, blocks, partial):
        if not blocks:  # the stack's first sub-layer: one source, v_0, and no query (a softmax over one is 1)
            return partial
        V = torch.stack(blocks + [partial])  # n x T x B x C
        K = V * torch.rsqrt(V.pow(2).mean(-1, keepdim=True) + 1e-6) * res.key_gain if self.rms_keys else V
        logits = torch.einsum("c,ntbc->ntb", res.query, K)
        return torch.einsum("ntb,ntbc->tbc", logits.softmax(0), V)

    def _boundary(self, stack, l, kind):
        if self.blocks == 0:
            return True
        n, L = self.blocks, stack.num_layers
        return kind == "self_attn" and (l == 0 or l * n // L != (l - 1) * n // L)

    def start(self, stack, x):
        return ([], x)

    def sublayer(self, stack, layer, l, kind, state, branch):
        blocks, partial = state
        h = self._average(getattr(layer, f"{kind}_residual"), blocks, partial)
        out = branch(ref_ln(getattr(layer, LN_OF[kind]), h))
        if self._boundary(stack, l, kind):
            return (blocks + [partial], out if self.restart else partial + out)
        return (blocks, partial + out)

    def out(self, stack, state):
        blocks, partial = state
        return ref_ln(stack.layer_norm, self._average(stack.residual, blocks, partial))


REFERENCES["attn_res"] = (["--attn-res-blocks", 2], AttnRes(blocks=2), AttnRes(blocks=2, rms_keys=False))


def _attention_qkv(mha, q_in, k_in, v_in, key_padding_mask, causal):
    """Attention with queries, keys and values from three inputs (T x B x C each), from the raw weights."""
    v = F.linear(v_in, mha.v_proj.weight, mha.v_proj.bias)
    return _attention_with_values(mha, q_in, v, key_padding_mask, causal, k_in=k_in)


class MuddFormer(Transcription):
    """Caiyun-AI/MUDDFormer (``modeling_muddformer.py``: ``MUDDFormer.forward``, ``MultiwayDynamicDenseBlock``,
    ``TransformerBlock`` with ``sepln``) on Pre-LN layers: hiddens = [X_0]; after block l (0-based) hiddens gets
    its output, ``dw = W2 GELU(W1 RMSNorm_noscale(x))`` (eps 1e-6) is read as ``'T B (C L) -> C T B L'``, plus
    ``dense_bs`` (the connection's ``bias``, C x L), and the streams are its ``layer_mix``,
    ``sum_j dw[c, :, :, j, None] * hiddens[j]`` (the same sum as its ``einsum`` of the stacked hiddens); the next block reads q, k, v, r = streams[0..3] (block 0: X_0, one norm), the decoder's
    cross-attention the query ``LN_c(X^c + a)`` with c = streams[4] and a the self-attention output; after the
    last block only r. ``unit_weights``: W1, W2 are the stored weights over sqrt(fan_in)
    (``--muddformer-unit-weights``, the default). ``layout_lc``: the MLP output read as ``(L C)`` (stream index inner), the negative
    control."""

    def __init__(self, layout_lc=False, unit_weights=False):
        self.layout_lc, self.unit_weights = layout_lc, unit_weights

    def start(self, stack, x):
        pad = x.eq(0).all(-1).t()
        self.pad = pad if pad.any() else None
        return {"hiddens": [x], "streams": None, "x": x}

    def sublayer(self, stack, layer, l, kind, state, branch):
        causal = stack.name == "decoder"
        if kind == "self_attn":
            s = state["streams"]
            if s is None:
                h = ref_ln(layer.self_attn_layer_norm, state["x"])
                a = _attention_qkv(layer.self_attn, h, h, h, self.pad, causal)
                r, c = state["x"], state["x"]
            else:
                a = _attention_qkv(layer.self_attn, ref_ln(layer.self_attn_layer_norm, s[0]),
                                   ref_ln(layer.k_layer_norm, s[1]), ref_ln(layer.v_layer_norm, s[2]),
                                   self.pad, causal)
                r, c = s[3], (s[4] if len(s) > 4 else None)
            return dict(state, x=r + a, cq=None if c is None else c + a)
        if kind == "encoder_attn":
            return dict(state, x=state["x"] + branch(ref_ln(layer.encoder_attn_layer_norm, state["cq"])))
        return dict(state, x=state["x"] + branch(ref_ln(layer.final_layer_norm, state["x"])))

    def between(self, stack, l, state):
        hiddens = state["hiddens"] + [state["x"]]
        conn = stack.residual.connections[l]
        x = state["x"]
        u = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        w1, w2 = conn.w1, conn.w2
        if self.unit_weights:  # W = w / sqrt(fan_in)
            w1, w2 = w1 / math.sqrt(w1.shape[1]), w2 / math.sqrt(w2.shape[1])
        dw = F.linear(F.gelu(F.linear(u, w1)), w2)  # T x B x (C L)
        C, L = conn.bias.shape
        if self.layout_lc:
            dw = dw.reshape(*dw.shape[:2], L, C).transpose(-1, -2)
        dw = dw.reshape(*dw.shape[:2], C, L).permute(2, 0, 1, 3) + conn.bias[:, None, None, :]  # C x T x B x L
        streams = [sum(dw[c, :, :, j, None] * hiddens[j] for j in range(L)) for c in range(C)]  # its layer_mix
        return {"hiddens": hiddens, "streams": streams, "x": streams[3] if C > 1 else streams[0]}

    def out(self, stack, state):
        return ref_ln(stack.layer_norm, state["x"])


REFERENCES["muddformer"] = ([], MuddFormer(), MuddFormer(layout_lc=True))

#: the std of the noise tests/test_conformance.py adds to a scheme's norm and residual parameters where the
#: default 0.3 leaves the scheme's working range: MUDDFormer's coefficient MLPs are unbounded, and 0.3 per entry
#: of W1 and W2 (stored as the reference, fan-in 64) makes coefficients of about +-15 whose cancelling mixes
#: fp32 cannot resolve to 1e-5 (fp32 and float64 up to 3e-4 apart)
CONFORMANCE_NOISE = {"muddformer": 0.05}
class DepthMuP(Transcription):
    """Depth-µP / CompleteP (arXiv 2310.02244, 2505.01618): x = x + (L_base/L)^alpha F(LN(x)), final LayerNorm;
    L the layers of the stack (N in the encoder, M in the decoder). ``total_depth``: L = N + M for both stacks
    (the negative control: the other reading of L in an encoder-decoder)."""

    def __init__(self, alpha, base, total_depth=False):
        self.alpha, self.base, self.total_depth = alpha, base, total_depth

    def sublayer(self, stack, layer, l, kind, state, branch):
        depth = stack.n_enc + stack.n_dec if self.total_depth else \
            (stack.n_enc if stack.name == "encoder" else stack.n_dec)
        multiplier = (self.base / depth) ** self.alpha
        return state + multiplier * branch(ref_ln(getattr(layer, LN_OF[kind]), state))


REFERENCES["depth_mup"] = (["--depth-alpha", 0.5, "--depth-base", 4], DepthMuP(0.5, 4),
                           DepthMuP(0.5, 4, total_depth=True))
class MHCLite(HyperConnections):
    """mHC-lite (arXiv 2601.05732): mHC's H_pre = sigmoid(a_pre x' phi_pre + b_pre), H_post = 2 sigmoid(...) with
    x' = RMSNorm(concatenated streams); weights w = softmax(a_res x' phi_res + b_res) over the n! permutations s_k of
    itertools.permutations(range(n)) (in that order), h'_j = sum_k w_k h_(s_k(j)) + H_post[j] o (H_res = sum_k w_k P_k,
    P_k[j, s_k(j)] = 1), h_in = sum_i H_pre[i] h_i. ``identity_only``: the permutation weights all on the identity
    (no mixing of the streams)."""

    def __init__(self, streams, identity_only=False):
        super().__init__(streams)
        self.identity_only = identity_only

    def sublayer(self, stack, layer, l, kind, hs, branch):
        import itertools

        res = getattr(layer, f"{kind}_residual")
        n = self.n
        x, pre, post = MHC.gates(res, hs)
        w = torch.softmax(res.alpha_res * (x @ res.phi_res) + res.b_res, dim=-1)
        perms = list(itertools.permutations(range(n)))
        h_in = sum(pre[..., i: i + 1] * hs[i] for i in range(n))
        o = branch(ref_ln(getattr(layer, LN_OF[kind]), h_in))
        if self.identity_only:
            return [hs[j] + post[..., j: j + 1] * o for j in range(n)]
        return [sum(w[..., k: k + 1] * hs[s[j]] for k, s in enumerate(perms)) + post[..., j: j + 1] * o
                for j in range(n)]


REFERENCES["mhc_lite"] = (["--mhc-lite-streams", 3], MHCLite(3), MHCLite(3, identity_only=True))


class FracConnections(Transcription):
    """Frac-connections (arXiv 2503.14125, eq. 6-14, Algorithm 2): x (T x B x C) split into m consecutive fractions
    h_1..h_m of C/m; per fraction i, with hbar_i = LN(h_i) (no parameters), Y[i] = static_alpha[i, :m] +
    s_a tanh(hbar_i W[:, :m]), A[i] = static_alpha[i, m:] + s_a tanh(hbar_i W[:, m:]), B[i] = static_beta[i] +
    s_b tanh(hbar_i . w_b); x_in = cat_j(sum_i Y[i, j] h_i), o = F(LN_k(x_in)) split as x, x' = cat_j(sum_i A[i, j] h_i
    + B[j] o_j); output LN_final(x). ``swap``: the branch input mixed by A and the carried fractions by Y (the
    columns of static_alpha read the other way round)."""

    def __init__(self, fracs, static=False, swap=False):
        self.m, self.static, self.swap = fracs, static, swap

    def sublayer(self, stack, layer, l, kind, x, branch):
        res = getattr(layer, f"{kind}_residual")
        m = self.m
        hs = x.chunk(m, dim=-1)
        ys, as_, bs = [], [], []
        for i, h in enumerate(hs):
            a, b = res.static_alpha[i] * torch.ones(h.shape[:-1] + (2 * m,)), res.static_beta[i]
            if not self.static:
                normed = F.layer_norm(h, (h.shape[-1],))
                a = a + res.dynamic_alpha_scale * torch.tanh(normed @ res.dynamic_alpha_fn)
                b = b + res.dynamic_beta_scale * torch.tanh(normed @ res.dynamic_beta_fn)
            y, a = (a[..., m:], a[..., :m]) if self.swap else (a[..., :m], a[..., m:])
            ys.append(y)
            as_.append(a)
            bs.append(b * torch.ones(h.shape[:-1]))
        x_in = torch.cat([sum(ys[i][..., j: j + 1] * hs[i] for i in range(m)) for j in range(m)], dim=-1)
        os_ = branch(ref_ln(getattr(layer, LN_OF[kind]), x_in)).chunk(m, dim=-1)
        return torch.cat([sum(as_[i][..., j: j + 1] * hs[i] for i in range(m)) + bs[j][..., None] * os_[j]
                          for j in range(m)], dim=-1)


REFERENCES["frac_connections"] = (["--frac-connections-fracs", 4], FracConnections(4), FracConnections(4, swap=True))


def _unit(x):
    """``x / ||x||`` over the last dimension (``F.normalize``: a zero vector, a padded position, stays 0)."""
    return F.normalize(x, p=2.0, dim=-1)


def _ngpt_attention(mha, query, key_value, key_padding_mask=None, causal=False, head_norms=False):
    """NVIDIA/ngpt ``Block.forward``'s attention: per head ``q = s_qk * justnorm(q)``, ``k = s_qk * justnorm(k)``,
    ``s_qk = sqk * (sqk_init_value / sqk_init_scaling)`` with ``sqk_init_scaling = 1/sqrt(C)`` (the model keeps it as
    ``q_proj.sqk``), softmax scale ``sqrt(C/H)``; values and output projection plain."""
    T, B, C = query.shape
    S = key_value.shape[0]
    H = mha.num_heads
    d = C // H
    sqk = (mha.q_proj.sqk * (1.0 / (1.0 / math.sqrt(C)))).view(H, d)
    q = sqk * _unit(F.linear(query, mha.q_proj.weight, mha.q_proj.bias).view(T, B, H, d))
    k = sqk * _unit(F.linear(key_value, mha.k_proj.weight, mha.k_proj.bias).view(S, B, H, d))
    v = F.linear(key_value, mha.v_proj.weight, mha.v_proj.bias).view(S, B, H, d)
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # B x H x len x d
    scores = (q @ k.transpose(-1, -2)) * math.sqrt(d)
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    if causal:
        scores = scores.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))
    out = (torch.softmax(scores, dim=-1) @ v).permute(2, 0, 1, 3).reshape(T, B, C)
    return F.linear(out, mha.out_proj.weight, mha.out_proj.bias)


def _ngpt_ffn(layer, x):
    """fairseq's FFN with NVIDIA/ngpt's ``uv = suv * (suv_init_value / suv_init_scaling * sqrt(n_embd)) * c_fc(h)``
    (``suv_init_scaling = 1``) on the first projection's output, before the activation (ReLU)."""
    u = F.linear(x, layer.fc1.weight, layer.fc1.bias) * (layer.fc1.suv * math.sqrt(x.shape[-1]))
    return F.linear(F.relu(u), layer.fc2.weight, layer.fc2.bias)


class NGPT(Transcription):
    """NVIDIA/ngpt ``Block.forward`` (use_nGPT = 1), per sub-layer:
    ``lr = |alpha * (alpha_init / base_scale)|``, ``A = justnorm(h)``, ``B = justnorm(F(h))``,
    ``h = justnorm(A + lr * (B - A))``, base_scale = 1/sqrt(C); no LayerNorm, no final norm; the stream starts at
    ``justnorm`` of the embedding output; logits ``sz * (sz_init_value / base_scale) * lm_head(h)``.
    ``outer_norm=False`` (the negative control) leaves out the last ``justnorm`` of the update."""

    final = False
    attention = staticmethod(_ngpt_attention)
    ffn = staticmethod(_ngpt_ffn)

    def __init__(self, alpha_init=0.05, outer_norm=True):
        self.alpha_init, self.outer_norm = alpha_init, outer_norm

    def start(self, stack, x):
        return _unit(x)

    def sublayer(self, stack, layer, l, kind, state, branch):
        alpha = getattr(layer, f"{kind}_residual").alpha
        base_scale = 1.0 / math.sqrt(state.shape[-1])
        lr = torch.abs(alpha * (self.alpha_init / base_scale))
        a, b = _unit(state), _unit(branch(state))
        res = a + lr * (b - a)
        return _unit(res) if self.outer_norm else res

    def logit_scale(self, stack):
        proj = stack.output_projection
        return proj.sz * (1.0 / (1.0 / math.sqrt(proj.weight.shape[1])))


REFERENCES["ngpt"] = (["--ngpt-alpha-init", 0.07], NGPT(0.07), NGPT(0.07, outer_norm=False))


def assert_matches_transcription(model, d, reference, controls=(), tol=1e-5):
    """Assert that ``model`` (eval mode) computes what transcription ``reference`` computes from its weights, on a
    padded random batch of 5 sentences over dictionary ``d``: the encoder output (S x B x C) and the decoder's
    log-probabilities (B x T x V) within ``tol`` (padded positions, which fairseq leaves unspecified, left out); and
    that every negative control in ``controls`` (a transcription with one thing changed) differs from the model's
    log-probabilities by more than 1e-3, so that the comparison is sensitive to what each control changes.

    Returns:
        ``(encoder output, its non-padded positions S x B)`` for further checks.
    """
    from conftest import random_batch

    src, lengths, prev, _ = random_batch(d, bsz=5)
    assert src.eq(d.pad()).any() and prev.eq(d.pad()).any(), "the batch must contain padding"
    with torch.no_grad():
        enc_ref, lp_ref = reference_forward(model, src, prev, reference)
        lp_controls = [reference_forward(model, src, prev, c)[1] for c in controls]
        enc = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
        lp = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    keep_src, keep_tgt = src.ne(d.pad()).t(), prev.ne(d.pad())
    assert (enc - enc_ref)[keep_src].abs().max().item() <= tol
    assert (lp - lp_ref)[keep_tgt].abs().max().item() <= tol
    for control, lp_ctl in zip(controls, lp_controls):
        assert (lp - lp_ctl)[keep_tgt].abs().max().item() > 1e-3, f"negative control {control!r} gives the same"
    return enc, keep_src

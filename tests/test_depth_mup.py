"""Depth-µP / CompleteP (``depth_mup``): Pre-LN at L = L_base, the per-stack branch multiplier, and the optimizer side
(the layers' learning rate times (L/L_base)^(alpha-1) after every scheduler update, their eps times
(L/L_base)^(-alpha)) through fairseq's own Adam and inverse-square-root scheduler, resumed from a state dict."""
import argparse
import copy

import pytest
import torch

from conftest import build_model, make_dictionary, random_batch, train_step

LR, EPS, WARMUP = 1e-3, 1e-8, 4


def _model(*flags, seed=0, d=None):
    torch.manual_seed(seed)
    model, _, _ = build_model("residual_transformer_tiny", *flags, dictionary=d or make_dictionary())
    return model.eval()


def test_equals_pre_ln_where_the_multiplier_is_one():
    """At L = L_base (N = M = 2, --depth-base 2) the model is Pre-LN with the same weights; elsewhere it is not."""
    d = make_dictionary()
    src, lengths, prev, _ = random_batch(d, seed=3)
    pre = _model("--residual-scheme", "pre_ln", d=d)
    weights = dict(pre.named_parameters())
    outs = {}
    for base in (2, 8):
        model = _model("--residual-scheme", "depth_mup", "--depth-base", str(base), "--depth-alpha", "1", d=d)
        params = dict(model.named_parameters())
        assert params.keys() == weights.keys()
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(weights[name])
        with torch.no_grad():
            outs[base] = model(src, lengths, prev)[0]
    with torch.no_grad():
        ref = pre(src, lengths, prev)[0]
    torch.testing.assert_close(outs[2], ref, atol=1e-6, rtol=0)
    assert (outs[8] - ref).abs().max() > 1e-3


def test_branch_multiplier_per_stack():
    model = _model("--residual-scheme", "depth_mup", "--encoder-layers", "3", "--decoder-layers", "2",
                   "--depth-base", "4", "--depth-alpha", "0.5")
    for layer in model.encoder.layers:
        for r in (layer.self_attn_residual, layer.ffn_residual):
            assert r.branch_scale == pytest.approx((4 / 3) ** 0.5)
    for layer in model.decoder.layers:
        for r in (layer.self_attn_residual, layer.encoder_attn_residual, layer.ffn_residual):
            assert r.branch_scale == pytest.approx((4 / 2) ** 0.5)


def _adam(model):
    from fairseq import optim

    cfg = argparse.Namespace(optimizer="adam", lr=[LR], adam_betas="(0.9, 0.98)", adam_eps=EPS, weight_decay=0.0,
                             use_old_adam=False, fp16_adam_stats=False, tpu=False)
    return optim.build_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])


def _scheduler(optimizer):
    from fairseq.optim.lr_scheduler import build_lr_scheduler

    cfg = argparse.Namespace(lr_scheduler="inverse_sqrt", lr=[LR], warmup_updates=WARMUP, warmup_init_lr=1e-7)
    return build_lr_scheduler(cfg, optimizer)


def _expected(model, n, m, base, alpha):
    """{id(param): (lr factor, eps factor)} by the paper's rule, from the parameter's name."""
    out = {}
    for name, p in model.named_parameters():
        depth = n if name.startswith("encoder.layers.") else m if name.startswith("decoder.layers.") else None
        out[id(p)] = (1.0, 1.0) if depth is None else ((depth / base) ** (alpha - 1), (depth / base) ** -alpha)
    return out


def _check_groups(optimizer, expected, scheduler_lr):
    seen = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            lr_factor, eps_factor = expected[id(p)]
            assert group["lr"] == pytest.approx(scheduler_lr * lr_factor, rel=1e-12)
            assert group["eps"] == pytest.approx(EPS * eps_factor, rel=1e-12)
            seen += 1
    assert seen == len(expected)


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_learning_rate_and_eps_follow_the_scheduler_and_resume(alpha):
    """fairseq's Adam and inverse_sqrt scheduler: every layer parameter's group has lr = scheduler lr x
    (L/L_base)^(alpha-1) and eps = --adam-eps x (L/L_base)^(-alpha) after each update (per stack: N = 3, M = 2,
    L_base = 2), the rest lr and eps as given; get_lr reports the scheduler's lr. A fresh optimizer and scheduler
    loaded from the state dicts, as fairseq's trainer resumes, keep both."""
    d = make_dictionary()
    flags = ("--residual-scheme", "depth_mup", "--encoder-layers", "3", "--decoder-layers", "2",
             "--depth-base", "2", "--depth-alpha", str(alpha))
    model = _model(*flags, d=d)
    expected = _expected(model, 3, 2, 2, alpha)
    optimizer = _adam(model)
    scheduler = _scheduler(optimizer)
    assert len(optimizer.param_groups) == 3  # embeddings and final norms; encoder layers; decoder layers
    for update in range(1, 7):
        train_step(model, optimizer, d, seed=update)
        lr = scheduler.step_update(update)
        assert optimizer.get_lr() == pytest.approx(lr, rel=1e-12)
        _check_groups(optimizer, expected, lr)
    state, opt_state = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    sched_state = copy.deepcopy(scheduler.state_dict())

    resumed = _model(*flags, seed=7, d=d)
    resumed.load_state_dict(state)
    opt = _adam(resumed)
    sched = _scheduler(opt)
    opt.load_state_dict(opt_state, {})
    sched.load_state_dict(sched_state)
    expected = _expected(resumed, 3, 2, 2, alpha)
    for update in range(7, 10):
        lr = sched.step_update(update)
        _check_groups(opt, expected, lr)
        train_step(resumed, opt, d, seed=update)


def test_layer_lr_moves_the_adam_step():
    """One Adam step from zero moments moves a parameter by about its group's lr: the encoder layers (L/L_base =
    4, alpha 1/2: lr x 1/2) half as far as with L = L_base, the embeddings as far."""
    d = make_dictionary()
    moved = {}
    for layers in ("2", "8"):
        model = _model("--residual-scheme", "depth_mup", "--encoder-layers", layers, "--depth-base", "2",
                       "--depth-alpha", "0.5", d=d)
        optimizer = _adam(model)
        _scheduler(optimizer).step_update(WARMUP)  # lr = LR
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        train_step(model, optimizer, d, seed=1)
        params = dict(model.named_parameters())
        moved[layers] = {n: (params[n] - before[n]).abs().max().item()
                         for n in ("encoder.layers.0.fc1.weight", "encoder.embed_tokens.weight")}
    assert moved["2"]["encoder.layers.0.fc1.weight"] == pytest.approx(LR, rel=1e-3)
    assert moved["8"]["encoder.layers.0.fc1.weight"] == pytest.approx(LR / 2, rel=1e-3)
    assert moved["8"]["encoder.embed_tokens.weight"] == pytest.approx(LR, rel=1e-3)


def test_flat_fp16_is_refused_with_the_fix():
    from fairseq_residual.schemes import get_scheme

    from fairseq_residual.training_checks import namespace_config

    scheme = get_scheme("depth_mup")
    args = argparse.Namespace(fp16=True, memory_efficient_fp16=False, fp16_no_flatten_grads=False, bf16=False)
    with pytest.raises(ValueError, match="--fp16-no-flatten-grads"):
        scheme.check_training(namespace_config(args), None)
    scheme.check_training(namespace_config(argparse.Namespace(fp16=True, memory_efficient_fp16=False,
                                                              fp16_no_flatten_grads=True, bf16=False)), None)


def test_an_optimizer_without_eps_gets_the_learning_rate_only():
    """fairseq's SGD has no eps: the layers' groups get lr x (L/L_base)^(alpha-1) and nothing else."""
    from fairseq import optim

    model = _model("--residual-scheme", "depth_mup", "--encoder-layers", "4", "--decoder-layers", "1",
                   "--depth-base", "1", "--depth-alpha", "0.5")
    cfg = argparse.Namespace(optimizer="sgd", lr=[LR], momentum=0.0, weight_decay=0.0)
    optimizer = optim.build_optimizer(cfg, list(model.parameters()))
    optimizer.set_lr(0.5)
    lrs = sorted(g["lr"] for g in optimizer.param_groups)
    assert lrs == pytest.approx([0.25, 0.5, 0.5]) and all("eps" not in g for g in optimizer.param_groups)

"""Checkpoints of another parameter layout: resuming their optimizer state when the checkpoint's parameter
order or groups are not the model's (fairseq loads it by position), and averaging them with newer ones. Admin
checkpoints of the layout before the residual protocol listed their omegas under the reference code's names and
in another order; any later order change would do the same."""
import argparse
import copy

import pytest
import torch

from conftest import build_model, make_dictionary, train_step
from fairseq_residual.schemes.admin import REFERENCE_NAMES


def fairseq_adam(model):
    """fairseq's Adam, built as the trainer builds it (``fairseq.optim.build_optimizer``)."""
    from fairseq import optim

    cfg = argparse.Namespace(optimizer="adam", lr=[1e-2], adam_betas="(0.9, 0.98)", adam_eps=1e-8, weight_decay=0.0,
                             use_old_adam=False, fp16_adam_stats=False, tpu=False)
    return optim.build_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])


def old_layout(model_state, optimizer_state, param_names):
    """The checkpoint as the layout before the residual protocol wrote it: Admin's omegas under the reference
    code's names (``layers.i.attention_ratio_change``, ...), every layer's tensors in reversed order (another
    registration order), the optimizer state positional in that order."""
    renamed = {f"{stack}.layers.{{}}.{new}_residual.omega": f"{stack}.layers.{{}}.{old}"
               for stack, names in REFERENCE_NAMES.items() for old, new in names.items()}

    def old_name(key):
        parts = key.split(".")
        if len(parts) > 3 and parts[1] == "layers":
            template = ".".join(parts[:2] + ["{}"] + parts[3:])
            if template in renamed:
                return renamed[template].format(parts[2])
        return key

    def layer_of(key):
        parts = key.split(".")
        return (parts[0], int(parts[2])) if len(parts) > 2 and parts[1] == "layers" else None

    keys, order, i = list(model_state), [], 0
    while i < len(keys):  # reverse each layer's run of keys
        j = i
        while j < len(keys) and layer_of(keys[j]) is not None and layer_of(keys[j]) == layer_of(keys[i]):
            j += 1
        order += keys[i:j][::-1] if j > i else [keys[i]]
        i = max(j, i + 1)
    old_model = {old_name(k): model_state[k] for k in order}
    saved = [n for n in order if n in param_names]
    position = {n: i for i, n in enumerate(param_names)}
    old_optimizer = copy.deepcopy(optimizer_state)
    old_optimizer["state"] = {k: optimizer_state["state"][position[n]] for k, n in enumerate(saved)
                              if position[n] in optimizer_state["state"]}
    assert saved != param_names, "the old layout's parameter order differs"
    return old_model, old_optimizer


@pytest.mark.parametrize("remap", [True, False], ids=["by-name", "by-position-negative-control"])
def test_optimizer_state_follows_parameter_names_on_resume(remap, monkeypatch):
    """Resuming an Admin run from its old-layout checkpoint continues exactly as resuming from today's
    layout (same parameters after one more Adam step); loaded by position (fairseq's load, the negative
    control) the moments land on other parameters and the run is refused (shapes differ) or continues
    differently."""
    d = make_dictionary()
    flags = ["--residual-scheme", "admin", "--dropout", "0"]
    torch.manual_seed(0)
    model, _, _ = build_model("residual_transformer_tiny", *flags, dictionary=d)
    optimizer = fairseq_adam(model)
    train_step(model, optimizer, d, seed=1)
    state, opt_state = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    names = [n for n, p in model.named_parameters() if p.requires_grad]

    def resume(model_state, optimizer_state):
        torch.manual_seed(5)
        resumed, _, _ = build_model("residual_transformer_tiny", *flags, dictionary=d)
        resumed.load_state_dict(copy.deepcopy(model_state))
        opt = fairseq_adam(resumed)  # the trainer builds the optimizer after loading the model
        opt.load_state_dict(copy.deepcopy(optimizer_state))
        train_step(resumed, opt, d, seed=2)
        return resumed.state_dict()

    expected = resume(state, opt_state)
    if not remap:  # fairseq's positional load
        monkeypatch.setattr("fairseq_residual.optimizer_order.in_current_order", lambda groups, s: s)
    old_model, old_optimizer = old_layout(state, opt_state, names)
    if remap:
        got = resume(old_model, old_optimizer)
        for key, value in expected.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=key)
    else:
        try:
            got = resume(old_model, old_optimizer)
        except RuntimeError as error:  # Adam's moments of one shape on a parameter of another
            assert "shape" in str(error)
        else:
            assert any(not torch.equal(got[k], v) for k, v in expected.items())


def test_optimizer_state_of_another_layout_is_refused_with_the_fix():
    """Optimizer state whose moments do not fit the parameters (a layout no name maps) is refused before
    Adam's step, naming --reset-optimizer."""
    d = make_dictionary()
    torch.manual_seed(0)
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "admin", dictionary=d)
    optimizer = fairseq_adam(model)
    train_step(model, optimizer, d, seed=1)
    opt_state = copy.deepcopy(optimizer.state_dict())
    opt_state["state"][0], opt_state["state"][1] = opt_state["state"][1], opt_state["state"][0]
    shapes = [p.shape for p in model.parameters()]
    assert shapes[0] != shapes[1]
    with pytest.raises(ValueError, match=r"optimizer state 'exp_avg' of parameter 0 .*--reset-optimizer"):
        fairseq_adam(model).load_state_dict(opt_state)


def _hc_adam(model, weight_decay):
    from fairseq import optim

    cfg = argparse.Namespace(optimizer="adam", lr=[1e-2], adam_betas="(0.9, 0.98)", adam_eps=1e-8,
                             weight_decay=weight_decay, use_old_adam=False, fp16_adam_stats=False, tpu=False)
    return optim.build_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])


@pytest.mark.parametrize("saved_groups", ["today", "one group"])
def test_hyper_connections_resume_with_another_weight_decay(saved_groups, monkeypatch):
    """A hyper-connections run saved with --weight-decay 0 resumes with --weight-decay 0.1: its static
    weights' own group exists whatever the value (torch refused 'a different number of parameter groups'), and
    a checkpoint of the one group that --weight-decay 0 used to give is split into today's groups, every
    parameter's moments by name, the static weights without weight decay."""
    import fairseq_residual.optim_groups as optim_groups

    d = make_dictionary()
    torch.manual_seed(0)
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "hyper_connections", dictionary=d)
    if saved_groups == "one group":
        with monkeypatch.context() as m:
            m.setattr(optim_groups, "apply_overrides", lambda optimizer: 0)
            optimizer = _hc_adam(model, 0.0)
    else:
        optimizer = _hc_adam(model, 0.0)
    train_step(model, optimizer, d, seed=1)
    state, opt_state = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    assert len(opt_state["param_groups"]) == (1 if saved_groups == "one group" else 2)
    moments = {n: optimizer.optimizer.state[p]["exp_avg"].clone() for n, p in model.named_parameters()}

    torch.manual_seed(5)
    resumed, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "hyper_connections", dictionary=d)
    resumed.load_state_dict(copy.deepcopy(state))
    opt = _hc_adam(resumed, 0.1)
    opt.load_state_dict(copy.deepcopy(opt_state))
    groups = opt.optimizer.param_groups
    assert len(groups) == 2 and groups[1]["weight_decay"] == 0.0
    static = {id(p) for n, p in resumed.named_parameters() if n.endswith(("static_alpha", "static_beta"))}
    assert {id(p) for p in groups[1]["params"]} == static
    for n, p in resumed.named_parameters():
        torch.testing.assert_close(opt.optimizer.state[p]["exp_avg"], moments[n], rtol=0, atol=0, msg=n)
    train_step(resumed, opt, d, seed=2)  # Adam steps with the moved moments


def test_checkpoints_across_the_admin_layout_change_average(tmp_path):
    """scripts/average_checkpoints.py renames an old-layout checkpoint's parameters as loading it would, so that
    checkpoints of one Admin run saved before and after the residual protocol average, to the same mean."""
    from residual_studies.checkpoints import average_checkpoints

    d = make_dictionary()
    states = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model, args, _ = build_model("residual_transformer_tiny", "--residual-scheme", "admin", dictionary=d)
        states.append((model.state_dict(), args))
    names = [n for n, p in model.named_parameters()]
    paths = []
    for i, (state, args) in enumerate(states):
        if i == 0:  # the older checkpoint, of the layout before the residual protocol
            state, _ = old_layout(state, {"state": {}, "param_groups": []}, names)
        paths.append(tmp_path / f"checkpoint{i + 1}.pt")
        torch.save({"model": state, "cfg": {"model": args}}, paths[-1])
    averaged = average_checkpoints([str(p) for p in paths])["model"]
    for key, value in states[1][0].items():
        if value.is_floating_point():
            torch.testing.assert_close(averaged[key], (states[0][0][key] + value) / 2, msg=key)


def test_average_checkpoints_refuses_zero_checkpoints(tmp_path, capsys):
    from residual_studies import checkpoints

    with pytest.raises(SystemExit) as exit_:
        checkpoints.main(["--inputs", str(tmp_path), "--output", str(tmp_path / "a.pt"), "--num-update-checkpoints", "0"])
    assert exit_.value.code == 2
    assert "argument --num-update-checkpoints: must be at least 1, got 0" in capsys.readouterr().err

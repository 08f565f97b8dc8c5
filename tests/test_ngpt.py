"""nGPT (fairseq_residual/schemes/ngpt.py): exact against its transcription with every scale randomised and shared
embeddings; the weights on the sphere at build and after every optimizer step of fairseq's Trainer (fp32, and the
fp32 master copies of the bf16 / fp16 optimizer, listed or flat); the refusals; and, with fairseq-train, a run
killed after 2 updates and resumed from its checkpoint is on the sphere and bit-identical to an uninterrupted one."""
import signal
import sys
import textwrap
import types

import pytest
import torch

from conftest import REPO, USER_DIR, build_model, cli_env, make_dictionary, random_batch
from fairseq_residual.schemes.ngpt import on_sphere, renormalise, sphere_matrices
from references import NGPT, assert_matches_transcription
from trainers import samples, trainer

TOL = 1e-5


def _randomise_every_scale(model, seed=1):
    """alpha, s_qk, s_u and s_z off their initial values (the conformance suite randomises only alpha)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1] in ("alpha", "sqk", "suv", "sz"):
                p.mul_(1 + 0.5 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("flags", [(), ("--share-all-embeddings", "--activation-fn", "relu")])
def test_exact_with_every_scale_randomised(flags):
    d = make_dictionary()
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "ngpt", "--encoder-layers", 3,
                              "--decoder-layers", 2, "--ngpt-alpha-init", 0.1, *flags, dictionary=d)
    if flags:
        assert model.decoder.output_projection.weight is model.encoder.embed_tokens.weight
    _randomise_every_scale(model)
    enc, keep_src = assert_matches_transcription(model, d, NGPT(0.1), [NGPT(0.1, outer_norm=False)], tol=TOL)
    # every state on the sphere: the encoder output's rows have norm 1
    norms = enc.norm(dim=-1)[keep_src]
    assert (norms - 1).abs().max().item() < 1e-5


def test_every_matrix_is_on_the_sphere_at_build_and_the_list_is_complete():
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "ngpt", "--share-all-embeddings")
    assert on_sphere(model) < 1e-6
    listed = {id(p) for p, _ in sphere_matrices(model)}
    matrices = {n for n, p in model.named_parameters() if p.dim() == 2 and id(p) in listed}
    not_listed = {n for n, p in model.named_parameters() if p.dim() == 2 and id(p) not in listed}
    assert not_listed == set()  # sinusoidal positions: no other matrix
    assert "encoder.embed_tokens.weight" in matrices and "decoder.layers.1.encoder_attn.out_proj.weight" in matrices
    assert len(listed) == 1 + 2 * 6 + 2 * 10  # one shared embedding, 6 matrices per encoder layer, 10 per decoder layer


def _plain_step_then(model, hook):
    """One Adam step on a summed output, then ``hook`` (or nothing): how far the matrices are off the sphere."""
    d = make_dictionary()
    src, lengths, prev, _ = random_batch(d)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(src, lengths, prev)[0].logsumexp(-1).sum().backward()
    opt.step()
    if hook:
        renormalise(model, opt)
    return on_sphere(model)


def test_renormalise_puts_an_updated_model_back_on_the_sphere():
    ours, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "ngpt")
    theirs, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "ngpt")
    assert _plain_step_then(theirs, hook=False) > 1e-3  # negative control: a step leaves the sphere
    assert _plain_step_then(ours, hook=True) < 1e-6


@pytest.mark.parametrize("precision", [(), ("--bf16", "--fp16-no-flatten-grads")], ids=["fp32", "bf16"])
def test_fairseqs_trainer_renormalises_after_every_step(precision):
    """fairseq's own Trainer (task.optimizer_step): after each update the model's matrices, and in bf16 the fp32
    master copies the optimizer steps, are on the sphere, and the model's weights are the masters rounded."""
    tr, d = trainer("ngpt", "--weight-decay", "0", *precision)
    model = tr.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for sample in samples(d, 2):
        tr.train_step([sample])
        assert on_sphere(model) < (1e-6 if not precision else 1e-2)
    assert tr.get_num_updates() == 2
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert "encoder.layers.0.fc1.weight" in moved and "decoder.output_projection.sz" in moved
    if precision:
        opt = tr.optimizer
        assert hasattr(opt, "fp32_params") and isinstance(opt.fp32_params, list)
        for p, master in zip(opt.fp16_params, opt.fp32_params):
            assert torch.equal(p.data, master.data.to(p.dtype))
        masters = {id(p): m for p, m in zip(opt.fp16_params, opt.fp32_params)}
        for p, axis in sphere_matrices(model):
            n = masters[id(p)].data.norm(dim=axis)
            assert (n[n > 0] - 1).abs().max().item() < 1e-6


def test_flat_master_copy_is_renormalised_where_fairseq_reads_it():
    """fairseq's flat fp16 master (one fp32 tensor, the parameters in order): each matrix's slice is renormalised and
    copied into the model's weight, the other parameters' slices are left as they are."""
    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "ngpt")
    params = list(model.parameters())
    flat = torch.cat([p.detach().float().reshape(-1) * 3 for p in params])
    fake = types.SimpleNamespace(fp16_params=params, fp32_params={None: torch.nn.Parameter(flat.clone())})
    renormalise(model, fake)
    matrices = {id(p) for p, _ in sphere_matrices(model)}
    offset = 0
    for p in params:
        part = fake.fp32_params[None].data[offset: offset + p.numel()].view_as(p)
        if id(p) in matrices:
            assert torch.equal(p.data, part)
        else:
            assert torch.equal(part, flat[offset: offset + p.numel()].view_as(p))
        offset += p.numel()
    assert on_sphere(model) < 1e-6


@pytest.mark.parametrize("flags, message", [
    (("--adaptive-softmax-cutoff", "10"), r"--adaptive-softmax-cutoff replaces the output projection"),
    (("--decoder-output-dim", "32"), r"--decoder-output-dim 32 differs from --decoder-embed-dim 64"),
    (("--layernorm-embedding",), r"--layernorm-embedding adds a LayerNorm"),
])
def test_refusals_name_the_flag(flags, message):
    with pytest.raises(ValueError, match=message):
        build_model("residual_transformer_tiny", "--residual-scheme", "ngpt", *flags)


# ---------------------------------------------------------------------------------------------
# killed and resumed fairseq-train

TRAIN = ["--arch", "residual_transformer_tiny", "--residual-scheme", "ngpt", "--share-all-embeddings",
         "--optimizer", "adam", "--lr", "3e-3", "--weight-decay", "0", "--dropout", "0.1",
         "--max-tokens", "120", "--required-batch-size-multiple", "1", "--log-format", "simple", "--log-interval", "1",
         "--no-epoch-checkpoints", "--save-interval-updates", "2", "--disable-validation", "--seed", "3",
         "--num-workers", "0"]

WRAPPER = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    import fairseq_residual  # noqa: F401  (the plugin, as --user-dir loads it)
    from fairseq import checkpoint_utils

    kill_after = int(os.environ["KILL_AFTER_SAVE"])
    real_save, saves = checkpoint_utils.save_checkpoint, [0]

    def save_checkpoint(*args, **kwargs):
        out = real_save(*args, **kwargs)
        saves[0] += 1
        if saves[0] == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    checkpoint_utils.save_checkpoint = save_checkpoint
    from fairseq_cli.train import cli_main

    sys.argv = ["fairseq-train"] + sys.argv[1:]
    cli_main()
    """
)


def _train(tmp_path, data_bin, save, max_update, kill_after_save=0):
    import subprocess

    wrapper = tmp_path / "train.py"
    wrapper.write_text(WRAPPER.format(repo=str(REPO)))
    env = cli_env()
    env["KILL_AFTER_SAVE"] = str(kill_after_save)
    proc = subprocess.run([sys.executable, str(wrapper), str(data_bin), "--user-dir", USER_DIR, "--save-dir", str(save),
                           "--max-update", str(max_update), *TRAIN],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    expected = -signal.SIGKILL if kill_after_save else 0
    assert proc.returncode == expected, proc.stdout[-3000:]
    return proc.stdout


def _model_state(path):
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(str(path))["model"]


def _off_sphere(state):
    """The largest | ||row|| - 1 | of a checkpoint's matrices along their embedding axis (zero rows left out)."""
    worst = 0.0
    for key, w in state.items():
        if w.dim() != 2 or "embed_positions" in key:
            continue
        axis = 0 if key.endswith(("out_proj.weight", "fc2.weight")) else 1
        n = w.float().norm(dim=axis)
        worst = max(worst, float((n[n > 0] - 1).abs().max()))
    return worst


@pytest.mark.slow
def test_killed_and_resumed_run_is_on_the_sphere_and_bit_identical(tiny_data_bin, tmp_path):
    _, data_bin = tiny_data_bin
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    _train(tmp_path, data_bin, whole, 4)
    _train(tmp_path, data_bin, cut, 4, kill_after_save=1)  # killed right after the checkpoint of update 2
    assert (cut / "checkpoint_1_2.pt").exists() and not (cut / "checkpoint_1_4.pt").exists()
    resumed_from = _model_state(cut / "checkpoint_last.pt")
    assert _off_sphere(resumed_from) < 1e-6  # what the resumed run loads is on the sphere
    out = _train(tmp_path, data_bin, cut, 4)
    assert "Loaded checkpoint" in out and "@ 2 updates" in out, out[-3000:]
    a, b = _model_state(whole / "checkpoint_last.pt"), _model_state(cut / "checkpoint_last.pt")
    assert a.keys() == b.keys()
    assert not torch.equal(a["encoder.layers.0.fc1.weight"], resumed_from["encoder.layers.0.fc1.weight"])
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert _off_sphere(b) < 1e-6

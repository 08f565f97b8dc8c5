"""Admin: the profiled omegas against the reference recursion (LiyuanLucasLiu/Transformer-Clinic; its
forward against a transcription: tests/test_conformance.py), the profile file (read, write, errors), resume,
a 2-process gloo run, and fairseq-train / fairseq-generate through the CLI."""
import logging
import math
import os
import re
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from conftest import USER_DIR, build_model, log_probs, make_dictionary, random_batch, run_cli
from inprocess import fairseq_main
from references import ref_attention, ref_ffn, ref_ln
from fairseq_residual.schemes import admin as admin_scheme
from fairseq_residual.schemes import admin_profile

TOL = 1e-5
EPS = 1e-5
FLAGS = ["--residual-scheme", "admin", "--encoder-layers", 3, "--decoder-layers", 2]
NO_DROPOUT = ["--dropout", 0, "--attention-dropout", 0, "--activation-dropout", 0]
ENC_NAMES = ("self_attn", "ffn")  # the sub-layers whose residual holds an omega
DEC_NAMES = ("self_attn", "encoder_attn", "ffn")


def omega_of(layer, kind):
    return getattr(layer, f"{kind}_residual").omega


def ref_admin(model, src, prev, omega=None, profile=False):
    """The reference's Admin forward: x = LN(omega * x + F(x)) per sub-layer, Post-LN, no stack LN.

    ``omega(stack, i, name)`` gives the omega vector of a sub-layer (default: the model's parameter).
    With ``profile=True`` the omegas are instead computed by the reference's recursion, sub-layer by
    sub-layer and per stack: omega_k = r (r = 1 for k = 1), r = sqrt(Var[omega_k x_k] + Var[F_k(x_k)]).
    Returns ``(log-probs B x T x V, encoder output S x B x C, {stack: [profiled scalars]})``.
    """
    enc, dec = model.encoder, model.decoder
    pad = enc.padding_idx
    src_pad, tgt_pad = src.eq(pad), prev.eq(pad)
    ratios = {"encoder": [], "decoder": []}
    running = {"encoder": 1.0, "decoder": 1.0}

    def residual(stack, layer, i, name, x, h):
        if profile:
            w = torch.full_like(x[0, 0], running[stack])
            ratios[stack].append(running[stack])
            running[stack] = math.sqrt(
                (w * x).double().var(unbiased=False).item() + h.double().var(unbiased=False).item()
            )
        else:
            w = omega(stack, i, name) if omega is not None else omega_of(layer, name)
        return w * x + h

    x = enc.embed_scale * enc.embed_tokens(src) + enc.embed_positions(src)
    x = (x * (1 - src_pad.unsqueeze(-1).float())).transpose(0, 1)
    for i, layer in enumerate(enc.layers[j] for j in range(len(enc.layers))):
        h = ref_attention(layer.self_attn, x, x, key_padding_mask=src_pad)
        x = ref_ln(layer.self_attn_layer_norm, residual("encoder", layer, i, ENC_NAMES[0], x, h), EPS)
        h = ref_ffn(layer, x)
        x = ref_ln(layer.final_layer_norm, residual("encoder", layer, i, ENC_NAMES[1], x, h), EPS)
    enc_out = x

    y = (dec.embed_scale * dec.embed_tokens(prev) + dec.embed_positions(prev)).transpose(0, 1)
    for i, layer in enumerate(dec.layers[j] for j in range(len(dec.layers))):
        h = ref_attention(layer.self_attn, y, y, key_padding_mask=tgt_pad, causal=True)
        y = ref_ln(layer.self_attn_layer_norm, residual("decoder", layer, i, DEC_NAMES[0], y, h), EPS)
        h = ref_attention(layer.encoder_attn, y, enc_out, key_padding_mask=src_pad)
        y = ref_ln(layer.encoder_attn_layer_norm, residual("decoder", layer, i, DEC_NAMES[1], y, h), EPS)
        h = ref_ffn(layer, y)
        y = ref_ln(layer.final_layer_norm, residual("decoder", layer, i, DEC_NAMES[2], y, h), EPS)
    logits = F.linear(y.transpose(0, 1), dec.output_projection.weight)
    return torch.log_softmax(logits, dim=-1), enc_out, ratios


def test_profile_equals_reference_recursion(caplog):
    d = make_dictionary()
    model, _, _ = build_model("residual_transformer_tiny", *FLAGS, *NO_DROPOUT, dictionary=d)
    src, lengths, prev, _ = random_batch(d, bsz=5)
    for stack in (model.encoder, model.decoder):
        assert int(stack.residual.profiled) == 0
    # eval mode before profiling: a warning, omegas untouched
    with caplog.at_level(logging.WARNING, logger=admin_scheme.__name__):
        with torch.no_grad():
            log_probs(model, src, lengths, prev)
    assert "used in eval mode before it was profiled" in caplog.text
    assert all(torch.all(p == 1) for n, p in model.named_parameters() if n.endswith(".omega"))

    model.train()  # the first training forward profiles this batch, then runs the normal forward
    with caplog.at_level(logging.INFO, logger=admin_scheme.__name__):
        lp_train = log_probs(model, src, lengths, prev)
    _, _, expected = ref_admin(model, src, prev, profile=True)
    for stack, names in (("encoder", ENC_NAMES), ("decoder", DEC_NAMES)):
        s = getattr(model, stack)
        assert int(s.residual.profiled) == 1
        profile = s.residual.profile.tolist()
        assert len(profile) == len(names) * len(s.layers) == len(expected[stack])
        assert profile[0] == 1.0
        assert all(b > a for a, b in zip(profile, profile[1:]))  # variances accumulate
        for got, want in zip(profile, expected[stack]):
            assert abs(got - want) <= 1e-5 * want
        omegas = [omega_of(layer, n) for layer in s.layers for n in names]
        for omega, r in zip(omegas, profile):
            assert torch.allclose(omega, torch.full_like(omega, r))  # all d entries = the scalar
    lines = [r.getMessage() for r in caplog.records if "profiled on the first training batch" in r.getMessage()]
    assert len(lines) == 2  # one line per stack
    # the forward of that first batch already used the profiled omegas
    with torch.no_grad():
        lp_ref, _, _ = ref_admin(model, src, prev)
    assert (lp_train - lp_ref)[prev.ne(d.pad())].abs().max().item() <= TOL
    # a second training forward does not re-profile
    with torch.no_grad():
        omega_of(model.encoder.layers[0], "self_attn").fill_(7.0)
    log_probs(model, src, lengths, prev)
    assert torch.all(omega_of(model.encoder.layers[0], "self_attn") == 7.0)


def test_profile_file_roundtrip_and_errors(tmp_path):
    d = make_dictionary()
    model, _, _ = build_model("residual_transformer_tiny", *FLAGS, *NO_DROPOUT, dictionary=d)
    model.train()
    src, lengths, prev, _ = random_batch(d, bsz=5)
    log_probs(model, src, lengths, prev)
    path = tmp_path / "profile.ratio.init"
    admin_profile.write_profile(path, model.encoder.residual.profile.tolist(), model.decoder.residual.profile.tolist())
    lines = path.read_text().splitlines()
    assert [int(line.split()[0]) for line in lines] == [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]

    # --admin-profile: read at build, marked profiled, never re-profiled
    other, _, _ = build_model("residual_transformer_tiny", *FLAGS, *NO_DROPOUT, "--admin-profile", path,
                              dictionary=d)
    for stack in ("encoder", "decoder"):
        assert torch.equal(getattr(other, stack).residual.profile, getattr(model, stack).residual.profile)
        assert int(getattr(other, stack).residual.profiled) == 1
    assert torch.equal(omega_of(other.decoder.layers[1], "encoder_attn"), omega_of(model.decoder.layers[1], "encoder_attn"))
    other.train()
    with torch.no_grad():
        omega_of(other.decoder.layers[0], "ffn").fill_(3.0)
    log_probs(other, src, lengths, prev)
    assert torch.all(omega_of(other.decoder.layers[0], "ffn") == 3.0)

    # a profile of another depth is refused, naming the depth it fits and the fix
    with pytest.raises(ValueError) as err:
        build_model("residual_transformer_tiny", "--residual-scheme", "admin", "--admin-profile", path,
                    dictionary=d)
    msg = str(err.value)
    assert "3 encoder and 2 decoder layers" in msg  # the depth the file fits
    assert "2 encoder and 2 decoder layers needs 10" in msg and "profiled at another depth" in msg
    assert "drop --admin-profile" in msg
    # a malformed line
    bad = tmp_path / "bad.init"
    bad.write_text("1 1.0\n2 abc\n")
    with pytest.raises(ValueError, match=r"bad.init line 2: expected 'k r'"):
        build_model("residual_transformer_tiny", *FLAGS, "--admin-profile", bad, dictionary=d)
    # a missing file: the model builds (a checkpoint may be decoded where the file is gone), but the
    # first training batch fails before any update, never falling back to omega = 1
    missing = tmp_path / "nope.init"
    m, _, _ = build_model("residual_transformer_tiny", *FLAGS, "--admin-profile", missing, dictionary=d)
    m.train()
    with pytest.raises(FileNotFoundError, match=r"nope.init: no such file; drop --admin-profile"):
        log_probs(m, src, lengths, prev)
    assert int(m.encoder.residual.profiled) == 0
    # --admin-profile with another scheme is refused
    with pytest.raises(ValueError, match=r"--admin-profile \(model.admin_profile\) is an option of --residual-scheme admin"):
        build_model("residual_transformer_tiny", "--residual-scheme", "post_ln", "--admin-profile", path,
                    dictionary=d)


TRAIN_FLAGS = [
    "--optimizer", "adam", "--lr", "5e-3", "--criterion", "label_smoothed_cross_entropy",
    "--label-smoothing", "0.1", "--max-tokens", "600", "--required-batch-size-multiple", "1",
    "--log-format", "simple", "--log-interval", "1", "--no-epoch-checkpoints", "--seed", "3",
    "--num-workers", "0", "--arch", "residual_transformer_tiny", "--residual-scheme", "admin",
]


def train(data_bin, save_dir, *flags, max_update):
    """fairseq-train in-process; returns its log."""
    return fairseq_main("fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save_dir,
                        "--max-update", max_update, *TRAIN_FLAGS, *flags)


def cli_train(data_bin, save_dir, *flags, max_update):
    """fairseq-train as a process of its own (what a user sees: exit status and message)."""
    return run_cli(["fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save_dir,
                    "--max-update", max_update, *TRAIN_FLAGS, *flags], check=False)


def load(path):
    import fairseq_residual  # noqa: F401  (allow-lists fairseq's checkpoint globals)

    return torch.load(path, map_location="cpu")["model"]


def test_cli_train_resume_generate_and_profile_file(tiny_data_bin, tmp_path):
    raw, data_bin = tiny_data_bin
    save = tmp_path / "ckpt"
    log = train(data_bin, save, max_update=2)
    profiled = r"Admin omegas of the (encoder|decoder) \(profiled on the first training batch\)"
    assert len(re.findall(profiled, log)) == 2
    first = load(save / "checkpoint_last.pt")
    assert int(first["encoder.residual_scheme_id"]) == 4
    assert int(first["encoder.residual.profiled"]) == 1 and int(first["decoder.residual.profiled"]) == 1
    profile = {s: first[f"{s}.residual.profile"] for s in ("encoder", "decoder")}
    assert profile["encoder"].numel() == 4 and profile["decoder"].numel() == 6 and profile["encoder"][0] == 1

    # resume to 4 updates: not re-profiled, and the log says so
    log = train(data_bin, save, max_update=4)
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 2 updates\)", log)
    assert "profiled on the first training batch" not in log
    assert "Admin omegas already profiled (profiled=1, from the checkpoint" in log
    second = load(save / "checkpoint_last.pt")
    for s in ("encoder", "decoder"):
        assert torch.equal(second[f"{s}.residual.profile"], profile[s])
    # omegas are trainable: they moved away from the profile
    name = "encoder.layers.1.ffn_residual.omega"
    assert not torch.allclose(second[name], first[name])

    gen = fairseq_main("fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
                       "--beam", "5", "--batch-size", "16", "--required-batch-size-multiple", "1",
                       "--num-workers", "0")
    assert len([x for x in gen.splitlines() if x.startswith("H-")]) == sum(1 for _ in open(raw / "test.src"))
    assert re.search(r"Generate test with beam=5: BLEU4 = \d+\.\d+", gen)
    assert "before it was profiled" not in gen

    # export the profile, train a fresh model from it
    out = tmp_path / "profile.ratio.init"
    script = os.path.join(os.path.dirname(sys.executable), "fairseq-residual-admin-profile")  # the console script
    proc = run_cli([script, save / "checkpoint_last.pt", out])
    assert f"wrote {out}" in proc.stdout
    assert len(out.read_text().splitlines()) == 10
    log = train(data_bin, tmp_path / "from_file", "--admin-profile", out, max_update=1)
    assert f"Admin omegas read from --admin-profile {out}" in log
    assert "profiled on the first training batch" not in log
    third = load(tmp_path / "from_file" / "checkpoint_last.pt")
    assert torch.allclose(third["decoder.residual.profile"], profile["decoder"])

    # the user errors, through the CLI
    proc = cli_train(data_bin, tmp_path / "deep", "--admin-profile", out, "--encoder-layers", 3, max_update=1)
    assert proc.returncode != 0 and "profiled at another depth" in proc.stdout
    assert "3 encoder and 2 decoder layers needs 12" in proc.stdout
    proc = cli_train(data_bin, tmp_path / "missing", "--admin-profile", tmp_path / "nope", max_update=1)
    assert proc.returncode != 0 and "nope: no such file" in proc.stdout
    assert not (tmp_path / "missing" / "checkpoint_last.pt").exists()


DIST_WRAPPER = textwrap.dedent(
    """
    # fairseq-train under torchrun, recording each rank's own profile (before the broadcast) and its
    # final omegas, so that the test can compare the two ranks.
    import os, sys, torch
    from fairseq_residual.schemes import admin
    from fairseq import trainer as trainer_mod
    out = os.environ["ADMIN_DUMP"]
    rank = os.environ["RANK"]
    profile_model = admin.profile_model

    def recording_profile_model(model, net_input):
        profile_model(model, net_input)
        torch.save({s: getattr(model, s).residual.profile.clone() for s in ("encoder", "decoder")},
                   f"{out}/local_profile.{rank}.pt")

    admin.profile_model = recording_profile_model
    trainers = []
    init = trainer_mod.Trainer.__init__

    def recording_init(self, *a, **k):
        init(self, *a, **k)
        trainers.append(self)

    trainer_mod.Trainer.__init__ = recording_init
    # fairseq infers the device from the CUDA device count under torchrun: give the rank explicitly
    sys.argv += ["--distributed-rank", rank, "--device-id", os.environ["LOCAL_RANK"]]
    from fairseq_cli.train import cli_main
    cli_main()
    model = trainers[0].get_model()
    torch.save({n: t.detach().clone() for n, t in model.state_dict().items()
                if n.endswith(".omega") or ".residual.profile" in n}, f"{out}/final.{rank}.pt")
    # hold no Trainer (and through it fairseq's gloo group) past the script, so that the plugin's exit hook
    # ends the group's threads while the interpreter is whole (fairseq_residual/process_group.py)
    del model
    trainers.clear()
    """
)


def test_two_process_gloo_run_uses_one_profile(tiny_data_bin, tmp_path):
    _, data_bin = tiny_data_bin
    wrapper = tmp_path / "train_dump.py"
    wrapper.write_text(DIST_WRAPPER)
    dump = tmp_path / "dump"
    dump.mkdir()
    save = tmp_path / "ckpt"
    env_cmd = ["env", f"ADMIN_DUMP={dump}", "torchrun", "--nnodes", "1", "--nproc_per_node", "2",
               "--standalone", wrapper]
    run_cli([*env_cmd, data_bin, "--user-dir", USER_DIR, "--save-dir", save, "--max-update", 3,
             *TRAIN_FLAGS, "--cpu", "--distributed-world-size", 2, "--distributed-backend", "gloo",
             "--distributed-init-method", "env://", "--distributed-no-spawn", "--ddp-backend", "legacy_ddp"],
            timeout=600)
    local = [torch.load(dump / f"local_profile.{r}.pt") for r in (0, 1)]
    # each rank profiled its own shard of the data: without the broadcast they would disagree
    assert not torch.allclose(local[0]["encoder"], local[1]["encoder"])
    final = [torch.load(dump / f"final.{r}.pt") for r in (0, 1)]
    ckpt = load(save / "checkpoint_last.pt")
    assert set(final[0]) == set(final[1]) and len(final[0]) == 2 * 2 + 2 * 3 + 4  # omegas, profiles, flags
    for name, value in final[0].items():
        assert torch.equal(value, final[1][name]), name
        assert torch.equal(value, ckpt[name]), name
    for s in ("encoder", "decoder"):  # the one profile is rank 0's
        assert torch.equal(final[0][f"{s}.residual.profile"], local[0][s])


def test_layerdrop_profiles_every_layer():
    """With --encoder-layerdrop / --decoder-layerdrop 0.5 the first training batch still profiles every
    sub-layer (layer-drop is off while it profiles): one omega per sub-layer, none left at 1 but the first,
    and the recursion's values."""
    d = make_dictionary()
    model, _, _ = build_model("residual_transformer_tiny", *FLAGS, *NO_DROPOUT, "--encoder-layerdrop", 0.5,
                              "--decoder-layerdrop", 0.5, dictionary=d)
    src, lengths, prev, _ = random_batch(d, bsz=5)
    model.train()
    torch.manual_seed(0)
    log_probs(model, src, lengths, prev)
    _, _, expected = ref_admin(model, src, prev, profile=True)
    for stack, per_layer in (("encoder", 2), ("decoder", 3)):
        s = getattr(model, stack)
        profile = s.residual.profile.tolist()
        assert int(s.residual.profiled) == 1 and len(profile) == per_layer * len(s.layers)
        assert profile == pytest.approx(expected[stack], rel=1e-5)
        assert all(v > 1.0 for v in profile[1:])
    assert model.encoder.layers.p == 0.5  # layer-drop is back on for training


def _profile_lines(encoder_layers=2, decoder_layers=2):
    return [f"{k} {1.0 + k / 10}" for n in (2 * encoder_layers, 3 * decoder_layers) for k in range(1, n + 1)]


@pytest.mark.parametrize("bad", ["inf 1.0", "-inf 1.0", "1e999 1.0", "nan 1.0", "3.5 1.0", "x 1.0", "3 1.0 7"])
def test_malformed_profile_line_is_named_with_its_fix(bad, tmp_path):
    lines = _profile_lines()
    lines[2] = bad
    path = tmp_path / "profile.ratio.init"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as err:
        admin_profile.read_profile(str(path), 2, 2)
    msg = str(err.value)
    assert f"--admin-profile {path} line 3: expected 'k r'" in msg and repr(bad) in msg, msg
    assert "drop --admin-profile" in msg and "fairseq-residual-admin-profile CHECKPOINT OUT" in msg


def test_binary_or_empty_profile_file_is_named_with_its_fix(tmp_path):
    import zipfile

    binary = tmp_path / "profile.bin"
    binary.write_bytes(b"1 1.0\n2 1.1\n\x80\x02\xff\xfe garbage\n")
    with pytest.raises(ValueError) as err:
        admin_profile.read_profile(str(binary), 2, 2)
    msg = str(err.value)
    assert f"--admin-profile {binary} line 3 is not text" in msg and "drop --admin-profile" in msg, msg
    # a checkpoint passed by mistake: says so, and how to export its profile
    ckpt = tmp_path / "checkpoint_last.pt"
    with zipfile.ZipFile(ckpt, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02\xff" * 100)
    with pytest.raises(ValueError) as err:
        admin_profile.read_profile(str(ckpt), 2, 2)
    msg = str(err.value)
    assert f"--admin-profile {ckpt} is a checkpoint" in msg, msg
    assert f"fairseq-residual-admin-profile {ckpt} profile.ratio.init" in msg
    empty = tmp_path / "empty.init"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=rf"--admin-profile {re.escape(str(empty))} is empty"):
        admin_profile.read_profile(str(empty), 2, 2)
    good = tmp_path / "good.init"
    good.write_text("\n".join(_profile_lines()) + "\n")
    enc, dec = admin_profile.read_profile(str(good), 2, 2)
    assert enc == [1.1, 1.2, 1.3, 1.4] and dec == [1.1, 1.2, 1.3, 1.4, 1.5, 1.6]


def test_profile_exporter_on_empty_or_truncated_checkpoint_exits_1_naming_it(tmp_path, capsys):
    empty = tmp_path / "checkpoint_last.pt"
    empty.write_bytes(b"")
    out = tmp_path / "profile.ratio.init"
    assert admin_profile.main([str(empty), str(out)]) == 1  # fairseq-residual-admin-profile's main
    err = capsys.readouterr().err
    assert err.startswith(f"error: checkpoint {empty} is empty (0 bytes"), err
    assert not out.exists()

    full = tmp_path / "checkpoint_1_2.pt"
    torch.save({"model": {f"w{i}": torch.randn(64, 64) for i in range(4)}}, full)
    cut = tmp_path / "checkpoint_1_4.pt"
    cut.write_bytes(full.read_bytes()[:5000])
    assert admin_profile.main([str(cut), str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: checkpoint {cut} is truncated (5000 bytes"), err
    assert "export the profile from a complete checkpoint" in err and "beside it, newest first: checkpoint_1_2.pt)" in err
    notckpt = tmp_path / "notes.txt"
    notckpt.write_text("not a checkpoint\n")
    assert admin_profile.main([str(notckpt), str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {notckpt} cannot be read as a fairseq checkpoint (UnpicklingError: ") and "admin" in err, err
    assert "weights_only" not in err  # torch's advice to load unsafely is not passed on
    assert not out.exists()


def test_profile_exporter_on_a_checkpoint_of_another_scheme_names_that_scheme(tmp_path, capsys):
    from conftest import build_model

    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "resi_dual")
    ckpt, out = tmp_path / "checkpoint_last.pt", tmp_path / "profile.ratio.init"
    torch.save({"model": model.state_dict()}, ckpt)
    assert admin_profile.main([str(ckpt), str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {ckpt} is not a checkpoint of a --residual-scheme admin model (its encoder "
                          "scheme: resi_dual)"), err
    assert not out.exists()


def test_profile_exporter_names_a_folder_given_as_checkpoint_or_out(tmp_path, capsys):
    from conftest import build_model

    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "admin")
    ckpt = tmp_path / "checkpoint_last.pt"
    torch.save({"model": model.state_dict()}, ckpt)
    assert admin_profile.main([str(tmp_path), str(tmp_path / "profile.ratio.init")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: CHECKPOINT {tmp_path} is a folder, not a checkpoint") and "checkpoint_last.pt" in err
    for out, message in ((tmp_path, f"is a folder: name the profile file to write, e.g. {tmp_path}/profile.ratio.init"),
                         (tmp_path / "missing" / "profile.ratio.init",
                          f"is in a folder that does not exist, {tmp_path}/missing: create it (mkdir -p ")):
        assert admin_profile.main([str(ckpt), str(out)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: OUT {out} {message}"), err


def test_profile_exporter_help_exits_0_and_a_usage_error_exits_2(capsys):
    assert admin_profile.main(["--help"]) == 0
    assert "CHECKPOINT [OUT]" in capsys.readouterr().out
    assert admin_profile.main([]) == 2
    assert "the following arguments are required: CHECKPOINT" in capsys.readouterr().err
    assert admin_profile.main(["a.pt", "out", "extra"]) == 2

"""Kill-safe checkpoints (fairseq_residual/checkpoint_safety.py): a real fairseq-train killed at several
points of its save always resumes, from the newest complete checkpoint, and a truncated checkpoint given
to fairseq-generate is named as such.

The kills are deterministic: a wrapper (written by the test) runs fairseq-train in-process with
``shutil.copyfile`` (the checkpoint copy) or fairseq's ``_torch_persistent_save`` replaced by a version
that writes part of the file and then SIGKILLs its own process at the chosen save.
"""
import os
import re
import signal
import sys
import textwrap

import pytest

from conftest import REPO, USER_DIR, cli_env, run_cli
from inprocess import fairseq_main

# save 1 at update 2 (checkpoint_1_2.pt, copied to checkpoint_last.pt), save 2 at update 4 (checkpoint_1_4.pt)
TRAIN = [
    "--arch", "residual_transformer_tiny", "--residual-scheme", "post_ln", "--optimizer", "adam",
    "--lr", "1e-3", "--max-tokens", "120", "--required-batch-size-multiple", "1", "--log-format", "simple",
    "--log-interval", "1", "--no-epoch-checkpoints", "--save-interval-updates", "2",
    "--disable-validation", "--seed", "3", "--num-workers", "0",
]

WRAPPER = textwrap.dedent(
    """
    import os, shutil, signal, sys
    sys.path.insert(0, {repo!r})
    import fairseq_residual  # noqa: F401  (the plugin, as --user-dir loads it)
    from fairseq import checkpoint_utils, file_io

    mode, at = os.environ["KILL_MODE"], int(os.environ["KILL_AT"])
    calls = [0]

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if mode in ("copy", "stock_copy"):
        if mode == "stock_copy":  # fairseq's own, non-atomic copy: what a run without the plugin does
            checkpoint_utils.PathManager = file_io.PathManager
        real_copy = shutil.copyfile

        def copyfile(src, dst, *args, **kwargs):
            calls[0] += 1
            if calls[0] == at:
                with open(src, "rb") as f, open(dst, "wb") as g:
                    g.write(f.read()[:1000])
                    g.flush()
                die()
            return real_copy(src, dst, *args, **kwargs)

        shutil.copyfile = copyfile
    elif mode == "save":
        real_save = checkpoint_utils._torch_persistent_save

        def save(obj, f):
            calls[0] += 1
            if calls[0] == at:
                f.write(b"PK\\x03\\x04 partial")
                f.flush()
                die()
            return real_save(obj, f)

        checkpoint_utils._torch_persistent_save = save

    from fairseq_cli.train import cli_main

    sys.argv = ["fairseq-train"] + sys.argv[1:]
    cli_main()
    """
)


def killed_run(tmp_path, data_bin, save, mode, at):
    import subprocess

    wrapper = tmp_path / "train_and_kill.py"
    wrapper.write_text(WRAPPER.format(repo=str(REPO)))
    env = cli_env()
    env.update(KILL_MODE=mode, KILL_AT=str(at))
    proc = subprocess.run(
        [sys.executable, str(wrapper), str(data_bin), "--user-dir", USER_DIR, "--save-dir", str(save),
         "--max-update", "4", *TRAIN],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout[-3000:]
    return proc.stdout


@pytest.mark.parametrize(
    "mode, at, resumed_at, last_state",
    [
        ("copy", 1, 2, "missing"),  # killed copying update 2 to checkpoint_last.pt: none exists yet
        ("copy", 2, 4, "older"),  # killed copying update 4: checkpoint_last.pt still holds update 2
        ("save", 2, 2, "complete"),  # killed writing checkpoint_1_4.pt: only its .tmp is cut short
        ("stock_copy", 2, 4, "truncated"),  # fairseq's in-place copy killed: checkpoint_last.pt cut short
    ],
)
def test_killed_save_always_resumes_from_newest_complete_checkpoint(
    mode, at, resumed_at, last_state, tiny_data_bin, tmp_path
):
    _, data_bin = tiny_data_bin
    save = tmp_path / "ckpt"
    killed_run(tmp_path, data_bin, save, mode, at)
    last = save / "checkpoint_last.pt"
    if last_state == "missing":
        assert not last.exists()
    elif last_state == "truncated":
        assert last.exists() and last.stat().st_size == 1000
    else:
        assert last.stat().st_size > 1000
    if mode == "save":
        assert not (save / "checkpoint_1_4.pt").exists() and (save / "checkpoint_1_4.pt.tmp").exists()
    else:
        assert (save / f"checkpoint_1_{resumed_at}.pt").exists()

    out = fairseq_main("fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save, "--max-update", 6,
                       *TRAIN)
    loaded = re.search(r"Loaded checkpoint (\S+) \(epoch \d+ @ (\d+) updates\)", out)
    assert loaded, out[-3000:]
    assert int(loaded.group(2)) == resumed_at  # nothing already saved is lost
    if last_state == "complete":
        assert os.path.basename(loaded.group(1)) == "checkpoint_last.pt"
        assert "newest complete checkpoint" not in out
    else:
        assert os.path.basename(loaded.group(1)) == f"checkpoint_1_{resumed_at}.pt"
        reason = {"missing": "is missing", "older": "is older than it", "truncated": "is incomplete"}
        assert f"checkpoint_last.pt {reason[last_state]}" in out
    assert re.search(r"done training", out)
    assert re.search(r"num_updates 6\b|num_updates=6\b|@ 6 updates", out), out[-2000:]
    import zipfile

    assert zipfile.is_zipfile(last)  # the resumed run left a complete checkpoint_last.pt


def test_truncated_checkpoint_is_named_in_generate_and_resume(tiny_data_bin, tmp_path):
    raw, data_bin = tiny_data_bin
    save = tmp_path / "ckpt"
    fairseq_main("fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save, "--max-update", 2, *TRAIN)
    bad = tmp_path / "cut.pt"
    bad.write_bytes((save / "checkpoint_last.pt").read_bytes()[:5000])
    gen = run_cli(["fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", bad, "--beam", 2,
                   "--required-batch-size-multiple", 1], check=False)
    assert gen.returncode != 0
    assert f"checkpoint {bad} is truncated (5000 bytes" in gen.stdout, gen.stdout[-2000:]
    ana = run_cli([sys.executable, "-m", "fairseq_residual.analyze", data_bin, "--checkpoint", bad,
                   "--output-dir", tmp_path / "analysis"], check=False)
    assert ana.returncode == 2 and "is truncated (5000 bytes" in ana.stdout, ana.stdout[-2000:]
    # a save dir whose only checkpoint is cut short: resuming says so instead of a bare EOFError
    only = tmp_path / "only"
    only.mkdir()
    (only / "checkpoint_last.pt").write_bytes(b"")
    res = run_cli(["fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", only, "--max-update", 2,
                   *TRAIN], check=False)
    assert res.returncode != 0
    assert "checkpoint_last.pt is incomplete (0 bytes" in res.stdout and "holds no complete checkpoint" in res.stdout


# ---------------------------------------------------------------------------------------------
# resume candidates: only training checkpoints of this run
# ---------------------------------------------------------------------------------------------


def fairseq_style_average(paths, out):
    """What fairseq's ``scripts/average_checkpoints.py`` writes (``average_checkpoints``): the first input's
    whole state ("Copies over the settings from the first checkpoint": optimizer state, update count,
    data iterator) with the averaged ``model``; ``last_n_checkpoints`` lists the inputs newest first."""
    import torch

    states = [torch.load(p, map_location="cpu", weights_only=True) for p in paths]
    new_state = states[0]
    new_state["model"] = {k: sum(s["model"][k].double() for s in states).div(len(states)).to(v.dtype)
                          if v.is_floating_point() else v for k, v in states[0]["model"].items()}
    torch.save(new_state, out)


@pytest.fixture(scope="module")
def trained_save_dir(tiny_data_bin, tmp_path_factory):
    """A finished run of 4 updates: checkpoint_1_2.pt, checkpoint_1_4.pt and checkpoint_last.pt (update 4)."""
    _, data_bin = tiny_data_bin
    save = tmp_path_factory.mktemp("trained") / "ckpt"
    fairseq_main("fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save, "--max-update", 4, *TRAIN)
    return save


def _make_newest(path):
    """Give ``path`` a modification time after every other file of its directory."""
    newest = max(p.stat().st_mtime for p in path.parent.iterdir())
    os.utime(path, (newest + 10, newest + 10))


def _resume(data_bin, save, max_update=6):
    out = fairseq_main("fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save,
                       "--max-update", max_update, *TRAIN)
    loaded = re.search(r"Loaded checkpoint (\S+) \(epoch \d+ @ (\d+) updates\)", out)
    assert loaded, out[-3000:]
    return out, os.path.basename(loaded.group(1)), int(loaded.group(2))


@pytest.mark.parametrize(
    "averager, name, last_state",
    [
        ("plugin", "checkpoint_avg2.pt", "truncated"),  # the project's tool: no optimizer state
        ("fairseq", "checkpoint.avg2.pt", "truncated"),  # fairseq's script: keeps the newest input's optimizer
        ("plugin", "checkpoint_avg2.pt", "complete"),  # written after the run ended: newer than checkpoint_last
    ],
)
def test_averaged_checkpoint_in_save_dir_is_never_resumed_from(
    averager, name, last_state, trained_save_dir, tiny_data_bin, tmp_path
):
    import shutil

    _, data_bin = tiny_data_bin
    save = tmp_path / "ckpt"
    shutil.copytree(trained_save_dir, save)
    inputs = [save / "checkpoint_1_4.pt", save / "checkpoint_1_2.pt"]  # newest first, as fairseq lists them
    if averager == "plugin":  # scripts/average_checkpoints.py's averaging, in-process
        import torch

        from residual_studies.checkpoints import average_checkpoints

        torch.save(average_checkpoints([str(p) for p in inputs]), save / name)
    else:
        fairseq_style_average(inputs, save / name)
    _make_newest(save / name)
    if last_state == "truncated":
        (save / "checkpoint_last.pt").write_bytes((save / "checkpoint_last.pt").read_bytes()[:1000])

    out, loaded, updates = _resume(data_bin, save)
    assert updates == 4, out[-3000:]  # the newest training checkpoint's update count, not 0
    if last_state == "truncated":
        assert loaded == "checkpoint_1_4.pt"
        assert re.search(r"resuming from \S+checkpoint_1_4\.pt \(update 4\)", out), out[-3000:]
        assert "checkpoint_last.pt is incomplete" in out
    else:
        assert loaded == "checkpoint_last.pt" and "resuming from" not in out
    assert f"{name} is not a training checkpoint" in out  # said, not silently passed over
    assert re.search(r"num_updates 6\b", out), out[-2000:]


@pytest.fixture(scope="module")
def foreign_checkpoints(tiny_data_bin, tmp_path_factory):
    """Checkpoints of two other runs, each 6 updates (more than the run they are copied into):
    another residual scheme, and the same scheme with another FFN width."""
    _, data_bin = tiny_data_bin
    root = tmp_path_factory.mktemp("foreign")
    found = {}
    for kind, flags in (("scheme", ["--residual-scheme", "pre_ln"]), ("shape", ["--encoder-ffn-embed-dim", "32"])):
        save = root / kind
        fairseq_main("fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save, "--max-update", 6,
                     *TRAIN, *flags)
        found[kind] = save / "checkpoint_1_6.pt"
    return found


def test_checkpoint_of_another_run_is_skipped_with_a_warning(
    foreign_checkpoints, trained_save_dir, tiny_data_bin, tmp_path
):
    import shutil

    _, data_bin = tiny_data_bin
    save = tmp_path / "ckpt"
    shutil.copytree(trained_save_dir, save)
    shutil.copyfile(foreign_checkpoints["scheme"], save / "checkpoint_2_6.pt")
    shutil.copyfile(foreign_checkpoints["shape"], save / "checkpoint_2_8.pt")
    _make_newest(save / "checkpoint_2_6.pt")
    _make_newest(save / "checkpoint_2_8.pt")
    (save / "checkpoint_last.pt").write_bytes(b"")  # killed at the copy's first byte

    out, loaded, updates = _resume(data_bin, save, max_update=5)
    assert (loaded, updates) == ("checkpoint_1_4.pt", 4), out[-3000:]
    warnings = [line for line in out.splitlines() if "WARNING" in line]
    scheme = [w for w in warnings if "checkpoint_2_6.pt is not a training checkpoint of this run" in w]
    assert scheme and "residual scheme 'pre_ln'" in scheme[0] and "'post_ln'" in scheme[0], warnings
    shape = [w for w in warnings if "checkpoint_2_8.pt is not a training checkpoint of this run" in w]
    assert shape and "encoder.layers.0.fc1.weight" in shape[0] and "(32, 64)" in shape[0], warnings
    assert re.search(r"num_updates 5\b", out), out[-2000:]


def test_only_fairseq_training_names_are_resume_candidates():
    from fairseq_residual.checkpoint_safety import is_training_checkpoint_name as ok

    for name in ("checkpoint_last.pt", "checkpoint_best.pt", "checkpoint12.pt", "checkpoint_3_5000.pt",
                 "checkpoint.best_loss_4.1230.pt", "checkpoint.best_bleu_27.5101.pt"):
        assert ok(name), name
    for name in ("checkpoint_avg10.pt", "checkpoint.avg10.pt", "checkpoint_last10_avg.pt", "checkpoint_averaged.pt",
                 "checkpoint_best_avg.pt", "checkpoint_last.pt.tmp", "checkpoint_last-shard0.pt", "model.pt"):
        assert not ok(name), name
    assert ok("checkpoint_last-shard0.pt", "-shard0") and not ok("checkpoint_last.pt", "-shard0")


def test_an_unreadable_checkpoint_is_rejected_with_torchs_reason_in_one_line(tmp_path):
    """Resuming and the shell scripts name the same one-line reason: torch's exception and its first sentence,
    its advice to unpickle with weights_only=False (which does not apply) replaced."""
    from fairseq_residual.checkpoint_safety import inspect_checkpoint

    text = tmp_path / "checkpoint_last.pt"
    text.write_text("not a checkpoint\nsecond line\n")
    assert inspect_checkpoint(str(text)).problem == "it cannot be read (UnpicklingError: no file torch.save wrote)"
    empty = tmp_path / "checkpoint_1_2.pt"
    empty.write_bytes(b"")
    problem = inspect_checkpoint(str(empty)).problem
    assert problem.startswith("it cannot be read (") and "\n" not in problem and ". " not in problem, problem


def test_a_file_that_is_no_fairseq_checkpoint_is_named_so_when_loaded(tmp_path):
    """fairseq-generate's --path (fairseq's load_checkpoint_to_cpu): text (stock: KeyError 101), a bare state_dict
    (stock: KeyError 'best_loss' in its upgrade) and a zip archive torch did not write (stock: torch's
    "[enforce fail at inline_container.cc]") end on one line; a truncated checkpoint stays named as truncated."""
    import zipfile

    import torch
    from fairseq import checkpoint_utils

    from fairseq_residual.checkpoint_safety import NotACheckpointError, TruncatedCheckpointError

    (tmp_path / "text.pt").write_text("hello\n")
    torch.save({"encoder.embed_tokens.weight": torch.zeros(2, 2)}, tmp_path / "state_dict.pt")
    with zipfile.ZipFile(tmp_path / "other.pt", "w") as archive:
        archive.writestr("notes.txt", "not torch's")
    for name, why in (("text.pt", r"not a file torch.save wrote \(it begins with b'hell'\)"),
                      ("state_dict.pt", r"a PyTorch file but not a fairseq checkpoint \(no 'model' entry; it holds "
                                        r"encoder.embed_tokens.weight: a bare state_dict\?\)"),
                      ("other.pt", r"a zip archive that torch.save did not write \(no data.pkl in it\)")):
        path = str(tmp_path / name)
        with pytest.raises(NotACheckpointError, match=rf"^{re.escape(path)} is not a checkpoint: {why}; pass a "
                                                      rf"checkpoint fairseq-train wrote$"):
            checkpoint_utils.load_checkpoint_to_cpu(path)
    legacy = str(tmp_path / "legacy.pt")  # torch's format before 1.6: a pickle, complete, no 'model' either
    torch.save({"encoder.embed_tokens.weight": torch.zeros(2, 2)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(NotACheckpointError, match=r"a PyTorch file but not a fairseq checkpoint"):
        checkpoint_utils.load_checkpoint_to_cpu(legacy)
    (tmp_path / "cut.pt").write_bytes((tmp_path / "state_dict.pt").read_bytes()[:300])
    with pytest.raises(TruncatedCheckpointError):
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "cut.pt"))


def test_fit_check_compares_schemes_and_shapes_without_touching_the_model():
    import torch

    from conftest import build_model
    from fairseq_residual.checkpoint_safety import _misfit

    model, _, _ = build_model("residual_transformer_tiny", "--residual-scheme", "pre_ln")
    own = model.state_dict()
    assert _misfit(dict(own), model) is None
    renamed = {("old." + k if "fc1" in k else k): v for k, v in own.items()}  # names alone do not count
    assert _misfit(renamed, model) is None
    other = dict(own, **{"encoder.residual_scheme_id": torch.tensor(0)})
    assert _misfit(other, model) == ("scheme", "its encoder was trained with residual scheme 'post_ln', this run's "
                                     "uses residual scheme 'pre_ln'")
    words = dict(own, **{k: torch.zeros(7, v.shape[1]) for k, v in own.items() if k.endswith("embed_tokens.weight")})
    assert _misfit(words, model).kind == "dictionaries"
    assert _misfit(words, model).problem.startswith("its dictionaries are not this data's: encoder's embedding has 7 rows")
    deeper = dict(words, **{"encoder.layers.9.fc1.weight": own["encoder.layers.0.fc1.weight"]})  # another depth too
    assert _misfit(deeper, model).kind == "shapes"  # not the dictionaries alone
    assert _misfit(deeper, model).problem.startswith("another model: ")
    wider = dict(own, **{"decoder.layers.1.fc2.weight": torch.zeros(64, 32)})
    assert _misfit(wider, model).problem == ("another model: decoder.layers.1.fc2.weight has shape (64, 32), "
                                             "this run's (64, 64)")
    # a state without fairseq's version keys: fairseq's upgrade would drop the model's final LayerNorm
    assert _misfit({"w": torch.zeros(3, 3)}, model).problem.startswith("another model: tensor shapes differ")
    assert model.encoder.layer_norm is not None and model.decoder.layer_norm is not None


def test_resume_order_most_updates_then_last_then_directly_saved(tmp_path):
    import torch

    from fairseq_residual.checkpoint_safety import resume_candidates

    def save(name, updates, optimizer=True, age=0):
        state = {"model": {}, "optimizer_history": [{"num_updates": updates}]}
        if optimizer:
            state["last_optimizer_state"] = {"state": {}}
        torch.save(state, tmp_path / name)
        os.utime(tmp_path / name, (1e9 - age, 1e9 - age))

    save("checkpoint_1_4.pt", 4, age=30)
    save("checkpoint_best.pt", 4, age=0)  # newest, same updates: e.g. overwritten by an averaged model
    save("checkpoint_1_2.pt", 2, age=40)
    save("checkpoint_1_9.pt", 9, optimizer=False, age=0)  # no optimizer state: not a candidate
    save("checkpoint.avg3.pt", 9, age=0)  # fairseq's averaging keeps one input's optimizer state: by name
    ranked, rejected = resume_candidates(str(tmp_path))
    assert [os.path.basename(c.path) for c in ranked] == ["checkpoint_1_4.pt", "checkpoint_best.pt",
                                                          "checkpoint_1_2.pt"]
    assert [c.num_updates for c in ranked] == [4, 4, 2]
    assert sorted(os.path.basename(c.path) for c in rejected) == ["checkpoint.avg3.pt", "checkpoint_1_9.pt"]
    save("checkpoint_last.pt", 4, age=60)  # checkpoint_last.pt first among equal update counts
    assert os.path.basename(resume_candidates(str(tmp_path))[0][0].path) == "checkpoint_last.pt"


def test_a_resumed_run_removes_what_killed_saves_left(tmp_path, monkeypatch):
    """A kill during a save leaves a model-sized temporary file for good: the atomic copy's
    ``<dst>.<pid>.copying`` or fairseq's ``<checkpoint>.pt.tmp``; the next start removes those whose writer is
    gone (a live process's copy and every other file stay)."""
    import argparse

    from fairseq_residual import checkpoint_safety

    gone = 2 ** 22 + 1  # above Linux's largest pid_max: no such process
    names = [f"checkpoint_last.pt.{gone}.copying", "checkpoint7.pt.tmp", f"checkpoint_best.pt.{os.getpid()}.copying",
             "checkpoint_last.pt", "notes.tmp"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    monkeypatch.setattr(checkpoint_safety, "_stock_load_checkpoint", lambda cfg, trainer, **kw: "loaded")
    cfg = argparse.Namespace(save_dir=str(tmp_path), restore_file="other.pt")
    assert checkpoint_safety.load_checkpoint(cfg, argparse.Namespace(checkpoint_suffix="")) == "loaded"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])


def test_a_save_dir_of_another_scheme_is_refused_with_its_reason(foreign_checkpoints, tiny_data_bin, tmp_path,
                                                                   caplog):
    """Resuming with another --residual-scheme in a save dir that holds only the other scheme's checkpoints: the
    plugin names the mismatch before fairseq's load fails with its generic 'Cannot load model parameters', with
    the fix under either entry point, and without a warning per checkpoint first."""
    import logging
    import shutil

    _, data_bin = tiny_data_bin
    save = tmp_path / "ckpt"
    save.mkdir()
    for name in ("checkpoint_last.pt", "checkpoint_1_6.pt"):  # a pre_ln run's
        shutil.copyfile(foreign_checkpoints["scheme"], save / name)
    before = (save / "checkpoint_last.pt").read_bytes()
    with caplog.at_level(logging.INFO), pytest.raises(AssertionError) as raised:
        fairseq_main("fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save, "--max-update", 5, *TRAIN)
    message = str(raised.value).split("\n")[0]
    assert message.count("<-") == 0, message  # the plugin's error itself, not one fairseq wrapped
    assert "ForeignCheckpointError" in message
    assert "checkpoint_last.pt is not a checkpoint of this run's model" in message
    assert "residual scheme 'pre_ln', this run's uses residual scheme 'post_ln'" in message
    assert ("Resume with --residual-scheme pre_ln (model.residual_scheme=pre_ln), or point --save-dir "
            "(checkpoint.save_dir) elsewhere") in message
    assert not [r for r in caplog.records if "not a training checkpoint of this run" in r.getMessage()]
    assert (save / "checkpoint_last.pt").read_bytes() == before
    assert sorted(os.listdir(save)) == ["checkpoint_1_6.pt", "checkpoint_last.pt"]


def _refusal(data_bin, save, *flags):
    """The first line of the error fairseq-train ends on, resuming in ``save`` on ``data_bin`` with ``flags``."""
    with pytest.raises(AssertionError) as raised:
        fairseq_main("fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save, "--max-update", 5, *flags)
    return str(raised.value).split("\n")[0]


def test_a_save_dir_of_other_sizes_names_the_settings(foreign_checkpoints, tiny_data_bin, tmp_path):
    """Resuming with another size (here the FFN width) in a save dir of the other size: the refusal names the
    setting, the checkpoint's value and this run's, and resuming with it, not only the tensors' shapes."""
    import shutil

    _, data_bin = tiny_data_bin
    save = tmp_path / "ckpt"
    save.mkdir()
    shutil.copyfile(foreign_checkpoints["shape"], save / "checkpoint_last.pt")  # --encoder-ffn-embed-dim 32
    message = _refusal(data_bin, save, *TRAIN)
    # the preset's decoder FFN follows the encoder's: both differ
    assert re.search(r"checkpoint_last\.pt is not a checkpoint of this run's model: it was trained with "
                     r"decoder_ffn_embed_dim 32 \(this run: 64\), encoder_ffn_embed_dim 32 \(this run: 64\); .* "
                     r"Resume with --decoder-ffn-embed-dim 32 --encoder-ffn-embed-dim 32 as it was trained, or point "
                     r"--save-dir", message), message
    # under another preset (every width and depth differs): the preset it was trained with, then what was set beside
    bigger = [a if a != "residual_transformer_tiny" else "residual_transformer_iwslt_de_en" for a in TRAIN]
    message = _refusal(data_bin, save, *bigger)
    assert re.search(r"it was trained with --arch residual_transformer_tiny \(this run: residual_transformer_iwslt_de_en\), "
                     r"decoder_embed_dim 64 \(this run: 256\), .*; .* Resume with --arch residual_transformer_tiny "
                     r"--decoder-ffn-embed-dim 32 --encoder-ffn-embed-dim 32 as it was trained, or point --save-dir",
                     message), message


def test_a_save_dir_trained_on_other_dictionaries_names_the_data(trained_save_dir, tiny_data_bin, tmp_path):
    """Resuming on data binarized with other dictionaries: no model setting differs, so the refusal names the
    dictionaries and the data directory, not "the settings it was trained with"."""
    import shutil

    raw, data_bin = tiny_data_bin
    other = tmp_path / "bin"
    fairseq_main("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
                 "--validpref", raw / "valid", "--destdir", other, "--joined-dictionary", "--nwordssrc", 12,  # and 4 special symbols: 16 rows
                 "--workers", "1")
    save = tmp_path / "ckpt"
    shutil.copytree(trained_save_dir, save)
    message = _refusal(other, save, *TRAIN)
    assert re.search(r"checkpoint_last\.pt is not a checkpoint of this run's model: its dictionaries are not this "
                     r"data's: encoder's embedding has \d+ rows in the checkpoint, 16 with the dictionaries of this data "
                     r"directory; .* Resume with the data directory it was trained on \(fairseq-preprocess --destdir\)",
                     message), message


def test_the_settings_to_resume_with_are_typed_as_each_tool_takes_them(tmp_path, monkeypatch):
    """The refusal's "Resume with ..." lists the settings that shape tensors (dropout never keeps a checkpoint
    from loading), read with the safe loader, as the running tool takes them: switches as the flag alone or
    'without' it, an unset list as 'without'; under fairseq-hydra-train as model.key=value."""
    import argparse
    import types

    import torch

    from fairseq_residual import checkpoint_safety, user_errors

    saved = argparse.Namespace(encoder_layers=2, dropout=0.3, share_all_embeddings=True, encoder_layers_to_keep=None,
                               no_scale_embedding=False, decoder_layers=3)
    mine = argparse.Namespace(encoder_layers=4, dropout=0.1, share_all_embeddings=False, encoder_layers_to_keep="1",
                              no_scale_embedding=True, decoder_layers=3)
    path = tmp_path / "checkpoint_last.pt"
    torch.save({"cfg": {"model": saved}, "model": {}}, path)
    trainer = types.SimpleNamespace(cfg=types.SimpleNamespace(model=mine))
    differ = checkpoint_safety.settings_differ(str(path), trainer)
    assert differ == [("encoder_layers", 2, 4), ("encoder_layers_to_keep", None, "1"),
                      ("no_scale_embedding", False, True), ("share_all_embeddings", True, False)]
    assert checkpoint_safety.resume_settings(differ) == (
        "--encoder-layers 2 without --encoder-layers-to-keep without --no-scale-embedding --share-all-embeddings")
    monkeypatch.setattr(user_errors, "in_hydra_train", lambda: True)
    monkeypatch.setattr(checkpoint_safety, "in_hydra_train", lambda: True)
    assert checkpoint_safety.resume_settings(differ) == (
        "model.encoder_layers=2 model.encoder_layers_to_keep=null model.no_scale_embedding=false "
        "model.share_all_embeddings=true")
    (tmp_path / "unsafe.pt").write_bytes(b"not a checkpoint")
    assert checkpoint_safety.settings_differ(str(tmp_path / "unsafe.pt"), trainer) == []


def test_an_explicit_restore_file_of_another_scheme_ends_on_one_line(foreign_checkpoints, tiny_data_bin, tmp_path):
    """fairseq-train --restore-file <a checkpoint of another scheme> is fairseq's own load, which wraps the plugin's
    refusal in its bare 'Cannot load model parameters' Exception: the tool still ends on one line, the plugin's
    reason first and fairseq's after it, exit status 1; nothing is written to the save dir."""
    import subprocess

    _, data_bin = tiny_data_bin
    save = tmp_path / "ckpt"
    proc = subprocess.run(
        [str(a) for a in ("fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save, "--max-update", 5,
                          *TRAIN, "--restore-file", foreign_checkpoints["scheme"])],
        env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.rstrip("\n").split("\n")[-1]
    assert "fairseq-generate" not in last, last  # fairseq-train's fix alone
    assert re.fullmatch(r"fairseq-train: error: .*residual scheme 'pre_ln'.*'post_ln': resume with --residual-scheme "
                        r"pre_ln .* or from a --restore-file \(checkpoint.restore_file\) of a 'post_ln' model "
                        r"\(fairseq: Cannot load "
                        r"model parameters from checkpoint .*checkpoint_1_6\.pt; please ensure that the architectures "
                        r"match\.\) \(FAIRSEQ_RESIDUAL_FULL_ERROR=1 shows the traceback\)", last), last
    assert not list(save.glob("*.pt"))


def test_a_checkpoint_of_an_eval_bleu_run_loads_with_the_safe_loader_and_other_globals_stay_refused(tmp_path):
    """``--eval-bleu`` (the shipped IWSLT14 and WMT14 configs) logs the corpus-BLEU counts as numpy arrays
    (``fairseq/tasks/translation.py``, ``reduce_metrics``) and fairseq saves the metrics in every checkpoint;
    torch.load's default ``weights_only=True`` must read them back (resume, fairseq-generate), while a global
    outside the allow-list is still refused."""
    import datetime
    import pickle

    import numpy as np
    import torch
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
    from fairseq.logging import metrics

    from conftest import build_model

    model, args, task = build_model("residual_transformer_tiny", "--eval-bleu")
    record = dict(loss=10.0, nll_loss=9.0, ntokens=10, nsentences=2, sample_size=10, _bleu_sys_len=9,
                  _bleu_ref_len=10, **{f"_bleu_counts_{i}": 5 - i for i in range(4)},
                  **{f"_bleu_totals_{i}": 9 - i for i in range(4)})
    with metrics.aggregate("valid_eval_bleu_checkpoint", new_root=True) as agg:
        task.reduce_metrics([record], LabelSmoothedCrossEntropyCriterion(task, False, 0.1))
    saved = {name: meter for _, name, _, meter in agg.state_dict()}  # [(priority, name, class, state), ...]
    assert isinstance(saved["_bleu_counts"]["val"], np.ndarray)  # what the allow-list must cover
    path = tmp_path / "checkpoint_last.pt"
    torch.save({"args": args, "model": model.state_dict(), "extra_state": {"metrics": {"valid": agg.state_dict()}}},
               path)
    loaded = torch.load(path)  # weights_only=True: torch's default, as fairseq calls it
    meters = {name: meter for _, name, _, meter in loaded["extra_state"]["metrics"]["valid"]}
    np.testing.assert_array_equal(meters["_bleu_counts"]["val"], [5, 4, 3, 2])
    assert loaded["args"].eval_bleu is True

    torch.save({"extra_state": {"when": datetime.date(2026, 12, 5)}}, tmp_path / "other.pt")
    with pytest.raises(pickle.UnpicklingError, match="Unsupported global: GLOBAL datetime.date"):
        torch.load(tmp_path / "other.pt")


class _Forged:
    """Pickles as numpy pickles an array, ``_reconstruct(ndarray, (0,), b'b')`` then ``__setstate__(state)``, with
    whatever state the test gives."""

    def __init__(self, state):
        self.state = state

    def __reduce__(self):
        import numpy as np

        return np._core.multiarray._reconstruct, (np.ndarray, (0,), b"b"), self.state


class _DtypeWithFields:
    """A dtype pickled as a float64 whose state adds a field (a dtype numpy trusts when it rebuilds an array)."""

    def __reduce__(self):
        import numpy as np

        return np.dtype, ("f8", False, True), (3, "|", None, ("a",), {"a": (np.dtype("f8"), 0)}, 8, 1, 0)


class _CallNumericArray:
    def __reduce__(self):
        from fairseq_residual.checkpoint_compat import NumericArray

        return NumericArray, ((1,), "f8")


def _round_trip(obj, legacy_rename=None):
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"x": obj}, buf, _use_new_zipfile_serialization=legacy_rename is None)
    data = buf.getvalue()
    if legacy_rename:  # the legacy format is one pickle stream: rename a global as numpy 1.x wrote it
        data = data.replace(*legacy_rename)
    return torch.load(io.BytesIO(data))["x"]


@pytest.mark.parametrize("obj, refusal", [
    (_Forged((1, (1,), _DtypeWithFields(), False, b"AAAAAAAA")),
     r"a numpy array of dtype .*\('a', '<f8'\).* is not loaded: only arrays of bool, integer or float numbers"),
    (_Forged((1, (4,), "int64-placeholder", False, b"12345678")), r"comes with 8 bytes of data, not 32"),
    (_CallNumericArray(), r"NumericArray\(...\) is not called when loading a checkpoint"),
], ids=["dtype-with-fields", "short-data", "constructor"])
def test_the_safe_loader_rebuilds_numeric_arrays_only(obj, refusal):
    """numpy's own ``_reconstruct`` and ``ndarray`` are never allow-listed (a crafted dtype would turn raw bytes into
    object pointers): their checked stand-ins refuse a dtype with fields, data of the wrong size and a direct call,
    and load plain numeric arrays, also under numpy 1.x's module name; an array loaded and saved again pickles as a
    plain ndarray."""
    import pickle

    import numpy as np

    if isinstance(obj, _Forged) and obj.state[2] == "int64-placeholder":
        obj.state = (1, (4,), np.dtype("i8"), False, b"12345678")
    with pytest.raises(pickle.UnpicklingError, match=refusal):
        _round_trip(obj)
    loaded = _round_trip(np.array([[1.5, 2.5]], dtype=np.float32))
    np.testing.assert_array_equal(loaded, [[1.5, 2.5]])
    assert loaded.dtype == np.float32
    old = _round_trip(np.array([5, 4, 3, 2]), legacy_rename=(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    np.testing.assert_array_equal(old + np.array([1, 1, 1, 1]), [6, 5, 4, 3])
    assert b"NumericArray" not in pickle.dumps(loaded)

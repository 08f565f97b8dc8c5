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

    out = run_cli(["fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save,
                   "--max-update", 6, *TRAIN]).stdout
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
    run_cli(["fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save, "--max-update", 2, *TRAIN])
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

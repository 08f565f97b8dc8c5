"""scripts/train.sh: update_freq from the cluster shape, the commands of a grid (--dry-run) for the
local / torchrun / SLURM launchers, precision switches, and two real CPU runs through
fairseq-hydra-train: 2-process distributed training (torchrun, gloo) with the plugin as user dir,
and a run killed with SIGKILL that resumes from its last checkpoint."""
import json
import os
import re
import shlex
import signal
import subprocess
import time

import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser

from bench_helpers import SCRIPTS, TINY_TRANSLATION, run_script
from conftest import cli_env

pytestmark = pytest.mark.slow  # every test runs scripts/train.sh

TRAIN = SCRIPTS / "train.sh"


def load_checkpoint(path):
    import fairseq_residual  # noqa: F401  (allow-lists fairseq's checkpoint globals for weights_only)

    return torch.load(path, map_location="cpu")


def dry_run(*args, check=True):
    return run_script([TRAIN, "--data", "/data-bin", "--save-root", "/runs", "--dry-run", *args], check=check)


def commands(out):
    """The command lines printed by --dry-run (lines that are not comments or [train] messages)."""
    return [shlex.split(line) for line in out.splitlines()
            if line and not line.startswith(("#", "[train]", "sbatch "))]


def override(cmd, key):
    """The value of Hydra override ``key`` in ``cmd``, as Hydra reads it (a quoted value unquoted), else as
    written."""
    found = [a for a in cmd if a.startswith(key + "=")]
    assert len(found) <= 1, (key, found)
    if not found:
        return None
    written = found[0].split("=", 1)[1]
    return OverridesParser.create().parse_override(found[0]).value() if written.startswith("'") else written


@pytest.mark.parametrize(
    "bench, gpus, nodes, extra, update_freq",
    [
        ("iwslt14", 1, 1, [], 1),          # 4096 tokens per update, 1 GPU
        ("iwslt14", 2, 1, ["--max-tokens", "2048"], 1),
        ("wmt14", 1, 1, [], 16),           # 4096 x 16 = 65,536
        ("wmt14", 8, 1, [], 2),
        ("wmt14", 8, 2, [], 1),
        ("opus100", 4, 1, [], 4),
        ("opus100", 2, 2, ["--max-tokens", "8192"], 2),
    ],
)
def test_update_freq_keeps_the_papers_batch(bench, gpus, nodes, extra, update_freq):
    out = dry_run("--benchmark", bench, "--gpus-per-node", gpus, "--nodes", nodes,
                  "--launcher", "torchrun", "--master-addr", "node0", *extra).stdout
    assert f"update_freq = {update_freq}" in out
    (cmd,) = commands(out)
    assert override(cmd, "optimization.update_freq") == f"[{update_freq}]"
    max_tokens = int(override(cmd, "dataset.max_tokens"))
    world = int(override(cmd, "distributed_training.distributed_world_size"))
    assert world == gpus * nodes
    assert max_tokens * update_freq * world == {"iwslt14": 4096, "wmt14": 65536, "opus100": 65536}[bench]


@pytest.mark.parametrize(
    "bench, gpus, extra, hint",
    [
        ("iwslt14", 2, [], "--max-tokens 2048"),
        ("wmt14", 3, [], "3 does not divide 65536"),
        ("wmt14", 1, ["--max-tokens", "3000"], "update_freq would be"),
    ],
)
def test_batch_that_does_not_divide_is_refused(bench, gpus, extra, hint):
    proc = dry_run("--benchmark", bench, "--gpus-per-node", gpus, *extra, check=False)
    assert proc.returncode == 2
    assert "cannot be split" in proc.stdout and hint in proc.stdout
    forced = dry_run("--benchmark", bench, "--gpus-per-node", gpus, *extra, "--update-freq", "1")
    assert "WARNING" in forced.stdout and override(commands(forced.stdout)[0], "optimization.update_freq") == "[1]"


def test_dry_run_prints_the_whole_grid_torchrun(tmp_path):
    out = run_script([TRAIN, "--benchmark", "wmt14", "--data", tmp_path / "bin", "--save-root", tmp_path / "runs",
                      "--schemes", "post_ln,pre_ln,resi_dual", "--depths", "6,12", "--seeds", "1,2",
                      "--gpus-per-node", "4", "--nodes", "2", "--launcher", "torchrun",
                      "--master-addr", "node0:29400", "--dry-run"]).stdout
    cmds = commands(out)
    assert len(cmds) == 3 * 2 * 2
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing
    dirs = set()
    for cmd in cmds:
        assert cmd[:cmd.index("--rdzv_backend")] == ["torchrun", "--nnodes", "2", "--nproc_per_node", "4"]
        assert cmd[cmd.index("--rdzv_endpoint") + 1] == "node0:29400"
        assert cmd[cmd.index("--config-name") + 1] == "wmt14_en_de"
        assert cmd[cmd.index("--config-dir") + 1] == str(SCRIPTS.parent / "configs")
        scheme, layers, seed = (override(cmd, k) for k in
                                ("model.residual_scheme", "model.encoder_layers", "common.seed"))
        assert override(cmd, "model.decoder_layers") == layers
        save = override(cmd, "checkpoint.save_dir")
        assert save == str(tmp_path / "runs" / "wmt14" / f"{scheme}-{layers}L-seed{seed}")
        assert override(cmd, "hydra.run.dir") == save
        assert override(cmd, "common.tensorboard_logdir") == save + "/tensorboard"
        assert override(cmd, "task.data") == str(tmp_path / "bin")
        assert override(cmd, "common.user_dir") == str(SCRIPTS.parent / "fairseq_residual")
        assert override(cmd, "optimization.update_freq") == "[2]"  # 4096 x 2 x 8 = 65,536
        assert override(cmd, "distributed_training.distributed_world_size") == "8"
        assert override(cmd, "distributed_training.distributed_init_method") == "env://"
        assert override(cmd, "distributed_training.distributed_rank") == "${oc.env:RANK}"
        assert override(cmd, "distributed_training.device_id") == "${oc.env:LOCAL_RANK}"
        assert override(cmd, "common.amp") == "true"  # the paper's WMT precision
        dirs.add(save)
    assert len(dirs) == 12


def test_a_two_node_dry_run_without_master_addr_says_what_its_placeholder_needs():
    out = dry_run("--benchmark", "wmt14", "--launcher", "torchrun", "--nodes", "2", "--gpus-per-node", "4").stdout
    assert '--rdzv_endpoint "$MASTER_ADDR:29500"' in out
    assert "no --master-addr: the commands below read $MASTER_ADDR, which must name the first node" in out


def test_dry_run_slurm_prints_sbatch_scripts(tmp_path):
    data = tmp_path / "bin"
    data.mkdir()
    (data / "langs.txt").write_text("en,de,nl\n")
    (data / "lang_pairs.txt").write_text("en-de,de-en,en-nl,nl-en\n")
    out = run_script([TRAIN, "--benchmark", "opus100", "--data", data, "--save-root", tmp_path / "runs",
                      "--schemes", "pre_ln,resi_dual", "--gpus-per-node", "8", "--nodes", "2",
                      "--launcher", "slurm", "--slurm-opts", "--partition=gpu --time=72:00:00",
                      "--dry-run"]).stdout
    scripts = re.findall(r"# --- (\S+) ---\n(.*?)\n# ---\n", out, re.S)
    assert [os.path.basename(os.path.dirname(p)) for p, _ in scripts] == ["pre_ln-18L-seed1", "resi_dual-18L-seed1"]
    for path, body in scripts:
        assert f"sbatch {path}" in out and not os.path.exists(path)
        for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                     "#SBATCH --partition=gpu", "#SBATCH --time=72:00:00", "#SBATCH --open-mode=append"):
            assert line in body.splitlines()
        srun = [l for l in body.splitlines() if l.startswith("srun ")][0]
        assert "distributed_training.distributed_port=$PORT" in srun
        assert "distributed_training.distributed_world_size=16" in srun
        assert "'task.langs=[en,de,nl]'" in srun and "'task.lang_pairs=[en-de,de-en,en-nl,nl-en]'" in srun
        assert "'optimization.update_freq=[1]'" in srun  # 4096 x 1 x 16 = 65,536
        assert "common.fp16=true" in srun  # the paper's OPUS precision


def test_precision_switches():
    def cmd(*args):
        return commands(dry_run("--benchmark", "wmt14", *args).stdout)[0]

    c = cmd("--scheme", "resi_dual", "--precision", "fp16")
    assert override(c, "common.fp16") == "true" and override(c, "common.amp") == "false"
    assert override(c, "model.resi_dual_scale") == "0.05"  # x_d inside the fp16 range
    c = cmd("--scheme", "resi_dual", "--precision", "fp16", "--extra", "model.resi_dual_scale=0.2")
    assert override(c, "model.resi_dual_scale") == "0.2"
    c = cmd("--scheme", "post_ln", "--precision", "fp16")
    assert override(c, "model.resi_dual_scale") is None and override(c, "common.fp16_no_flatten_grads") is None
    c = cmd("--scheme", "resi_dual", "--precision", "bf16")
    assert override(c, "common.bf16") == "true" and override(c, "common.fp16") == "false"
    assert override(c, "model.resi_dual_scale") is None  # bf16 has fp32's range: c stays 1.0
    c = cmd("--scheme", "resi_dual", "--precision", "fp32")
    assert {override(c, f"common.{k}") for k in ("fp16", "bf16", "amp", "memory_efficient_fp16")} == {"false"}
    # per-parameter optimizer settings (the registry's optim_overrides, read by train.sh without importing
    # the plugin) need fairseq's per-parameter fp32 master copy: set for those schemes only, and not over --extra
    from fairseq_residual.schemes import SCHEMES
    from residual_studies.shell import optim_override_schemes

    listed = optim_override_schemes().split()
    assert listed == [s.name for s in SCHEMES if s.optim_overrides] and "hyper_connections" in listed
    c = cmd("--scheme", listed[0], "--precision", "fp16")
    assert override(c, "common.fp16_no_flatten_grads") == "true"
    c = cmd("--scheme", listed[0], "--precision", "fp16", "--extra", "common.memory_efficient_fp16=true")
    assert override(c, "common.fp16_no_flatten_grads") is None
    proc = dry_run("--benchmark", "wmt14", "--cpu", "--precision", "fp16", check=False)
    assert proc.returncode == 2 and "needs CUDA" in proc.stdout
    proc = dry_run("--benchmark", "wmt14", "--scheme", "preln", check=False)
    assert proc.returncode == 2 and "unknown scheme 'preln'" in proc.stdout


def _tiny_run_args(data_bin, save_root, *extra):
    return [TRAIN, "--benchmark", "iwslt14", "--data", data_bin, "--save-root", save_root,
            "--layers", "2", "--seed", "3", "--cpu",
            "--extra", " ".join(TINY_TRANSLATION + ["task.source_lang=src", "task.target_lang=tgt", *extra])]


def test_two_process_training_on_cpu(tiny_data_bin, tmp_path):
    """torchrun, 2 processes, gloo: both workers import the plugin (--user-dir) and train."""
    _, data_bin = tiny_data_bin
    out = run_script([*_tiny_run_args(data_bin, tmp_path, "optimization.max_update=3"),
                      "--launcher", "torchrun", "--gpus-per-node", "2", "--max-tokens", "2048"],
                     timeout=300).stdout
    run_dir = tmp_path / "iwslt14" / "resi_dual-2L-seed3"
    for rank in (0, 1):
        assert f"distributed init (rank {rank}): env://" in out
        assert re.search(rf"initialized host \S+ as rank {rank}", out)
    assert "training on 2 devices" in out
    # each rank reads its half of the 240 training sentences; the logged stats are gathered from
    # both: (mean sentences per update) x (updates in epoch 1) covers the whole training set
    m = re.search(r"\[train\]\[INFO\] - epoch 001 \|.*\| bsz ([\d.]+) \| num_updates (\d+)", out)
    assert m and round(float(m.group(1)) * int(m.group(2))) == 240
    assert "done training" in out
    state = load_checkpoint(run_dir / "checkpoint_last.pt")
    assert state["cfg"]["distributed_training"]["distributed_world_size"] == 2
    assert state["cfg"]["common"]["user_dir"].endswith("fairseq_residual")
    assert state["optimizer_history"][-1]["num_updates"] == 3
    assert (run_dir / "command.sh").read_text().count("torchrun --nnodes 1 --nproc_per_node 2") == 1
    assert any((run_dir / "tensorboard").rglob("events.out.tfevents.*"))


def test_killed_run_resumes_from_last_checkpoint(tiny_data_bin, tmp_path):
    """SIGKILL the whole run after its first checkpoint; the same command resumes it to the end."""
    _, data_bin = tiny_data_bin
    args = [*_tiny_run_args(data_bin, tmp_path, "optimization.max_update=24",
                            "checkpoint.save_interval_updates=4", "checkpoint.no_epoch_checkpoints=true"),
            "--max-tokens", "256", "--update-freq", "1"]
    run_dir = tmp_path / "iwslt14" / "resi_dual-2L-seed3"
    first_log = tmp_path / "first.log"
    with open(first_log, "w") as log:
        proc = subprocess.Popen(["bash", *map(str, args)], env=cli_env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.time() + 240
            while "Saved checkpoint" not in first_log.read_text():
                assert proc.poll() is None, first_log.read_text()[-4000:]
                assert time.time() < deadline, "no checkpoint within 240 s"
                time.sleep(0.1)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # train.sh, fairseq-hydra-train and its workers
            proc.wait()
    first = first_log.read_text()
    assert "done training" not in first
    assert (run_dir / "checkpoint_last.pt").exists()

    out = run_script(args, timeout=300).stdout
    assert "resuming from" in out
    m = re.search(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ (\d+) updates\)", out)
    assert m and int(m.group(1)) >= 4
    assert "done training" in out
    assert re.search(r"num_updates 24\b", out)
    state = load_checkpoint(run_dir / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["num_updates"] == 24
    log = (run_dir / "train.log").read_text()  # both runs, appended
    assert "Loaded checkpoint" in log and "No existing checkpoint found" in log
    # the same folder with another warm-up would resume this run with other settings: refused, nothing touched
    proc = run_script([*args, "--extra", "lr_scheduler.warmup_updates=1"], check=False, timeout=300)
    assert proc.returncode != 0
    assert ("holds a run started with other training settings (lr_scheduler.warmup_updates: 5 -> 1)"
            in proc.stdout), proc.stdout[-3000:]
    assert load_checkpoint(run_dir / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"] == 24


def test_a_runs_training_settings_are_recorded_and_other_ones_refused(tmp_path):
    """run_settings.json holds the overrides that define the training (the last of a key wins) and the tokens per
    update, not the launch's; a folder with a checkpoint refuses other settings, a folder without one takes them."""
    from residual_studies.shell import check_run_settings, run_settings

    launch = ["fairseq-hydra-train", "--config-dir", "configs", "common.seed=1", "model.residual_scheme=pre_ln",
              "dataset.max_tokens=4096", "optimization.update_freq=[2]",
              "distributed_training.distributed_world_size=8", "checkpoint.save_dir='/runs/x'",
              "optimization.max_update=100", "optimization.lr=[0.001]"]
    assert run_settings(launch) == {"common.seed": "1", "model.residual_scheme": "pre_ln",
                                    "optimization.lr": "[0.001]", "tokens per update": "65536"}
    # 4 GPUs x update_freq 4 is the same batch; a longer run, other paths, another loss-scaler start: the same run
    same = [o.replace("[2]", "[4]").replace("=8", "=4").replace("=100", "=200").replace("/runs/x", "/b")
            for o in launch]
    assert run_settings(same + ["common.fp16_init_scale=8"]) == run_settings(launch)  # the scaler's start: restored
    assert check_run_settings(str(tmp_path), launch) is None
    (tmp_path / "checkpoint_last.pt").write_bytes(b"x")
    assert check_run_settings(str(tmp_path), same) is None
    why = check_run_settings(str(tmp_path), launch + ["+model.resi_dual_scale=0.05", "optimization.lr=[0.002]"])
    assert why == (f"{tmp_path} holds a run started with other training settings (model.resi_dual_scale: (not set) "
                   f"-> 0.05; optimization.lr: [0.001] -> [0.002]): starting would resume that run with these. "
                   f"Resume it with its own settings, or train these in a folder of their own (another --save-root)")
    (tmp_path / "checkpoint_last.pt").unlink()  # nothing to resume: the folder takes the new settings
    assert check_run_settings(str(tmp_path), launch + ["optimization.lr=[0.002]"]) is None
    assert json.loads((tmp_path / "run_settings.json").read_text())["optimization.lr"] == "[0.002]"


def test_truncated_checkpoint_last_falls_back_to_newest_complete_one(tmp_path):
    """fairseq copies checkpoint_last.pt non-atomically: a run killed during the copy resumes from
    the newest complete checkpoint instead of crashing on the truncated file."""
    run_dir = tmp_path / "runs" / "iwslt14" / "resi_dual-6L-seed1"
    run_dir.mkdir(parents=True)
    torch.save({"model": {}}, run_dir / "checkpoint_1_8.pt")
    time.sleep(0.05)
    torch.save({"model": {}}, run_dir / "checkpoint_1_12.pt")
    good = (run_dir / "checkpoint_1_12.pt").read_bytes()
    args = ["--benchmark", "iwslt14", "--data", tmp_path, "--save-root", tmp_path / "runs"]

    (run_dir / "checkpoint_last.pt").write_bytes(good)  # complete: fairseq's default restore
    out = run_script([TRAIN, *args, "--dry-run"]).stdout
    assert override(commands(out)[0], "checkpoint.restore_file") is None

    (run_dir / "checkpoint_last.pt").write_bytes(good[: len(good) // 2])  # killed mid-copy
    out = run_script([TRAIN, *args, "--dry-run"]).stdout
    assert override(commands(out)[0], "checkpoint.restore_file") == str(run_dir / "checkpoint_1_12.pt")
    assert "is incomplete" in out

    for f in run_dir.glob("checkpoint_1_*.pt"):
        f.unlink()
    proc = run_script([TRAIN, *args, "--dry-run"], check=False)
    assert proc.returncode == 2 and "move it away" in proc.stdout


HYDRA_SYNTAX = ("'", ",", "(", "=")


@pytest.mark.parametrize("char", HYDRA_SYNTAX)
def test_paths_with_hydra_syntax_reach_hydra_whole(char, tmp_path):
    """A quote, comma, parenthesis or '=' in --data or --save-root: every path override parses, with Hydra's
    own parser, to the path itself."""
    data, root = tmp_path / f"da{char}ta", tmp_path / f"ru{char}ns"
    data.mkdir()
    (cmd,) = commands(run_script([TRAIN, "--benchmark", "iwslt14", "--data", data, "--save-root", root,
                                  "--dry-run"]).stdout)
    overrides = cmd[cmd.index("--config-name") + 2:]
    parsed = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(overrides)}
    run_dir = str(root / "iwslt14" / "resi_dual-6L-seed1")
    assert parsed["task.data"] == str(data)
    assert parsed["checkpoint.save_dir"] == parsed["hydra.run.dir"] == run_dir
    assert parsed["common.tensorboard_logdir"] == run_dir + "/tensorboard"


def test_a_run_in_a_folder_named_with_hydra_syntax_trains(tiny_data_bin, tmp_path):
    _, data_bin = tiny_data_bin
    root = tmp_path / "a'b,c(d=e"
    run_script(_tiny_run_args(data_bin, root, "optimization.max_update=2"), timeout=300)
    state = load_checkpoint(root / "iwslt14" / "resi_dual-2L-seed3" / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["num_updates"] == 2
    assert state["cfg"]["checkpoint"]["save_dir"] == str(root / "iwslt14" / "resi_dual-2L-seed3")


@pytest.mark.parametrize("data, message", [
    ("/tmp/a$b", "backslash or '$'"), ("/tmp/a\\b", "backslash or '$'"), ("/tmp/a:b", "data shards"),
])
def test_paths_hydra_or_fairseq_cannot_take_are_refused_before_anything_is_made(data, message, tmp_path):
    proc = run_script([TRAIN, "--benchmark", "iwslt14", "--data", data, "--save-root", tmp_path / "runs"], check=False)
    assert proc.returncode == 2 and message in proc.stdout and data in proc.stdout
    assert not (tmp_path / "runs").exists()



def test_a_data_folder_without_the_benchmarks_files_is_refused_before_anything_is_made(tmp_path):
    """train.sh (the training split) and evaluate.sh (the evaluated one) name the files fairseq-preprocess writes
    that --data lacks, what it holds, and the prepare script whose output it should be."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "dict.en.txt").write_text("")
    proc = run_script([TRAIN, "--benchmark", "wmt14", "--data", data, "--save-root", tmp_path / "runs"], check=False)
    assert proc.returncode == 2 and not (tmp_path / "runs").exists()
    assert (f"--data {data} has no dict.de.txt train.en-de.en.idx train.en-de.de.idx (it holds: dict.en.txt): give "
            "the folder fairseq-preprocess wrote for en->de (its --destdir; scripts/prepare-wmt14-en-de.sh writes one)"
            in proc.stdout)
    (tmp_path / "run").mkdir()
    proc = run_script([SCRIPTS / "evaluate.sh", "--benchmark", "iwslt14", "--data", data, "--run-dir",
                       tmp_path / "run", "--subset", "valid"], check=False)
    assert proc.returncode == 2
    assert f"has no dict.de.txt valid.de-en.de.idx valid.de-en.en.idx (it holds: dict.en.txt)" in proc.stdout
    assert "scripts/prepare-iwslt14.sh" in proc.stdout

"""``scripts/train.sh --launcher slurm`` under a real SLURM (``slurm_cluster.py``: munged, slurmctld and one
slurmd with 2 CPUs on loopback): a 2-task CPU training (gloo) submitted with sbatch, both ranks in one job,
a checkpoint that fairseq-generate translates with, and a second submission that resumes it."""
import re

import pytest
import torch

from bench_helpers import SCRIPTS, TINY_TRANSLATION, run_script
from conftest import USER_DIR, run_cli
from slurm_cluster import slurm_cluster  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.slow

TRAIN = SCRIPTS / "train.sh"


def submit(cluster, data_bin, save_root, max_update):
    extra = TINY_TRANSLATION + ["task.source_lang=src", "task.target_lang=tgt",
                                f"optimization.max_update={max_update}"]
    out = run_script([TRAIN, "--benchmark", "iwslt14", "--data", data_bin, "--save-root", save_root,
                      "--layers", "2", "--seed", "3", "--cpu", "--launcher", "slurm", "--gpus-per-node", "2",
                      "--max-tokens", "2048", "--extra", " ".join(extra)], timeout=120).stdout
    assert re.search(r"Submitted batch job \d+", out), out
    cluster.wait_for_jobs(timeout=150)
    return out


def test_two_task_training_through_sbatch_and_resume(slurm_cluster, tiny_data_bin, tmp_path,  # noqa: F811
                                                     monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))  # for train.sh's sbatch
    _, data_bin = tiny_data_bin
    run_dir = tmp_path / "iwslt14" / "resi_dual-2L-seed3"
    submit(slurm_cluster, data_bin, tmp_path, max_update=3)
    logs = sorted(run_dir.glob("slurm-*.out"))
    assert len(logs) == 1, slurm_cluster.logs()
    out = logs[0].read_text()
    for rank in (0, 1):  # both tasks of the one job joined the same process group
        assert re.search(rf"initialized host \S+ as rank {rank}", out), out[-4000:]
    assert "training on 2 devices" in out
    # statistics gathered from both ranks into rank 0's log: sentences per update x updates = all 240
    m = re.search(r"\[train\]\[INFO\] - epoch 001 \|.*\| bsz ([\d.]+) \| num_updates (\d+)", out)
    assert m and round(float(m.group(1)) * int(m.group(2))) == 240
    assert "done training" in out
    import fairseq_residual  # noqa: F401  (allow-lists fairseq's checkpoint globals)

    state = torch.load(run_dir / "checkpoint_last.pt", map_location="cpu")
    assert state["cfg"]["distributed_training"]["distributed_world_size"] == 2
    assert state["optimizer_history"][-1]["num_updates"] == 3

    gen = run_cli(["fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", run_dir / "checkpoint_last.pt",
                   "--beam", 2, "--required-batch-size-multiple", 1, "--source-lang", "src", "--target-lang", "tgt"])
    assert gen.stdout.count("\nH-") == 24 and "Generate test with beam=2" in gen.stdout

    submit(slurm_cluster, data_bin, tmp_path, max_update=5)  # the same grid again: resumes
    logs = sorted(run_dir.glob("slurm-*.out"))
    assert len(logs) == 2
    second = logs[1].read_text()
    assert re.search(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ 3 updates\)", second), second[-4000:]
    assert "done training" in second
    state = torch.load(run_dir / "checkpoint_last.pt", map_location="cpu")
    assert state["optimizer_history"][-1]["num_updates"] == 5

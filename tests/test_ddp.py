"""Distributed data parallel equals one process, for every registered scheme (read from the registry).

One ``torchrun --nproc_per_node 2`` of ``scripts/ddp_check.py --pairwise`` (gloo, CPU) trains every scheme
in-process through fairseq's own ``Trainer`` and ``DistributedFairseqModel``, each scheme with one DDP
configuration (scheme i with configuration i mod 6: ``legacy_ddp``, ``no_c10d``, ``c10d``, ``--update-freq 2``
under ``c10d`` and ``legacy_ddp``, ``c10d`` with dropout), so that every scheme and every configuration runs:
the configuration is fairseq's code and does not depend on the scheme. 3 updates of SGD (see the script's
docstring for why not Adam); the tests here judge what it measured:

* the two ranks end with the same state dict, element for element (every parameter and buffer: Admin's
  profile and omegas, DLCL's layer weights, ReZero's alphas, ...), dropout or not: DDP's contract, exact by
  construction (both ranks apply the same all-reduced gradient with the same code);
* without dropout, rank 0's state dict equals one process trained with ``--update-freq 2 x (the run's)`` on
  the same batches in the same order, to :func:`fp32_tolerance`. Not exactly: one process sums the batches'
  gradients as ``((g0 + g1) + g2) + g3`` where the ranks' all-reduce computes ``(g0 + g2) + (g1 + g3)``, and
  the global factors (1 / sample size, the clipping coefficient, a reduction over every parameter) are
  computed over other memory layouts, whose rounding may differ in the last bit from CPU to CPU. A scheme
  computing something else under DDP than in one process (a statistic taken per forward, a profile taken on
  another batch) changes the gradient itself and the weights by about the update, which the test requires to
  be at least 100 times the tolerance. Dropout draws other masks in two processes than in one: with dropout
  only the ranks are compared.

``c10d``: stock fairseq passes ``device_ids=[device_id]`` to torch's ``DistributedDataParallel``, which torch
refuses for a CPU module; the worker builds it without ``device_ids`` / ``output_device`` (torch's semantics,
fairseq's other arguments), so ``--ddp-backend c10d`` itself is exercised on CUDA only (``scripts/gpu_check.sh``).

And one real ``fairseq-train`` with two processes (torchrun, gloo, ``legacy_ddp``) for a protocol scheme equals
``fairseq-train --update-freq 2`` in one process, to the same tolerance: the command line end to end,
fairseq's data sharding included.
"""
import json

import numpy as np
import pytest
import torch

from conftest import REPO, USER_DIR, run_cli
from inprocess import fairseq_main
from fairseq_residual.schemes import SCHEME_NAMES

pytestmark = pytest.mark.slow  # torchrun and fairseq-train processes

#: SGD's gradients are clipped to this norm (ddp_check.py's and TRAIN's --clip-norm), so |g_i| <= CLIP
CLIP = 1.0


def fp32_tolerance(updates, lr, largest_value):
    """The largest weight difference fp32 rounding can make between two runs that apply the same SGD updates
    to the same weights with the gradients summed in another order: per update, 4 units in the last place of
    the largest weight or buffer (the rounding of ``w - lr * (g + wd * w)`` and of its inputs) plus ``lr`` times
    16 units in the last place of a clipped gradient coordinate (|g_i| <= :data:`CLIP`: the sum of at most 4
    per-batch gradients in another order, 3 roundings, and the global factors' last bit)."""
    ulp = float(np.spacing(np.float32(largest_value)))
    return updates * (4 * ulp + lr * 16 * float(np.spacing(np.float32(CLIP))))


@pytest.fixture(scope="module")
def ddp_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp") / "ddp.json"
    run_cli(["torchrun", "--nnodes", "1", "--nproc_per_node", "2", "--standalone",
             REPO / "scripts" / "ddp_check.py", "--pairwise", "--out", out], timeout=900)
    return json.loads(out.read_text())


def test_every_scheme_and_every_configuration_ran(ddp_report):
    assert ddp_report["world_size"] == 2 and ddp_report["complete"]
    assert set(ddp_report["results"]) == set(SCHEME_NAMES)
    ran = {config for configs in ddp_report["results"].values() for config in configs}
    assert ran == set(ddp_report["configs"])
    for scheme, configs in ddp_report["results"].items():
        assert len(configs) == 1, scheme
        for config, entry in configs.items():
            assert entry["error"] is None, f"{scheme} {config}:\n{entry['error']}"


def test_the_configurations_cover_fairseqs_ddp_backends(ddp_report):
    configs = ddp_report["configs"]
    assert {c["ddp_backend"] for c in configs.values()} == {"c10d", "legacy_ddp", "no_c10d"}
    assert {c["ddp_backend"] for c in configs.values() if c["update_freq"] == 2} == {"c10d", "legacy_ddp"}
    assert any(c["dropout"] > 0 for c in configs.values())


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_ranks_equal_and_ddp_equals_one_process(ddp_report, scheme):
    configs = ddp_report["configs"]
    for config, entry in ddp_report["results"][scheme].items():
        assert entry["error"] is None, f"{config}:\n{entry['error']}"
        assert entry["ranks_equal"], f"{config}: the ranks differ by {entry['ranks_max_abs_diff']}"
        tol = fp32_tolerance(ddp_report["updates"], ddp_report["lr"], entry["largest_value"])
        assert entry["largest_update"] > 100 * tol, f"{config}: training hardly moved the weights"
        if configs[config]["dropout"] > 0:
            assert "vs_one_process_max_abs_diff" not in entry
            continue
        diff = entry["vs_one_process_max_abs_diff"]
        assert diff <= tol, (f"{config}: DDP differs from one process with --update-freq "
                             f"{2 * configs[config]['update_freq']} by {diff} (fp32 rounding allows {tol:.2e})")


LR = 0.1
TRAIN = ["--arch", "residual_transformer_tiny", "--residual-scheme", "dlcl", "--task", "translation",
         "--optimizer", "sgd", "--lr", str(LR), "--clip-norm", str(CLIP), "--criterion", "label_smoothed_cross_entropy",
         "--label-smoothing", "0.1", "--dropout", "0", "--max-tokens", "200", "--max-update", "3", "--cpu",
         "--seed", "1", "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0",
         "--log-format", "simple", "--user-dir", USER_DIR]


def test_fairseq_train_with_two_processes_equals_one_process(tiny_data_bin, tmp_path):
    """fairseq-train --distributed-world-size 2 (two processes, gloo) against --update-freq 2 (one): fairseq's
    sharded iterator gives rank r the batches r, r + 2, ..., exactly the pairs one process groups into an
    update. On CPU fairseq-train under torchrun needs its rank and init method on the command line (it
    otherwise divides by the CUDA device count)."""
    _, data_bin = tiny_data_bin
    run_cli(["torchrun", "--nnodes", "1", "--nproc_per_node", "2", "--standalone", "--no-python",
             "sh", "-c", 'exec fairseq-train "$@" --distributed-rank "$RANK"', "sh", data_bin, *TRAIN,
             "--save-dir", tmp_path / "ddp", "--distributed-world-size", "2", "--distributed-init-method", "env://",
             "--distributed-no-spawn", "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp"])
    fairseq_main("fairseq-train", data_bin, *TRAIN, "--save-dir", tmp_path / "one", "--update-freq", "2")
    two = torch.load(tmp_path / "ddp" / "checkpoint_last.pt", weights_only=False)
    one = torch.load(tmp_path / "one" / "checkpoint_last.pt", weights_only=False)
    assert two["optimizer_history"][-1]["num_updates"] == one["optimizer_history"][-1]["num_updates"] == 3
    assert two["model"].keys() == one["model"].keys()
    largest = max(float(v.abs().max()) for v in one["model"].values() if v.is_floating_point())
    tol = fp32_tolerance(3, LR, largest)
    for name, value in one["model"].items():
        diff = float((two["model"][name].double() - value.double()).abs().max())
        assert diff <= tol, f"{name}: two processes differ from one by {diff} (fp32 rounding allows {tol:.2e})"

"""Gloo process groups end before the interpreter shuts down (fairseq_residual/process_group.py), so that a
finished torchrun run exits 0 instead of aborting in gloo's teardown. The abort itself is a race, so no test can
wait for it; these check the mechanism: which groups the hook destroys, and that importing the plugin ends the
threads of fairseq's own training group when the interpreter exits."""
import os
import re
import sys
import textwrap

import pytest
import torch.distributed as dist

from conftest import REPO, run_cli
from fairseq_residual.process_group import destroy_gloo_group, gloo_only


@pytest.fixture
def clean_default_group():
    assert not dist.is_initialized()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["gloo", "cpu:gloo", None])  # None: torch's default, cpu:gloo without CUDA
def test_a_gloo_group_is_destroyed(tmp_path, clean_default_group, backend):
    dist.init_process_group(backend, init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    assert destroy_gloo_group() is True
    assert not dist.is_initialized()


@pytest.mark.parametrize("config, gloo", [
    ("cpu:gloo", True), ("cpu:gloo,cuda:gloo", True), ("gloo", True), ("CPU:GLOO", True),
    ("cpu:gloo,cuda:nccl", False), ("cuda:nccl", False), ("nccl", False), ("", False), ("fake", False),
])
def test_gloo_only_reads_the_backend_config(config, gloo):
    assert gloo_only(config) is gloo


def test_without_a_group_it_does_nothing(clean_default_group):
    assert destroy_gloo_group() is False


def test_a_group_of_another_backend_is_left_alone(clean_default_group):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    assert destroy_gloo_group() is False
    assert dist.is_initialized() and dist.get_backend() == "fake"


EXIT_PROBE = textwrap.dedent(
    """
    # The exit check is registered before the plugin's hook, so atexit (last in, first out) runs it after: it
    # sees what the hook left. fairseq trains on its own cached group (get_global_group), not the default one.
    import atexit, os, sys, torch, torch.distributed as dist
    from fairseq.distributed import utils
    threads = lambda: len(os.listdir("/proc/self/task"))
    atexit.register(lambda: print("initialized at exit:", dist.is_initialized(),
                                  "| threads left:", threads() - before, flush=True))
    if sys.argv[2] == "plugin":
        import fairseq_residual  # noqa: F401
    before = threads()  # after every import: only the process groups' threads count
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    group = utils.get_global_group()
    dist.all_reduce(torch.ones(3), group=group)
    dist.barrier(group=group)
    del group
    """
)


@pytest.mark.slow  # one python process per case
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc/self/task (Linux)")
@pytest.mark.parametrize("imports", ["plugin", "torch only"])
def test_importing_the_plugin_ends_the_training_groups_threads_at_exit(tmp_path, imports):
    probe = tmp_path / "probe.py"
    probe.write_text(EXIT_PROBE)
    proc = run_cli([sys.executable, probe, tmp_path / "rendezvous", imports], cwd=REPO)
    found = re.search(r"initialized at exit: (\w+) \| threads left: (-?\d+)", proc.stdout)
    assert found, proc.stdout[-2000:]
    if imports == "plugin":
        assert found.groups() == ("False", "0")
    else:  # the negative control: without the hook both groups and their gloo threads outlive atexit
        assert found.group(1) == "True" and int(found.group(2)) > 0

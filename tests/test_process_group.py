"""A gloo process group is destroyed before the interpreter shuts down (fairseq_residual/process_group.py), so
that a finished torchrun run exits 0 instead of aborting in gloo's teardown. The abort itself is a race (about
1 run in 6 on a 2-core CPU), so no test can wait for it; these check the mechanism: which groups the hook
destroys, and that importing the plugin arms it for the interpreter's exit."""
import sys
import textwrap

import pytest
import torch.distributed as dist

from conftest import REPO, run_cli
from fairseq_residual.process_group import destroy_gloo_group


@pytest.fixture
def clean_default_group():
    assert not dist.is_initialized()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_gloo_group_is_destroyed(tmp_path, clean_default_group):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    assert destroy_gloo_group() is True
    assert not dist.is_initialized()


def test_without_a_group_it_does_nothing(clean_default_group):
    assert destroy_gloo_group() is False


def test_a_group_of_another_backend_is_left_alone(clean_default_group):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    assert destroy_gloo_group() is False
    assert dist.is_initialized() and dist.get_backend() == "fake"


EXIT_PROBE = textwrap.dedent(
    """
    # registered before the plugin's hook, so atexit (last in, first out) runs it after: it sees what the
    # hook left of the group when the interpreter exits
    import atexit, sys, torch.distributed as dist
    atexit.register(lambda: print("initialized at exit:", dist.is_initialized(), flush=True))
    if sys.argv[2] == "plugin":
        import fairseq_residual  # noqa: F401
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    """
)


@pytest.mark.slow  # one python process per case
@pytest.mark.parametrize("imports, left", [("plugin", False), ("torch only", True)])
def test_importing_the_plugin_destroys_the_group_at_exit(tmp_path, imports, left):
    probe = tmp_path / "probe.py"
    probe.write_text(EXIT_PROBE)
    proc = run_cli([sys.executable, probe, tmp_path / "rendezvous", imports], cwd=REPO)
    assert f"initialized at exit: {left}" in proc.stdout, proc.stdout[-2000:]

"""End gloo process groups before the interpreter shuts down, so that a finished distributed run exits 0.

fairseq-train never calls ``torch.distributed.destroy_process_group``: ``distributed_main``
(``fairseq/distributed/utils.py``) ends with a barrier and returns. With the gloo backend (CPU training under
torchrun, ``--distributed-backend gloo``) the groups then live until interpreter finalisation, where gloo's
worker threads can still hold work whose tensors reference Python objects; releasing them there aborts the
process: ``terminate called without an active exception``, exit signal 6 (SIGABRT), after training and the last
checkpoint have finished. torchrun reports the whole run as failed and stops the other ranks with SIGTERM.
Reported upstream as pytorch/pytorch#190489; a fix in torch (an ``atexit`` hook in ``init_process_group``,
pytorch/pytorch#179291) was proposed and abandoned.

Importing the plugin registers :func:`destroy_gloo_group` with :mod:`atexit`, which runs while the interpreter is
still whole. It acts only where every device of the default group uses gloo. A rank that fails still fails with
its own error. fairseq's launcher for ``--distributed-world-size N`` without torchrun
(``torch.multiprocessing.spawn``) imports the plugin in each child, whose exit runs the hook too.

Measured with torch 2.13.0 on a 2-core CPU, two ranks under torchrun:

* a script that all-reduces on the default group and exits: 8 of 60 runs aborted without the hook, 0 of 30 with
  the group destroyed by hand, 0 of 30 with this plugin imported;
* fairseq-train itself (3 updates of a tiny model, ``--ddp-backend legacy_ddp``): 0 of 30 aborted without the hook
  and 0 of 30 with it; a script that calls fairseq's ``cli_main`` and keeps the Trainer: 0 of 30 without, 0 of 30
  with the hook (dropping the Trainer). The race is rarer there than these runs can show; it aborted once in this
  project's CI, in such a script. At exit each fairseq-train rank had 7 threads; destroying the groups left 7,
  dropping fairseq's cached group 4 (tests/test_process_group.py checks the same with one rank).
"""
import atexit
import gc
import sys

import torch


def gloo_only(backend_config: str) -> bool:
    """Whether a process group's backend config (``torch.distributed.get_backend_config()``: ``"cpu:gloo"``,
    ``"cpu:gloo,cuda:gloo"`` for ``"gloo"``, ``"cpu:gloo,cuda:nccl"`` for torch's default on a CUDA build) names
    gloo for every device."""
    entries = [e.strip() for e in backend_config.lower().split(",") if e.strip()]
    return bool(entries) and all(e.rpartition(":")[2] == "gloo" for e in entries)


def destroy_gloo_group() -> bool:
    """Destroy every process group if the default one is initialised and uses gloo for every device, then drop
    fairseq's cached group and collect garbage, so that gloo's worker threads end while the interpreter is whole.

    fairseq trains on a group of its own, not the default one: ``get_global_group()`` caches
    ``dist.new_group()`` as ``get_global_group._global_group`` (``fairseq/distributed/utils.py``), and the
    Trainer's data-parallel group is that one. ``destroy_process_group`` only forgets the groups: a gloo group's
    threads run until its last reference is gone, so the cache is dropped here and the Trainer, model wrappers
    and their reference cycles are collected. A group a script still holds itself (a global that references a
    Trainer) stays alive until the interpreter frees it.

    Returns True when it destroyed the groups; False when there was none, a device used another backend (NCCL's
    groups are left as fairseq leaves them: torch only warns there, and destroying one needs a GPU to test), or
    torch was built without ``torch.distributed``. Raises nothing of its own: an error from
    ``destroy_process_group`` propagates."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        return False
    if not gloo_only(dist.get_backend_config()):
        return False
    dist.destroy_process_group()
    fairseq_utils = sys.modules.get("fairseq.distributed.utils")
    if fairseq_utils is not None:
        fairseq_utils.get_global_group.__dict__.pop("_global_group", None)
    gc.collect()
    return True


atexit.register(destroy_gloo_group)

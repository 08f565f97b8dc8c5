"""The fast lane by construction: a test that is not marked ``slow`` may not start a process.

A pytest plugin (loaded by ``conftest.py``). While a test that is not marked ``slow`` runs (its fixtures'
setup and the test itself), starting a process fails at once with an error that says to mark the test
slow: ``subprocess`` (``run``, ``Popen``, ``check_output``, ...), ``os.system``, ``os.fork`` (``multiprocessing``,
``torch.multiprocessing``) and ``os.posix_spawn``. So ``make test-fast`` (``-m "not slow"``) can never start
a fairseq CLI, a script or ``torchrun``, and ``make test`` fails the same way, so that an unmarked test is
found in either lane.

A test is slow when it carries the marker (``@pytest.mark.slow`` or a module's ``pytestmark``) or when it
uses a fixture declared slow with :func:`slow_fixture` (the binarised corpora, trained checkpoints, runs of
the scripts): the marker follows the fixture, not a list kept by hand.
"""
import functools
import os
import subprocess

import pytest

#: names of the fixtures declared with :func:`slow_fixture`
SLOW_FIXTURES = set()

#: the test now running when it may not start a process (its node id), else None
_guarded = [None]


def slow_fixture(function=None, **kwargs):
    """``pytest.fixture`` for a fixture that starts processes (a CLI, a script, a study): every test that
    uses it, directly or through another fixture, is marked ``slow``. Used bare (``@slow_fixture``) or with
    ``pytest.fixture``'s keyword arguments (``@slow_fixture(scope="session")``)."""
    def register(fn):
        SLOW_FIXTURES.add(kwargs.get("name", fn.__name__))
        return pytest.fixture(**kwargs)(fn)

    return register if function is None else register(function)


def guarded():
    """The node id of the running test when it may not start a process, else None."""
    return _guarded[0]


class ProcessInFastTestError(RuntimeError):
    """A test not marked ``slow`` started a process."""


def _refuse(what):
    @functools.wraps(what)
    def wrapper(*args, **kwargs):
        if _guarded[0] is not None:
            raise ProcessInFastTestError(
                f"{_guarded[0]} starts a process ({what.__qualname__}) but is not marked slow: mark this test "
                "slow (@pytest.mark.slow, or use a fixture declared with slow_fixture), or call the tool "
                "in-process (fairseq's train.main / generate.main, the study's main)")
        return what(*args, **kwargs)

    wrapper.__wrapped_by_process_guard__ = True
    return wrapper


def _install():
    """Wrap the entry points that start a process, once per interpreter."""
    targets = [(subprocess.Popen, "_execute_child"), (os, "system"), (os, "fork"), (os, "posix_spawn"),
               (os, "posix_spawnp")]
    for owner, name in targets:
        current = getattr(owner, name, None)
        if current is not None and not getattr(current, "__wrapped_by_process_guard__", False):
            setattr(owner, name, _refuse(current))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts processes (fairseq's CLIs, the scripts, torchrun, a study) "
                                       "or uses a fixture that does; `make test-fast` deselects it")
    _install()


def pytest_sessionstart(session):
    """Build matplotlib's font cache before any test, where it is missing: the first import of
    ``matplotlib.font_manager`` on a machine runs ``fc-list`` (``matplotlib/font_manager.py``), a process of the
    machine's set-up, which would otherwise fail whichever fast test draws a plot first; later imports read the
    cache (``fontlist-v*.json`` in matplotlib's cache directory)."""
    try:
        import matplotlib
    except ImportError:
        return
    from pathlib import Path

    if not list(Path(matplotlib.get_cachedir()).glob("fontlist-v*.json")):
        import matplotlib.font_manager  # noqa: F401


def pytest_collection_modifyitems(items):
    """Mark ``slow`` every test that uses a fixture declared with :func:`slow_fixture`."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Refuse processes while the fixtures of a test that is not marked slow are set up."""
    with _guarding(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Refuse processes while a test that is not marked slow runs. (Teardown is not guarded: a slow
    module's or session's fixture is torn down after whichever test ran last.)"""
    with _guarding(item):
        yield


class _guarding:
    def __init__(self, item):
        self.nodeid = None if item.get_closest_marker("slow") else item.nodeid

    def __enter__(self):
        self.previous, _guarded[0] = _guarded[0], self.nodeid

    def __exit__(self, *exc):
        _guarded[0] = self.previous

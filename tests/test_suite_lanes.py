"""The suite's lanes (tests/process_guard.py): a test not marked slow cannot start a process, and a test
that uses a fixture declared slow is slow itself. Each checked on a throwaway test file run by pytest's own
``pytester`` in this process."""
import pytest

INNER = '''
import subprocess
import sys

import pytest

from process_guard import guarded, slow_fixture


@slow_fixture
def binarised():
    return "data-bin"


def test_unmarked_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"])


def test_unmarked_os_system():
    import os
    os.system("true")


@pytest.mark.slow
def test_marked_slow_may():
    assert guarded() is None


def test_uses_a_slow_fixture(binarised):
    assert guarded() is None


def test_in_process_is_guarded():
    assert guarded().endswith("test_in_process_is_guarded")
'''


@pytest.fixture
def inner(pytester):
    pytester.makepyfile(test_inner=INNER)
    return pytester


def test_a_test_not_marked_slow_that_starts_a_process_fails_saying_mark_it_slow(inner):
    result = inner.runpytest_inprocess("-p", "process_guard", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines([
        "*test_unmarked_starts_a_process starts a process (Popen._execute_child) but is not marked slow: "
        "mark this test slow*",
        "*test_unmarked_os_system starts a process (system) but is not marked slow: mark this test slow*",
    ])


def test_the_fast_lane_deselects_slow_tests_and_tests_of_slow_fixtures(inner):
    result = inner.runpytest_inprocess("-p", "process_guard", "-q", "-p", "no:cacheprovider", "-m", "not slow")
    result.assert_outcomes(passed=1, failed=2, deselected=2)

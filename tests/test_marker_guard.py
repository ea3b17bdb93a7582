"""The marker guard (tests/marker_guard.py) fails an unmarked slow test by name, and only that.

Each case runs a small suite of its own through pytester with the guard's limits lowered to
0.05 s, so the slow tests and fixtures there sleep 0.15 s rather than the real limits' 2 and 20 s.
"""

import pytest

SUITE = """
import time
import pytest

def test_quick():
    pass

def test_unmarked_but_slow():
    time.sleep(0.15)

@pytest.mark.slow
def test_marked_slow():
    time.sleep(0.15)

@pytest.mark.e2e
def test_marked_e2e():
    time.sleep(0.15)

@pytest.fixture
def slow_fixture():
    time.sleep(0.15)
    yield

def test_slow_in_its_setup(slow_fixture):
    pass

@pytest.fixture(scope="module")
def slow_shared_fixture():
    time.sleep(0.15)
    yield

def test_first_to_set_up_a_slow_shared_fixture(slow_shared_fixture):
    pass

def test_second_on_a_slow_shared_fixture(slow_shared_fixture):
    pass
"""


@pytest.fixture
def run_suite(pytester):
    def run(limit: str, shared_limit: str):
        pytester.makeini(f"[pytest]\nmarkers =\n    slow: x\n    e2e: x\n    browser: x\n    gpu: x\n"
                         f"marker_guard_seconds = {limit}\nmarker_guard_shared_seconds = {shared_limit}\n")
        pytester.makepyfile(test_suite=SUITE)
        return pytester.runpytest_inprocess("-p", "tests.marker_guard", "-p", "no:cacheprovider",
                                           "-p", "no:django", "-p", "no:asyncio",
                                           "-p", "no:schemathesis", "-p", "no:hypothesispytest")
    return run


def test_an_unmarked_test_over_the_limit_fails_with_its_name(run_suite):
    result = run_suite("0.05", "0")
    # The shared fixture's setup is not the first test's own time, and the second pays nothing.
    result.assert_outcomes(passed=5, failed=2)
    result.stdout.fnmatch_lines([
        "*test_suite.py::test_unmarked_but_slow took 0.* s (its call and its own fixtures), over 0.05 s "
        "without any of the markers slow, browser, e2e, gpu*",
    ])
    result.stdout.fnmatch_lines(["*test_suite.py::test_slow_in_its_setup took 0.* s*"])


def test_a_slow_shared_fixture_fails_the_unmarked_test_that_set_it_up(run_suite):
    result = run_suite("0", "0.05")
    result.assert_outcomes(passed=6, failed=1)
    result.stdout.fnmatch_lines(["*test_suite.py::test_first_to_set_up_a_slow_shared_fixture set up the shared "
                                 "fixture 'slow_shared_fixture' in 0.* s, over 0.05 s without any of the markers*"])


def test_limits_of_zero_turn_the_guard_off(run_suite):
    run_suite("0", "0").assert_outcomes(passed=7)

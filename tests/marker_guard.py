"""The guard that keeps `make test-fast` fast: an unmarked test that takes too long fails.

`make test-fast` runs the tests that carry none of the markers in EXPENSIVE_MARKERS (declared,
with the others, in pytest.ini). A test that starts a server, a browser or a subprocess, or loads
a real model, must say so with one of them; the guard catches the ones that do not by their time.

pytest measures each phase of a test (the numbers behind --durations). A test's own time is its
call plus its setup, less the one-time setup of module-, package- and session-scoped fixtures
that it happened to be the first to request: those are paid once per run whichever test comes
first (an order pytest-xdist changes from run to run), so they are held to a limit of their own.
Either limit passed by an unmarked test turns its call's report into a failure that names the
test (and the fixture), the time and the markers to choose from. Teardown never counts: the last
test of a run pays for tearing down every session fixture.

Limits: the ini options ``marker_guard_seconds`` (pytest.ini: 2) for a test's own time and
``marker_guard_shared_seconds`` (pytest.ini: 20) for one shared fixture's setup; 0 turns a limit off.
"""

from __future__ import annotations

import time

import pytest

EXPENSIVE_MARKERS = ("slow", "browser", "e2e", "gpu")
_SHARED_KEY = pytest.StashKey[dict]()
_SETUP_KEY = pytest.StashKey[float]()
_running: list[pytest.Item] = []  # the test whose setup is running: the one a fixture's setup is charged to


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("marker_guard_seconds", "an unmarked test whose own time passes this fails (0: off)",
                  default="2")
    parser.addini("marker_guard_shared_seconds",
                  "an unmarked test that sets up a shared fixture slower than this fails (0: off)", default="20")


def is_expensive(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) is not None for name in EXPENSIVE_MARKERS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    _running.append(item)
    try:
        yield
    finally:
        _running.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    start = time.perf_counter()
    yield
    if fixturedef.scope != "function" and _running:
        shared = _running[-1].stash.setdefault(_SHARED_KEY, {})
        shared[fixturedef.argname] = time.perf_counter() - start


def _problems(item: pytest.Item, call_seconds: float) -> list[str]:
    limit = float(item.config.getini("marker_guard_seconds"))
    shared_limit = float(item.config.getini("marker_guard_shared_seconds"))
    shared = item.stash.get(_SHARED_KEY, {})
    own = item.stash.get(_SETUP_KEY, 0.0) - sum(shared.values()) + call_seconds
    problems = []
    if limit > 0 and own > limit:
        problems.append(f"took {own:.1f} s (its call and its own fixtures), over {limit:g} s")
    problems += [f"set up the shared fixture {name!r} in {seconds:.1f} s, over {shared_limit:g} s"
                 for name, seconds in shared.items() if shared_limit > 0 and seconds > shared_limit]
    return problems


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when == "setup":
        item.stash[_SETUP_KEY] = report.duration
    if report.when != "call" or not report.passed or is_expensive(item):
        return
    problems = _problems(item, report.duration)
    if problems:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} {' and '.join(problems)} without any of the markers "
            f"{', '.join(EXPENSIVE_MARKERS)}: mark it (pytest.ini says what each means) or make it faster, "
            f"so that `make test-fast` stays the quick loop")

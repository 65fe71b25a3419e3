"""Shared fixtures and policy for the whole suite.

Each local server is started once per test session on a free loopback port from
the project's own files, and stopped at the end. A server that cannot start
fails the tests that need it. With REQUIRE_NO_SKIPS=1 (what `make test` and CI
set) a skipped test fails the run, so integration tests can never pass by not
running."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.fixtures.azurite",
    "tests.fixtures.cosmos",
    "tests.fixtures.servicebus",
]

_TESTS = Path(__file__).parent
_SERVER_FOLDERS = ("integration", "devstack", "e2e")


# The longest files (minutes each, mostly waiting on servers, timers and deadlines; the
# simulation's on a core), in the order `make test` hands them to its workers (-n 4
# --dist loadfile --no-loadscope-reorder): the longest first, so that no worker is left
# alone with one at the end. From a run's --durations=0 summed by file; the SDK's copied
# schedule and lock tests sleep for minutes, as on Azure.
_LONGEST_FIRST = (
    "devstack/upstream/sdk_servicebus/test_queues.py",
    "sim/test_simulation.py",
    "devstack/upstream/sdk_servicebus/test_queues_7_11.py",
    "e2e/test_fault_points.py",
    "e2e/test_console_effects_browser.py",
    "integration/submit/test_submit_function.py",
    "e2e/test_console_browser.py",
    "sim/test_fault_surface.py",
    "sim/test_clients.py",
    "sim/test_mutation_world.py",
    "sim/test_mutate.py",
    "devstack/lifecycle/test_settings_and_restart.py",
    "integration/supervisor/test_supervisor.py",
    "devstack/servicebus/test_topics.py",
    "e2e/test_shards.py",
    "e2e/test_hostile.py",
    "property/test_hostile_queues.py",
    "e2e/test_forged_internal.py",
    "e2e/test_order_ownership.py",
    "e2e/test_compensation.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).relative_to(_TESTS).parts
        if parts and parts[0] in _SERVER_FOLDERS:
            item.add_marker(pytest.mark.integration)

    def rank(item) -> int:
        path = Path(str(item.fspath)).relative_to(_TESTS).as_posix()
        return _LONGEST_FIRST.index(path) if path in _LONGEST_FIRST else len(_LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order inside a file, and of the other files, stays


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """Each test ends with os.environ as it began: a test (or the code it runs
    in-process, such as devstack.host.config.load_local_settings, or a library
    import) that sets a variable and leaves it would change what the next test in
    the same xdist worker reads (the console's local mode and CSRF secret, the
    Azure hints, the app's settings). Session and module fixtures that set one
    run before this snapshot, so theirs stays. What was put back is named in a
    warning (the run's summary), so that a leak is found, not only undone."""
    before = dict(os.environ)
    yield
    changed = sorted(
        k
        for k in set(before) | set(os.environ)
        if before.get(k) != os.environ.get(k) and k != "PYTEST_CURRENT_TEST"  # pytest's own
    )
    for name in changed:
        if name in before:
            os.environ[name] = before[name]
        else:
            del os.environ[name]
    if changed:
        warnings.warn(f"os.environ put back after the test: {', '.join(changed)}", stacklevel=1)


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("REQUIRE_NO_SKIPS") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped and session.exitstatus == 0:
        reporter.write_line(
            f"REQUIRE_NO_SKIPS: {len(skipped)} test(s) skipped; failing the run", red=True
        )
        session.exitstatus = 1

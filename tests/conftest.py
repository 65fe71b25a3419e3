"""Shared fixtures and policy for the whole suite.

Each local server is started once per test session on a free loopback port from
the project's own files, and stopped at the end. A server that cannot start
fails the tests that need it. With REQUIRE_NO_SKIPS=1 (what `make test` and CI
set) a skipped test fails the run, so integration tests can never pass by not
running."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.fixtures.azurite",
    "tests.fixtures.cosmos",
    "tests.fixtures.servicebus",
]

_TESTS = Path(__file__).parent
_SERVER_FOLDERS = ("integration", "devstack", "e2e")


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).relative_to(_TESTS).parts
        if parts and parts[0] in _SERVER_FOLDERS:
            item.add_marker(pytest.mark.integration)


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

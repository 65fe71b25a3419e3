"""Shared fixtures: each local server is started once per test session on a free
loopback port from the project's own files, and stopped at the end. A server that
cannot start fails the tests that need it; nothing is skipped silently."""

pytest_plugins = [
    "tests.fixtures.azurite",
    "tests.fixtures.cosmos",
    "tests.fixtures.servicebus",
]

"""Versioning, proven once (docs/adr/018d-versioning.md): an instance runs
the code of the version it started on. The previous version here is a test
fixture (tests/fixtures/previous_workflow.py), since none was ever deployed:
an instance that started on it finishes on it after the host is upgraded to
a build that keeps it as a frozen copy; a build without the copy refuses the
instance by its version instead of running it on code it was not written
for; and a new instance of the upgraded build runs the live version."""

from __future__ import annotations

import json
from pathlib import Path

from domain.models import ProcessState
from orchestrators import order_workflow as wf
from tests.fixtures import previous_workflow as previous
from tests.unit.orchestrators.driver import Driver, World, ok

ROOT = Path(__file__).resolve().parents[3]


def _before_upgrade(context):
    """The build deployed before: 0.9 was its live version."""
    return (yield from previous.run(context))


def _upgraded_at_first_reply(driver: Driver, build):
    """A before_activity hook: the host is replaced by `build` once the
    attempt has sent its first request (the instance is in flight)."""

    def hook(name: str, data: dict) -> None:
        if name == "send_step" and driver.orchestrator is _before_upgrade:
            driver.orchestrator = build

    return hook


def test_host_json_starts_new_instances_on_the_live_version():
    host = json.loads((ROOT / "host.json").read_text())
    assert host["extensions"]["durableTask"]["defaultVersion"] == wf.VERSION


async def test_an_instance_in_flight_finishes_on_its_version_after_the_upgrade():
    world = World()
    driver = Driver(world, await world.claimed(), ok, version=previous.VERSION)
    driver.orchestrator = _before_upgrade
    driver.before_activity = _upgraded_at_first_reply(
        driver, wf.orchestrator(frozen={previous.VERSION: previous.run})
    )
    assert await driver.run() == "completed"
    assert driver.orchestrator is not _before_upgrade  # the upgrade happened in flight
    assert driver.output == {"Outcome": "processed"}
    assert (await world.record()).ProcessState is ProcessState.PROCESSED
    # It ran 0.9's code to the end: a timer per step, where 1.0 has one.
    assert sum(1 for e in driver.history if e["EventType"] == 10) == 3


async def test_a_build_without_the_frozen_copy_refuses_the_instance_by_its_version():
    world = World()
    driver = Driver(world, await world.claimed(), ok, version=previous.VERSION)
    driver.orchestrator = _before_upgrade
    driver.before_activity = _upgraded_at_first_reply(driver, wf.orchestrator())
    assert await driver.run() == "failed"
    assert "version '0.9'" in (driver.error or "")
    # Nothing was written for it: the Supervisor recovers the record at its deadline.
    assert (await world.record()).ProcessState is ProcessState.PROCESSING


async def test_a_new_instance_of_the_upgraded_build_runs_the_live_version():
    world = World()
    build = wf.orchestrator(frozen={previous.VERSION: previous.run})
    driver = Driver(world, await world.claimed(), ok, orchestrator=build)
    assert await driver.run() == "completed"
    assert sum(1 for e in driver.history if e["EventType"] == 10) == 1  # one timer
    assert (await world.record()).ProcessState is ProcessState.PROCESSED

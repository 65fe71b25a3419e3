"""A failed inline step (INLINE_STEPS: the agent library run in an activity)
ends the attempt with a reason an operator can use (review defect 3): the
step, the error's type and its message (card numbers masked) reach the
record's LastError, so the Supervisor's retry, its Error and its alert name
them. It used to fail the orchestration with a validation error about the
reply, leaving the Supervisor to report only a missed deadline."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from domain import state_machine as sm
from domain.models import ProcessState, StepStatus
from orchestrators.order_workflow import VERSION
from tests.unit.orchestrators.driver import POLICY, STEPS, Driver, World

INLINE = STEPS[1]


class BrokenAgent:
    """The inline agent library failing in a way it does not foresee."""

    async def handle(self, request):
        raise KeyError(
            f"provider answer without 'status' for card 4111 1111 1111 1111 ({request.Step})"
        )


def ok(send):
    return ("ok", {"Reference": f"ref-{send.Step}"})


async def _attempt(world, version):
    instance_id = await world.claimed()
    return Driver(world, instance_id, ok, version=version)


@pytest.mark.parametrize("version", [VERSION])
async def test_an_inline_step_that_raises_names_step_type_and_message(version):
    world = World(step_modes={INLINE: "inline"}, inline_agent=BrokenAgent())
    driver = await _attempt(world, version)
    assert await driver.run() == "completed", driver.error
    assert driver.output["Outcome"] == "timed_out"
    assert driver.output["Step"] == INLINE
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSING  # the Supervisor's, as before
    # Steps are completed by the attempt's one finishing write, never reached.
    assert record.Steps[STEPS[0]].Status is StepStatus.RUNNING
    error = record.LastError
    assert f"inline step {INLINE} failed: KeyError:" in error, error
    assert "provider answer without 'status'" in error
    assert "4111" not in error
    assert "[card number removed]" in error
    assert "4111" not in driver.output["Detail"]
    # nor in the orchestration's history (the failed activity's reason)
    assert "4111" not in json.dumps(driver.history)
    # The Supervisor's retry, and its Error and alert once the budget is
    # spent, carry the reason.
    later = record.CompleteBy + timedelta(seconds=1)
    retried = sm.recover_expired(record, record.LockedBy, later, POLICY)
    assert f"inline step {INLINE} failed: KeyError" in retried.LastError
    given_up = sm.recover_expired(
        record.model_copy(update={"FailureCount": POLICY.max_failures}),
        record.LockedBy,
        later,
        POLICY,
    )
    assert given_up.ProcessState is ProcessState.ERROR
    assert f"inline step {INLINE} failed: KeyError" in given_up.PendingStatus.Detail


@pytest.mark.parametrize("version", [VERSION])
async def test_an_inline_activity_that_fails_outside_the_agent_still_gives_a_reason(version):
    """The activity itself failed (the host reports only its text): the
    step and that text still reach the record."""
    world = World(step_modes={INLINE: "inline"}, inline_agent=BrokenAgent())
    driver = await _attempt(world, version)
    driver.fail = lambda name, call: name == "run_inline_step"
    assert await driver.run() == "completed", driver.error
    assert driver.output["Outcome"] == "timed_out"
    record = await world.record()
    assert record.LastError.startswith(f"inline step {INLINE} failed: ")
    assert "scripted failure of run_inline_step call 0" in record.LastError

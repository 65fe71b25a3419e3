"""The Durable client's edge (adapters/durable_client.py): the SDK's texts for
a missing or finished instance become InstanceGone; every other failure
passes through unchanged."""

from __future__ import annotations

import inspect

import pytest
from azure.durable_functions.models import DurableOrchestrationClient

from adapters.durable_client import GONE_MARKERS, raise_event
from domain.errors import InstanceGone


class Client:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.raised: list[tuple[str, str, object]] = []

    async def raise_event(self, instance_id, event_name, data):
        if self.error is not None:
            raise self.error
        self.raised.append((instance_id, event_name, data))


async def test_an_event_is_raised_as_given():
    client = Client()
    await raise_event(client, "o:1", "reply-a-1", {"x": 1})
    assert client.raised == [("o:1", "reply-a-1", {"x": 1})]


@pytest.mark.parametrize(
    "text",
    [
        # azure-functions-durable 1.x, DurableOrchestrationClient.raise_event (410, 404)
        "Instance with ID o:1 is gone: either completed or failed",
        "No instance with ID o:1 found.",
    ],
)
async def test_the_sdks_texts_for_a_missing_or_finished_instance_are_instance_gone(text):
    with pytest.raises(InstanceGone, match="o:1"):
        await raise_event(Client(Exception(text)), "o:1", "reply-a-1", {})


def test_the_markers_are_the_installed_sdks_own_texts():
    # If an SDK upgrade rewords them, late replies would be retried: fail here.
    source = inspect.getsource(DurableOrchestrationClient.raise_event)
    assert all(marker in source for marker in GONE_MARKERS)


async def test_any_other_failure_is_raised_as_it_was():
    error = Exception("Webhook uri is not found")
    with pytest.raises(Exception, match="Webhook uri") as caught:
        await raise_event(Client(error), "o:1", "reply-a-1", {})
    assert caught.value is error
    assert not isinstance(caught.value, InstanceGone)

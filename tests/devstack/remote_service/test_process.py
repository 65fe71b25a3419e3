"""The service as a process: its ready line, a clean stop, and a ledger that
survives a crash when it has a state file."""

from __future__ import annotations

import aiohttp
import pytest

from devstack.remote_service.process import start_remote_service

pytestmark = pytest.mark.integration


async def test_a_crash_after_the_effect_then_a_restart_still_applies_it_once(tmp_path):
    state_file = tmp_path / "remote-state.json"
    service = start_remote_service(state_file=state_file)
    headers = {"Idempotency-Key": "o1/charge-payment", "Fencing-Token": "2"}
    try:
        async with aiohttp.ClientSession() as session:
            fault = {"kind": "crash", "service": "payment", "mode": "exit"}
            assert (await session.post(f"{service.url}/_admin/faults", json=fault)).status == 201
            with pytest.raises(aiohttp.ClientConnectionError):
                await session.post(f"{service.url}/payment/charge", json={}, headers=headers)
            assert service.process.wait(10) == 75

            restarted = start_remote_service(port=service.port, state_file=state_file)
            try:
                retry = await session.post(
                    f"{restarted.url}/payment/charge", json={}, headers=headers
                )
                stale = await session.post(
                    f"{restarted.url}/payment/charge",
                    json={},
                    headers={**headers, "Fencing-Token": "1"},
                )
                report = await (await session.get(f"{restarted.url}/_admin/side-effects")).json()
            finally:
                restarted.stop()
    finally:
        service.stop()

    assert retry.status == 200
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert stale.status == 409  # the fence survived the restart too
    assert report["total"] == 1
    assert report["duplicates"] == []


def test_sigterm_stops_it_cleanly():
    service = start_remote_service()

    assert service.url.startswith("http://127.0.0.1:")
    assert service.stop() == 0

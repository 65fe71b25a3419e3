"""Not collected by the suite (no test_ prefix): the lifecycle tests run it in
a pytest of its own, which they then kill, to show that the session fixtures'
servers die with a test run killed outright."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from devstack.remote_service.process import start_remote_service


def test_hold_the_servers(azurite, cosmos_server, servicebus_emulator):
    remote = start_remote_service()
    try:
        ports = [
            azurite.blob_port,
            azurite.queue_port,
            azurite.table_port,
            cosmos_server.port,
            servicebus_emulator.port,
            remote.port,
        ]
        Path(os.environ["LIFECYCLE_PORTS_FILE"]).write_text(json.dumps(ports))
        time.sleep(120)  # killed long before this
    finally:
        remote.stop()

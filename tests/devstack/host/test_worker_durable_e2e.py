"""The Python worker's own Durable end-to-end case, on devstack.host.

`TestDurableFunctionsStein.test_durable` of Azure/azure-functions-python-worker
(tests/endtoend/test_durable_functions.py at 7e6acf36e43335ad69742923af9ff3d62b99242a)
against its app `durable_functions_stein`, copied unchanged into
tests/devstack/upstream/durable_functions_stein (see its SOURCE.md). The app registers
`durablefunctionsorchestrator` and `hello`; the test starts `DurableFunctionsOrchestrator`
and the orchestrator calls `Hello`: the host resolves function names ignoring case, as
the Durable extension's `FunctionName` compares them (OrdinalIgnoreCase).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from .conftest import HostProcess

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

STEIN = Path(__file__).resolve().parents[1] / "upstream" / "durable_functions_stein"


@pytest.fixture
def webhost(host_factory: Any) -> HostProcess:
    return host_factory(app_dir=STEIN, hub="TestHubName", app="function_app:app")


def _status_when_finished(uri: str, timeout: float = 30) -> requests.Response:
    """The worker sleeps 4 s then reads the status once; this polls until it has finished."""
    deadline = time.monotonic() + timeout
    while True:
        status = requests.get(uri, timeout=10)
        if status.status_code != 202 or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def test_durable(webhost: HostProcess) -> None:
    # As the worker's test: r = self.webhost.request('GET', 'orchestrators/DurableFunctionsOrchestrator')
    r = requests.get(f"{webhost.base}/api/orchestrators/DurableFunctionsOrchestrator", timeout=10)
    assert r.status_code == 202
    content = json.loads(r.content)

    status = _status_when_finished(content["statusQueryGetUri"])
    assert status.status_code == 200

    status_content = json.loads(status.content)
    assert status_content["runtimeStatus"] == "Completed"
    assert status_content["output"] == ["Hello Tokyo!", "Hello Seattle!", "Hello London!"]


def test_names_differing_only_in_case_reach_the_same_functions(webhost: HostProcess) -> None:
    """Every spelling of the orchestrator's name starts it; an unknown name is still refused."""
    for spelling in ("durablefunctionsorchestrator", "DURABLEFUNCTIONSORCHESTRATOR"):
        r = requests.get(f"{webhost.base}/api/orchestrators/{spelling}", timeout=10)
        assert r.status_code == 202, spelling
        status = _status_when_finished(r.json()["statusQueryGetUri"])
        assert status.json()["runtimeStatus"] == "Completed", spelling
    r = requests.get(f"{webhost.base}/api/orchestrators/NoSuchOrchestrator", timeout=10)
    assert r.status_code == 500  # the client's start_new raised: the extension answered 400

"""What a client sees in the trace context of the messages we send back,
with and without an exporter: always a valid W3C traceparent, continuing the
client's trace when its own was valid, a fresh trace when it was missing or
malformed. Each case runs in a child process: the global tracer provider can
be set only once per process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
VALID = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"
W3C = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")

SCRIPT = textwrap.dedent("""
    import json, sys
    from adapters import telemetry

    class Received:  # what the Service Bus trigger hands Submit
        def __init__(self, properties):
            self.application_properties = properties
            self.message_id = "ORD-1"

    print(telemetry.configure())
    out = {}
    for name, properties in json.loads(sys.argv[1]).items():
        properties = {k.encode(): v.encode() for k, v in properties.items()}
        with telemetry.consume("submit", Received(properties)):
            sent = telemetry.message_properties({"OrderID": "ORD-1"})
        out[name] = sent.get(b"traceparent")
    print(json.dumps(out))
""")

CASES = {
    "valid": {"traceparent": VALID},
    "missing": {},
    "malformed": {"traceparent": "00-not-a-trace-01"},
    "all zeros": {"traceparent": f"00-{'0' * 32}-{'0' * 16}-01"},
}


@pytest.mark.parametrize("exporter", ["none", "file"])
def test_statuses_always_carry_a_valid_trace_context(exporter, tmp_path):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "APPLICATIONINSIGHTS_"))
    }
    env["PYTHONPATH"] = str(REPO)
    if exporter == "file":
        env["OTEL_TRACES_FILE"] = str(tmp_path / "spans.jsonl")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(CASES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    chosen, sent = done.stdout.split("\n", 1)
    assert chosen == exporter
    carried = json.loads(sent)
    traces = {}
    for name, traceparent in carried.items():
        match = W3C.match(traceparent or "")
        assert match, (name, traceparent)
        traces[name] = match[1]
    assert traces["valid"] == CLIENT_TRACE
    fresh = [traces[n] for n in ("missing", "malformed", "all zeros")]
    assert CLIENT_TRACE not in fresh
    assert len(set(fresh)) == 3, "each fresh trace is its own"
    assert "0" * 32 not in fresh

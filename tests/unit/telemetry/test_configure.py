"""Where telemetry goes, chosen once per process from the settings
(adapters.telemetry.configure). The file path runs in a child process:
the global providers can be set only once per process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from adapters import telemetry

REPO = Path(__file__).resolve().parents[3]


def test_the_local_stack_writes_spans_and_metrics_as_otlp_json_lines(tmp_path):
    spans, metrics = tmp_path / "spans.jsonl", tmp_path / "metrics.jsonl"
    script = textwrap.dedent("""
        from adapters import telemetry
        print(telemetry.configure())
        print(telemetry.configure())
        with telemetry.span("outer", order_id="O-1"):
            with telemetry.span("inner"):
                pass
        telemetry.app_metrics().attempts.add(2)
        telemetry.flush()
    """)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "APPLICATIONINSIGHTS_"))
    }
    env.update(
        {"OTEL_TRACES_FILE": str(spans), "OTEL_METRICS_FILE": str(metrics), "PYTHONPATH": str(REPO)}
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["file", "configured"]

    from cli.trace import load, roots

    found = load(spans, "O-1")
    (only,) = found.values()
    (root,) = roots(only)
    assert [root.name, *[c.name for c in root.children]] == ["outer", "inner"]
    batches = [json.loads(line) for line in metrics.read_text().splitlines()]
    names = {
        m["name"]
        for b in batches
        for rm in b["resourceMetrics"]
        for sm in rm["scopeMetrics"]
        for m in sm["metrics"]
    }
    assert "orders.attempts" in names


def test_application_insights_uses_the_distro_with_the_apps_identity(monkeypatch):
    import azure.monitor.opentelemetry as distro

    calls = []
    monkeypatch.setattr(distro, "configure_azure_monitor", lambda **kw: calls.append(kw))
    # Whatever an earlier test in this process set up (importing bootstrap configures it).
    monkeypatch.setattr(telemetry, "_sdk_provider_set", lambda: False)
    env = {
        "APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=00000000-0000-0000-0000-000000000000",
        "AZURE_CLIENT_ID": "11111111-1111-1111-1111-111111111111",
        "IDENTITY_ENDPOINT": "http://127.0.0.1:1",
    }
    assert telemetry._configure(env) == "azure-monitor"
    (kwargs,) = calls
    from azure.identity import ManagedIdentityCredential

    assert isinstance(kwargs["credential"], ManagedIdentityCredential)

    calls.clear()
    env = {
        "APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=00000000-0000-0000-0000-000000000000"
    }
    assert telemetry._configure(env) == "azure-monitor"
    assert calls == [{}]


def test_a_provider_the_functions_worker_set_is_kept(monkeypatch):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    monkeypatch.setattr(trace, "get_tracer_provider", lambda: TracerProvider())
    assert telemetry._configure({"APPLICATIONINSIGHTS_CONNECTION_STRING": "x"}) == "existing"


@pytest.mark.parametrize("env", [{}, {"OTEL_TRACES_EXPORTER": "none"}])
def test_without_settings_nothing_is_exported(env, monkeypatch):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    # A provider without processors is set all the same (trace context for the
    # messages we send); captured here, the process's global can be set only once.
    providers = []
    monkeypatch.setattr(trace, "set_tracer_provider", providers.append)
    monkeypatch.setattr(telemetry, "_sdk_provider_set", lambda: False)
    assert telemetry._configure(env) == "none"
    (provider,) = providers
    assert isinstance(provider, TracerProvider)
    assert provider._active_span_processor._span_processors == ()


def test_a_file_setting_without_the_local_exporter_is_said_and_ignored(tmp_path):
    """The OTLP/JSON file exporter is a dev-only package (requirements-dev.txt),
    not deployed: a stray OTEL_TRACES_FILE in Azure must not stop the app."""
    script = textwrap.dedent("""
        import logging, sys
        logging.basicConfig(level=logging.WARNING)

        class NotInstalled:
            def find_spec(self, name, path=None, target=None):
                if name.startswith("opentelemetry.exporter.otlp.json"):
                    raise ModuleNotFoundError(name)
                return None

        sys.meta_path.insert(0, NotInstalled())
        from adapters import telemetry
        print(telemetry.configure())
    """)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "APPLICATIONINSIGHTS_"))
    }
    env.update(
        {
            "OTEL_TRACES_FILE": str(tmp_path / "spans.jsonl"),
            "OTEL_METRICS_FILE": str(tmp_path / "metrics.jsonl"),
            "PYTHONPATH": str(REPO),
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none"
    assert (
        "OTEL_TRACES_FILE is set but opentelemetry-exporter-otlp-json-file is not installed"
        in done.stderr
    )
    assert "OTEL_METRICS_FILE is set" in done.stderr
    assert not (tmp_path / "spans.jsonl").exists()


def test_app_log_level_keeps_info_records_from_being_made_at_warning():
    """Production's APP_LOG_LEVEL=Warning: an INFO record is never made, so no
    handler (the worker's forwarder, the distro's exporter) sees it; warnings
    and errors (the operator alerts) still are. Run in a child process: it
    sets the root logger's level."""
    script = textwrap.dedent("""
        import logging
        from adapters import telemetry
        seen = []
        class Keep(logging.Handler):
            def emit(self, record):
                seen.append(record.levelname)
        logging.getLogger().addHandler(Keep())
        logging.getLogger().setLevel(logging.INFO)
        print(telemetry.apply_log_level({"APP_LOG_LEVEL": "Warning"}))
        log = logging.getLogger("orchestrators.reply_bridge")
        log.info("routine")
        log.warning("odd")
        log.error("operator alert OrderError for order A:1: declined")
        print(",".join(seen))
        print(telemetry.apply_log_level({}), telemetry.apply_log_level({"APP_LOG_LEVEL": "loud"}))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    level, seen, ignored = done.stdout.split("\n")[:3]
    assert level == str(logging.WARNING)
    assert seen == "WARNING,ERROR"
    assert ignored == "None None"  # unset, or a name it does not know: unchanged

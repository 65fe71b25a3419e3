"""An app the Python worker would refuse to load is refused by the host at start, with the
worker's FunctionLoadError wording; every refusal is one line on stderr and exit code 2."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING) ")

HEAD = """
import azure.durable_functions as df
import azure.functions as func

app = df.DFApp()
"""


def run_host(
    tmp_path: Path, body: str, host_json: str | None = None
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "function_app.py").write_text(HEAD + textwrap.dedent(body))
    if host_json is not None:
        (tmp_path / "host.json").write_text(host_json)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "devstack.host",
            "--app-dir",
            str(tmp_path),
            "--data-dir",
            str(tmp_path / "hub"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    # The app's own log records (the library warns about auth levels at import) are not
    # the host's: everything else on stderr is the refusal, in one line.
    lines = [
        line for line in result.stderr.splitlines() if line.strip() and not LOG_RECORD.match(line)
    ]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "ready" not in result.stdout
    return lines[0]


def test_a_durable_client_on_the_wrong_function_is_refused_at_load(tmp_path: Path) -> None:
    line = refusal(
        run_host(
            tmp_path,
            """
            @app.route(route="start")
            @app.durable_client_input(client_name="client")
            def start(req: func.HttpRequest) -> func.HttpResponse:
                return func.HttpResponse("never")
            """,
        )
    )
    assert line == (
        "devstack.host: cannot load the start function: the following parameters are declared "
        "in function.json but not in Python: {'client'}"
    )


def test_a_parameter_without_a_binding_is_refused_at_load(tmp_path: Path) -> None:
    line = refusal(
        run_host(
            tmp_path,
            """
            @app.route(route="hello")
            def hello(req: func.HttpRequest, name: str) -> func.HttpResponse:
                return func.HttpResponse(name)
            """,
        )
    )
    assert line == (
        "devstack.host: cannot load the hello function: the following parameters are declared "
        "in Python but not in function.json: {'name'}"
    )


def test_an_annotation_the_binding_cannot_give_is_refused_at_load(tmp_path: Path) -> None:
    line = refusal(
        run_host(
            tmp_path,
            """
            @app.queue_trigger(arg_name="msg", queue_name="q", connection="AzureWebJobsStorage")
            def on_queue(msg: int) -> None:
                pass
            """,
        )
    )
    assert line == (
        "devstack.host: cannot load the on_queue function: type of msg binding in function.json "
        '"queueTrigger" does not match its Python annotation "int"'
    )


def test_a_wrong_context_annotation_is_refused_at_load(tmp_path: Path) -> None:
    line = refusal(
        run_host(
            tmp_path,
            """
            @app.route(route="ctx")
            def ctx(req: func.HttpRequest, context: str) -> func.HttpResponse:
                return func.HttpResponse("x")
            """,
        )
    )
    assert line.startswith(
        'devstack.host: cannot load the ctx function: the "context" parameter is expected to be '
        "of type azure.functions.Context"
    )


def test_an_unsupported_trigger_is_one_line_and_exit_2(tmp_path: Path) -> None:
    line = refusal(
        run_host(
            tmp_path,
            """
            @app.blob_trigger(arg_name="blob", path="in/{name}", connection="AzureWebJobsStorage")
            def on_blob(blob: func.InputStream) -> None:
                pass
            """,
        )
    )
    assert (
        line
        == "devstack.host: function on_blob: trigger 'blobTrigger' is not supported by devstack.host"
    )


def test_an_unexpected_start_failure_is_one_line_and_exit_2(tmp_path: Path) -> None:
    line = refusal(
        run_host(
            tmp_path,
            """
            @app.route(route="ok")
            def ok(req: func.HttpRequest) -> func.HttpResponse:
                return func.HttpResponse("ok")
            """,
            host_json='{"version": "2.0", "extensions": {"serviceBus": {"maxConcurrentCalls": "lots"}}}',
        )
    )
    assert line.startswith("devstack.host: cannot start: ValueError: ")
    assert "--log-level DEBUG" in line


def test_a_well_formed_app_loads(tmp_path: Path) -> None:
    """The control: the same checks let a correct app through (it starts, then is stopped)."""
    (tmp_path / "function_app.py").write_text(
        HEAD
        + textwrap.dedent(
            """
            @app.route(route="start")
            @app.durable_client_input(client_name="client")
            async def start(req: func.HttpRequest, client) -> func.HttpResponse:
                return func.HttpResponse("ok")
            """
        )
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devstack.host",
            "--app-dir",
            str(tmp_path),
            "--data-dir",
            str(tmp_path / "hub"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "devstack.host ready:" in line, (
            proc.stderr.read() if proc.poll() is not None else line
        )
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_batch_of_builtin_list_is_refused_as_the_library_refuses_it(tmp_path: Path) -> None:
    """The library's Service Bus converter takes `typing.List[func.ServiceBusMessage]` for a
    batch and not `list[...]`, so the worker refuses the function at load; so does the host."""
    line = refusal(
        run_host(
            tmp_path,
            """
            @app.service_bus_queue_trigger(
                arg_name="msgs", queue_name="q", connection="ServiceBusConnection", cardinality="many"
            )
            def on_batch(msgs: list[func.ServiceBusMessage]) -> None:
                pass
            """,
        )
    )
    assert line == (
        "devstack.host: cannot load the on_batch function: type of msgs binding in function.json "
        '"serviceBusTrigger" does not match its Python annotation "list"'
    )

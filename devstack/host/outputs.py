"""Storage queue output bindings (`@app.queue_output`), on any function.

As in the worker, a named output is a `func.Out` parameter the function may `set`, and
an output named `$return` takes the return value; the value is encoded by the library's
own `QueueMessageOutConverter` (a str, bytes, a QueueMessage, or a list of them for
several messages). As in the host, the messages are sent only after the function
succeeds, to a queue created if missing, base64-encoded unless host.json
`queues.messageEncoding` is `none`.
"""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any

from azure.core.exceptions import ResourceExistsError
from azure.functions import Out
from azure.functions.queue import QueueMessageOutConverter
from azure.storage.queue.aio import QueueClient

from .app import FunctionSpec
from .config import resolve_binding_expression, setting

QUEUE_OUTPUT = "queue"


class OutParam(Out[Any]):
    """The worker's `func.Out` implementation: holds what the function sets."""

    def __init__(self) -> None:
        self._value: Any = None

    def set(self, val: Any) -> None:
        self._value = val

    def get(self) -> Any:
        return self._value


def queue_outputs(spec: FunctionSpec) -> list[dict[str, Any]]:
    return [
        b
        for b in spec.bindings
        if b.get("type") == QUEUE_OUTPUT and str(b.get("direction")).upper() == "OUT"
    ]


def _messages(value: Any) -> list[bytes]:
    datum = QueueMessageOutConverter.encode(value, expected_type=None)
    if datum.type == "string":
        return [str(datum.value).encode()]
    if datum.type == "bytes":
        return [bytes(datum.value)]
    items = json.loads(datum.value)
    if isinstance(items, dict):  # one QueueMessage
        items = [items]
    return [(i["body"] if isinstance(i, dict) else str(i)).encode() for i in items]


class QueueOutputSender:
    def __init__(self, message_encoding: str) -> None:
        self.message_encoding = message_encoding
        self._created: set[tuple[str, str]] = set()
        # By function name: a sender serves one host's app, whose names are unique.
        self._outputs: dict[str, list[dict[str, Any]]] = {}

    def outputs_of(self, spec: FunctionSpec) -> list[dict[str, Any]]:
        """`queue_outputs(spec)`, found once per function (each invocation asks)."""
        found = self._outputs.get(spec.name)
        if found is None:
            found = self._outputs[spec.name] = queue_outputs(spec)
        return found

    def check(self, spec: FunctionSpec) -> None:
        """Resolve names and settings at start, so a missing one stops the host in one line."""
        for b in queue_outputs(spec):
            self._target(spec, b)

    def _target(self, spec: FunctionSpec, binding: dict[str, Any]) -> tuple[str, str]:
        queue = resolve_binding_expression(
            str(binding["queueName"]), purpose=f"output queue of function {spec.name}"
        ).lower()
        connection = setting(
            binding.get("connection") or "AzureWebJobsStorage",
            purpose=f"Storage connection of the output queue of function {spec.name}",
        )
        return connection, queue

    def prepare(self, spec: FunctionSpec) -> dict[str, OutParam]:
        return {b["name"]: OutParam() for b in self.outputs_of(spec) if b["name"] != "$return"}

    async def send(self, spec: FunctionSpec, outs: dict[str, OutParam], returned: Any) -> None:
        for b in self.outputs_of(spec):
            value = returned if b["name"] == "$return" else outs[b["name"]].get()
            if value is None:
                continue
            connection, queue = self._target(spec, b)
            async with QueueClient.from_connection_string(connection, queue) as client:
                if (connection, queue) not in self._created:
                    with contextlib.suppress(ResourceExistsError):
                        await client.create_queue()
                    self._created.add((connection, queue))
                for body in _messages(value):
                    text = (
                        base64.b64encode(body).decode()
                        if self.message_encoding == "base64"
                        else body.decode()
                    )
                    await client.send_message(text)

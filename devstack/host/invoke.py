"""Call a user function the way the Python worker does: bind parameters by name, await
coroutines on the host's loop, run plain functions on a thread."""

from __future__ import annotations

import asyncio
import functools
import uuid
from typing import Any

import azure.functions as func

from .app import FunctionSpec


class InvocationContext(func.Context):
    """The `context` parameter (func.Context) a worker passes when a function asks for it."""

    def __init__(self, function_name: str) -> None:
        self._invocation_id = str(uuid.uuid4())
        self._function_name = function_name

    @property
    def invocation_id(self) -> str:
        return self._invocation_id

    @property
    def thread_local_storage(self) -> Any:
        return None

    @property
    def function_name(self) -> str:
        return self._function_name

    @property
    def function_directory(self) -> str:
        return ""

    @property
    def trace_context(self) -> Any:
        return None

    @property
    def retry_context(self) -> Any:
        return None


_output_sender: Any = None


def set_output_sender(sender: Any) -> None:
    """The host's queue-output sender (outputs.QueueOutputSender), used by every invocation."""
    global _output_sender
    _output_sender = sender


async def call_function(spec: FunctionSpec, kwargs: dict[str, Any]) -> Any:
    """Invoke `spec` with `kwargs` plus the `context` parameter if it declares one, and
    its output-binding parameters; after success, send what it output."""
    if "context" in spec.params and "context" not in kwargs:
        kwargs["context"] = InvocationContext(spec.name)
    outs = _output_sender.prepare(spec) if _output_sender is not None else {}
    kwargs.update(outs)
    if spec.is_async:
        result = await spec.func(**kwargs)
    else:
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(None, functools.partial(spec.func, **kwargs))
    if _output_sender is not None:
        await _output_sender.send(spec, outs, result)
    return result

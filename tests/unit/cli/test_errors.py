"""Mistakes an operator makes end with one clear line, not a traceback."""

from __future__ import annotations

import io
import sys

import pytest
from rich.console import Console

import cli.__main__ as tool

ENV = {
    "CosmosDbConnection": "AccountEndpoint=https://127.0.0.1:1/;AccountKey=a2V5",
    "ServiceBusConnection": "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=x;SharedAccessKey=y;UseDevelopmentEmulator=true",
    "REPLY_QUEUE_REGISTRY": '{"webshop": "replies-webshop"}',
}


def run(monkeypatch, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    monkeypatch.setattr(tool, "console", Console(file=out, width=300))
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "argv", ["cli", *argv])
    code = tool.main()
    return code, out.getvalue()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["show", "ORD-1\n"], "order key 'ORD-1\\n' must be"),
        (["resubmit", "[/]"], "order key '[/]' must be"),
        (["compensate", "a/b"], "order key 'a/b' must be"),
        (["deadletters", "Orders/../x"], "is not a queue name"),
        (["post", "--file", "/nonexistent/orders.json"], "no such file: /nonexistent/orders.json"),
    ],
)
def test_one_line_errors(monkeypatch, argv, expected):
    code, text = run(monkeypatch, *argv)
    assert code == 1
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert lines[0].startswith("error: "), text
    assert expected.replace("\\\\", "\\") in lines[0]

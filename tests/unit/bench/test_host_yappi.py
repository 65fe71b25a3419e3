"""bench/host_yappi.py: each owner's CPU from a yappi profile, the standard library's time
given to the functions that called it."""

from __future__ import annotations

import pytest

from bench.host_yappi import owner, shares

HOST = "/repo/devstack/host/store.py"
PRODUCT = "/repo/domain/state_machine.py"
JSON = "/usr/lib/python3.11/json/encoder.py"
SQLITE = "~"


def test_owners_by_file() -> None:
    assert owner((HOST, 1, "Store.tx")) == "local host:store.py:Store.tx"
    assert owner((PRODUCT, 1, "advance")) == "product"
    assert owner(("/v/lib/python3.11/site-packages/azure/cosmos/x.py", 1, "f")) == (
        "azure-cosmos SDK"
    )
    assert owner(("/usr/lib/python3.11/asyncio/events.py", 1, "run")) == "asyncio"
    assert owner((JSON, 1, "encode")) is None
    assert owner(("/v/lib/python3.11/site-packages/orjson/__init__.py", 1, "dumps")) is None


def test_the_standard_librarys_time_goes_to_its_callers_in_proportion() -> None:
    host, product = (HOST, 1, "Store.tx"), (PRODUCT, 1, "advance")
    encode = (JSON, 1, "encode")
    execute = (SQLITE, 0, "<method 'execute' of 'sqlite3.Connection' objects>")
    # pstats rows: (primitive calls, calls, own time, cumulative time, callers) where a
    # caller's entry holds that caller's calls, own and cumulative time spent in the callee.
    stats = {
        host: (1, 1, 1.0, 4.0, {}),
        product: (1, 1, 2.0, 4.0, {}),
        # encode: 3 s own, called by the host (1 s of it) and the product (2 s)
        encode: (3, 3, 3.0, 3.0, {host: (1, 1, 1.0, 1.0), product: (2, 2, 2.0, 2.0)}),
        # execute, called only through encode (made up): follows encode's split
        execute: (1, 1, 0.6, 0.6, {encode: (1, 1, 0.6, 0.6)}),
    }
    seconds = shares(stats)
    assert seconds["local host:store.py:Store.tx"] == pytest.approx(1.0 + 1.0 + 0.2)
    assert seconds["product"] == pytest.approx(2.0 + 2.0 + 0.4)
    assert sum(seconds.values()) == pytest.approx(1.0 + 2.0 + 3.0 + 0.6)


def test_time_with_no_owned_caller_is_counted_apart() -> None:
    lone = (JSON, 2, "decode")
    assert shares({lone: (1, 1, 0.5, 0.5, {})}) == {"standard library, no owner found": 0.5}

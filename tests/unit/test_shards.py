"""Shards (docs/adr/020e-task-hub-shards.md): the hash every client and shard
computes, the settings that name a deployment's shard, and Submit's refusal of
another shard's order."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from adapters.settings import SettingsError, load_settings
from adapters.settlement import SettleKind
from domain.shards import main, shard_of
from tests.unit.submit.test_handler import ENV, Rig


def test_the_shard_is_sha256_of_app_and_order_id_first_8_bytes_mod_n():
    # Written out, so that a client in another language can check its port.
    digest = hashlib.sha256(b"webshop:ORD-1").digest()
    assert shard_of("webshop", "ORD-1", 4) == int.from_bytes(digest[:8], "big") % 4 == 1
    assert [shard_of("webshop", f"ORD-{i}", 4) for i in range(8)] == [
        int.from_bytes(hashlib.sha256(f"webshop:ORD-{i}".encode()).digest()[:8], "big") % 4
        for i in range(8)
    ]


def test_one_shard_owns_everything_and_the_application_is_part_of_the_hash():
    assert {shard_of("webshop", f"O-{i}", 1) for i in range(100)} == {0}
    differs = [
        i
        for i in range(100)
        if shard_of("webshop", f"O-{i}", 7) != shard_of("partner", f"O-{i}", 7)
    ]
    assert differs  # two applications' orders with one OrderID are two orders


def test_orders_spread_over_the_shards():
    counts = Counter(shard_of("webshop", f"ORD-{i}", 4) for i in range(4000))
    assert set(counts) == {0, 1, 2, 3}
    assert max(counts.values()) < 1.1 * min(counts.values())


@pytest.mark.parametrize("count", [0, 1000])
def test_a_count_out_of_range_is_refused(count):
    with pytest.raises(ValueError, match="1 to 999"):
        shard_of("webshop", "ORD-1", count)


def test_the_command_prints_the_shard(capsys):
    assert main(["--count", "4", "webshop", "ORD-1"]) == 0
    assert capsys.readouterr().out == "1\n"
    assert main(["--count", "4", "webshop", "no/slash"]) == 2


def test_settings_default_to_one_deployment():
    cfg = load_settings(ENV)
    assert (cfg.shard_count, cfg.shard_index) == (1, 0)
    cfg = load_settings({**ENV, "SHARD_COUNT": "4", "SHARD_INDEX": "3"})
    assert (cfg.shard_count, cfg.shard_index) == (4, 3)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"SHARD_COUNT": "4", "SHARD_INDEX": "4"}, "SHARD_INDEX must be below SHARD_COUNT"),
        ({"SHARD_INDEX": "1"}, "SHARD_INDEX must be below SHARD_COUNT"),
        ({"SHARD_COUNT": "0"}, "SHARD_COUNT"),
        ({"SHARD_COUNT": "1000"}, "SHARD_COUNT must be 1 to 999"),
        ({"SHARD_COUNT": "two"}, "SHARD_COUNT"),
    ],
)
def test_bad_shard_settings_are_refused_by_name(env, says):
    with pytest.raises(SettingsError, match=says):
        load_settings({**ENV, **env})


async def test_submit_refuses_another_shards_order_and_writes_nothing():
    rig = Rig(SHARD_COUNT="4", SHARD_INDEX="0")  # ORD-1 of webshop is shard 1's
    outcome = await rig.submit()
    assert outcome.kind is SettleKind.DEAD_LETTER
    assert outcome.reason == "WrongShard"
    assert "shard 1 of 4" in outcome.description
    assert "this is shard 0" in outcome.description
    assert rig.actions.calls == [("deadletter", "WrongShard", outcome.description)]
    assert not rig.store.docs
    assert not rig.orders.orders
    assert rig.statuses() == []
    assert [a["Kind"] for a in rig.alert_bodies()] == ["WrongShard"]


async def test_submit_accepts_its_own_shards_order():
    rig = Rig(SHARD_COUNT="4", SHARD_INDEX="1")
    outcome = await rig.submit()
    assert outcome.kind is SettleKind.COMPLETE
    assert rig.store.docs
    assert rig.statuses() == ["Received"]


def test_devstack_up_shard_names_the_shard_and_its_own_task_hub():
    from devstack.__main__ import shard_overrides

    assert shard_overrides("1/2") == {
        "SHARD_COUNT": "2",
        "SHARD_INDEX": "1",
        "TASKHUB_NAME": "OrderProcessingS1",
    }
    for bad in ("2/2", "1", "a/2", "0/0"):
        with pytest.raises(ValueError, match=r"INDEX/COUNT|numbered|1 to 999"):
            shard_overrides(bad)

"""Submit's registration: one function per client application, on that
application's ingress queue, with the Durable client its fast path needs."""

from __future__ import annotations

import json

import azure.durable_functions as df
import pytest

import bootstrap
from adapters.settings import SettingsError, ingress_queues
from triggers.submit import function_name, register

REGISTRY = json.dumps({"webshop": "replies-webshop", "partner-portal": "replies-partner-portal"})


def bindings(queues: dict[str, str]) -> dict[str, dict[str, tuple]]:
    bp = df.Blueprint()
    register(bp, queues, bootstrap.build())
    app = df.DFApp()
    app.register_functions(bp)
    return {
        f.get_function_name(): {
            b.type: (b.name, getattr(b, "queue_name", None)) for b in f.get_bindings()
        }
        for f in app.get_functions()
    }


def test_one_function_per_application_on_its_own_queue():
    found = bindings({"webshop": "orders-webshop", "partner-portal": "orders-partner-portal"})
    assert found == {
        "submit_order_webshop": {
            "serviceBusTrigger": ("message", "orders-webshop"),
            "durableClient": ("client", None),
        },
        "submit_order_partner-portal": {
            "serviceBusTrigger": ("message", "orders-partner-portal"),
            "durableClient": ("client", None),
        },
    }


def test_names_are_stable_and_unique_for_ids_a_host_would_refuse():
    assert function_name("webshop") == "submit_order_webshop"
    odd = [function_name(a) for a in ("a.b", "a_b", "a b", "a/b")]
    assert len(set(odd)) == 4
    assert odd[1] == "submit_order_a_b"
    assert all(n.replace("_", "").replace("-", "").isalnum() for n in odd)
    assert function_name("a.b") == function_name("a.b")


def test_ingress_queues_default_to_orders_app_for_every_registered_application():
    assert ingress_queues({"REPLY_QUEUE_REGISTRY": REGISTRY}) == {
        "webshop": "orders-webshop",
        "partner-portal": "orders-partner-portal",
    }
    assert ingress_queues(
        {"REPLY_QUEUE_REGISTRY": REGISTRY, "ORDER_INGRESS_QUEUES": '{"webshop": "in-ws"}'}
    ) == {"webshop": "in-ws"}
    assert ingress_queues({}) == {}


@pytest.mark.parametrize("raw", ["nope", "[]", '{"a": 1}', '{"a": ""}', '{"a": "q", "b": "q"}'])
def test_a_malformed_ingress_setting_stops_the_app_loading(raw):
    with pytest.raises(SettingsError):
        ingress_queues({"ORDER_INGRESS_QUEUES": raw})

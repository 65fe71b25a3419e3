"""The trigger's registration: the host reads these bindings, so a wrong
queue, connection or settlement mode would only show up in Azure."""

from __future__ import annotations

import inspect

import azurefunctions.extensions.bindings.servicebus as servicebus

import bootstrap
from triggers.agents import blueprint

bp = blueprint(bootstrap.build())


def built_functions():
    return {fn.get_function_name(): fn for fn in (b.build() for b in bp._function_builders)}


def test_the_agent_trigger_listens_on_agent_requests_with_manual_settlement():
    function = built_functions()["agent_requests"]
    [binding] = function.get_bindings_dict()["bindings"]

    assert binding["type"] == "serviceBusTrigger"
    assert binding["queueName"] == "agent-requests"
    assert binding["connection"] == "ServiceBusConnection"
    assert binding["autoCompleteMessages"] is False


def test_the_trigger_asks_for_sdk_types_so_it_can_settle_by_hand():
    user_function = built_functions()["agent_requests"].get_user_function()
    parameters = inspect.signature(user_function).parameters

    assert parameters["message"].annotation is servicebus.ServiceBusReceivedMessage
    assert parameters["message_actions"].annotation is servicebus.ServiceBusMessageActions
    assert inspect.iscoroutinefunction(user_function)

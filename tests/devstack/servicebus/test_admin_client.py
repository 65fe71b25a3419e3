"""`ServiceBusAdministrationClient` is not served: the emulator answers its
HTTPS requests, on the AMQP port, with a 501 that names the feature, rather
than an AMQP header the SDK reports as an SSL error."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import warnings

import pytest
from azure.core.exceptions import HttpResponseError, ServiceRequestError
from azure.servicebus.management import ServiceBusAdministrationClient

from devstack.servicebus.http_refusal import FEATURE
from tests.fixtures.servicebus import EmulatorProcess

pytestmark = pytest.mark.integration


def test_the_sdk_surfaces_the_refusal_naming_the_feature(emulator: EmulatorProcess):
    # The certificate is self-signed, so the message shows once verification is off.
    with (
        warnings.catch_warnings(),
        ServiceBusAdministrationClient.from_connection_string(
            emulator.connection_string, connection_verify=False, retry_total=0
        ) as admin,
    ):
        warnings.simplefilter("ignore")
        with pytest.raises(HttpResponseError) as caught:
            admin.get_queue("basic")
    assert caught.value.status_code == 501
    assert "ServiceBusAdministrationClient" in str(caught.value)
    assert "is not supported by the local Service Bus emulator" in str(caught.value)


def test_with_verification_on_the_log_names_the_feature(emulator: EmulatorProcess):
    with (
        ServiceBusAdministrationClient.from_connection_string(
            emulator.connection_string, retry_total=0
        ) as admin,
        pytest.raises(ServiceRequestError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        admin.list_queues().next()
    # The emulator sees the client leave a moment after the client raised.
    deadline = time.monotonic() + 15
    while "TLS handshake" not in emulator.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    log = emulator.log_path.read_text()
    assert "an HTTPS client left during the TLS handshake" in log
    assert FEATURE in log


def test_plain_http_gets_the_same_answer(emulator: EmulatorProcess):
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"http://{emulator.host}:{emulator.port}/basic", timeout=10)
    assert caught.value.code == 501
    assert "ServiceBusAdministrationClient" in caught.value.read().decode()


def test_amqp_clients_are_unaffected(client):
    from azure.servicebus import ServiceBusMessage

    with client.get_queue_sender("admin-refusal") as sender:
        sender.send_messages(ServiceBusMessage("after-http", message_id="after-http"))
    with client.get_queue_receiver("admin-refusal", max_wait_time=5) as receiver:
        got = receiver.receive_messages(max_message_count=10)
        for message in got:
            receiver.complete_message(message)
    assert "after-http" in {m.message_id for m in got}

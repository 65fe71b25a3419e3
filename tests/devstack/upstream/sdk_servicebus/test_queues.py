#-------------------------------------------------------------------------
# Copyright (c) Microsoft Corporation. All rights reserved.
# Licensed under the MIT License. See License.txt in the project root for
# license information.
#--------------------------------------------------------------------------

# Copied from Azure/azure-sdk-for-python at 6f80901af6cd4a0c0f3282b7bccfcad9540744d3,
# sdk/servicebus/azure-servicebus/tests/test_queues.py (see SOURCE.md). The test methods
# are unchanged; only the harness imports below differ: the preparers come from
# preparers.py, which takes the connection string and queue from the local emulator.

import logging
import pytest

from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
)

from .preparers import AzureMgmtTestCase, CachedResourceGroupPreparer
from .preparers import CachedServiceBusNamespacePreparer, ServiceBusQueuePreparer
from .preparers import get_logger

_logger = get_logger(logging.DEBUG)


class ServiceBusQueueTests(AzureMgmtTestCase):

    @pytest.mark.liveTest
    @pytest.mark.live_test_only
    @CachedResourceGroupPreparer(name_prefix='servicebustest')
    @CachedServiceBusNamespacePreparer(name_prefix='servicebustest')
    @ServiceBusQueuePreparer(name_prefix='servicebustest', dead_lettering_on_message_expiration=True)
    def test_queue_message_settle_through_mgmt_link_due_to_broken_receiver_link(self, servicebus_namespace_connection_string, servicebus_queue, **kwargs):
        with ServiceBusClient.from_connection_string(
                servicebus_namespace_connection_string,
                logging_enable=False) as sb_client:

            with sb_client.get_queue_sender(servicebus_queue.name) as sender:
                message = ServiceBusMessage("Test")
                sender.send_messages(message)

            with sb_client.get_queue_receiver(servicebus_queue.name) as receiver:
                messages = receiver.receive_messages(max_wait_time=5)
                receiver._handler._link.detach()  # destroy the underlying receiver link
                assert len(messages) == 1
                receiver.complete_message(messages[0])

# -------------------------------------------------------------------------
# Copyright (c) Microsoft Corporation. All rights reserved.
# Licensed under the MIT License. See License.txt in the project root for
# license information.
# --------------------------------------------------------------------------

# Copied from Azure/azure-sdk-for-python at 05707dc75c7eebb29bb1ad14c9ae0650e2be8c28,
# sdk/servicebus/azure-servicebus/tests/utilities.py (see SOURCE.md): the helpers the
# copied tests use, unchanged. Left out: its uamqp switches, and `get_logger`, which
# puts the whole `azure` logger at DEBUG with a stdout handler for the process (here, an
# xdist worker running the rest of the suite too); preparers.get_logger stands in for it.

import time

from azure.servicebus._common.utils import utc_now


def print_message(_logger, message):
    _logger.info(f"Receiving: {message}")
    _logger.debug(f"Time to live: {message.time_to_live}")
    _logger.debug(f"Sequence number: {message.sequence_number}")
    _logger.debug(f"Enqueue Sequence numger: {message.enqueued_sequence_number}")
    _logger.debug(f"Partition Key: {message.partition_key}")
    _logger.debug(f"Application Properties: {message.application_properties}")
    _logger.debug(f"Delivery count: {message.delivery_count}")
    try:
        _logger.debug(f"Locked until: {message.locked_until_utc}")
        _logger.debug(f"Lock Token: {message.lock_token}")
    except (TypeError, AttributeError):
        pass
    _logger.debug(f"Enqueued time: {message.enqueued_time_utc}")


def sleep_until_expired(entity):
    time.sleep(max(0, (entity.locked_until_utc - utc_now()).total_seconds() + 1))

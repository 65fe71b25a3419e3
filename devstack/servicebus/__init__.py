"""A local Service Bus emulator: a broker that speaks the Service Bus dialect
of AMQP 1.0 so the real azure-servicebus SDK (>= 7.15) runs against it
unchanged, on machines without Docker. See docs/servicebus-emulator.md.

Modules: `config` (Config.json), `codec` (wire format), `entities` (queues,
topics, subscriptions, sessions, locks, dead-lettering, forwarding and the
other broker rules), `filters` (subscription rules: SQL and correlation
filters, rule actions), `management` ($management operations), `protocol`
(one AMQP connection), `journal` (SQLite persistence), `server` (the process).
"""

from .config import QueueSettings, TopicSettings, load_config, parse_config
from .server import EmulatorServer

__all__ = ["EmulatorServer", "QueueSettings", "TopicSettings", "load_config", "parse_config"]

#: Connection string of the emulator on a port (any key works: the emulator does not authenticate).
CONNECTION_STRING_TEMPLATE = (
    "Endpoint=sb://{host}:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
    "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
)

"""The local Cosmos DB server: @vercel/cosmosdb-server 1.0.1 behind a small
launcher that patches the bugs we rely on not having (docs/cosmos-server.md)
and can inject faults, such as throttling, on request.

    python -m devstack.cosmos --port 8081     # serve until stopped

Tests and tools use `start_server()` / `CosmosServer` from here, and
`set_faults()` / `clear_faults()` to throttle the store."""

from devstack.cosmos.faults import FaultRule, clear_faults, get_faults, set_faults
from devstack.cosmos.server import (
    LOCAL_KEY,
    CosmosServer,
    ServerStartError,
    launcher_command,
    start_server,
)

__all__ = [
    "LOCAL_KEY",
    "CosmosServer",
    "FaultRule",
    "ServerStartError",
    "clear_faults",
    "get_faults",
    "launcher_command",
    "set_faults",
    "start_server",
]

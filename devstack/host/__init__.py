"""devstack.host: a stand-in for the Azure Functions host and its Durable extension.

Runs the app's own `function_app.py` unchanged: it reads the registered functions
from the app object, fires Service Bus and timer triggers, runs orchestrations
through the Durable SDK's replay engine from a persisted history, and serves the
Durable HTTP API the `DurableOrchestrationClient` calls. See docs/local-host.md.
"""

from .app import AppCatalog, FunctionSpec, index_app, load_app
from .errors import HostError, NonDeterminismError
from .replay import EpisodeResult, run_episode
from .runtime import Host, HostOptions

__all__ = [
    "AppCatalog",
    "EpisodeResult",
    "FunctionSpec",
    "Host",
    "HostError",
    "HostOptions",
    "NonDeterminismError",
    "index_app",
    "load_app",
    "run_episode",
]

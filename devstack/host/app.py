"""Load the app object and read its functions, the way the Python worker indexes them.

The only list of functions is the one the app registers on its `FunctionApp`/`DFApp`
(blueprints included): `app.get_functions()` gives each function's name, trigger and
bindings exactly as the worker would send them to the host.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import azure.functions as func

from .errors import HostError
from .indexing import check_function

ORCHESTRATION_TRIGGER = "orchestrationTrigger"
ACTIVITY_TRIGGER = "activityTrigger"
ENTITY_TRIGGER = "entityTrigger"
SERVICE_BUS_TRIGGER = "serviceBusTrigger"
TIMER_TRIGGER = "timerTrigger"
HTTP_TRIGGER = "httpTrigger"
QUEUE_TRIGGER = "queueTrigger"
HTTP_OUTPUT = "http"
DURABLE_CLIENT = "durableClient"

SUPPORTED_TRIGGERS = {
    ORCHESTRATION_TRIGGER,
    ACTIVITY_TRIGGER,
    SERVICE_BUS_TRIGGER,
    TIMER_TRIGGER,
    HTTP_TRIGGER,
    ENTITY_TRIGGER,
    QUEUE_TRIGGER,
}


@dataclass
class FunctionSpec:
    """One registered function, as the host sees it.

    Attributes:
        name: the function name (``function_name`` setting or the Python name).
        trigger_type: binding type of the trigger (``serviceBusTrigger``, ...).
        trigger: the trigger binding's JSON form (``queueName``, ``schedule``, ...).
        bindings: every binding's JSON form, trigger included.
        func: the callable the worker would invoke (DF middleware included).
        is_async: whether ``func`` is a coroutine function.
        params: the callable's parameters, name -> annotation.
    """

    name: str
    trigger_type: str
    trigger: dict[str, Any]
    bindings: list[dict[str, Any]]
    func: Callable[..., Any]
    is_async: bool
    params: dict[str, Any] = field(default_factory=dict)

    def binding_of(self, binding_type: str) -> dict[str, Any] | None:
        for b in self.bindings:
            if b.get("type") == binding_type:
                return b
        return None

    @functools.cached_property
    def durable_client_param(self) -> str | None:
        """The durable client parameter's name (asked at every invocation; the bindings
        are fixed once the app is indexed)."""
        b = self.binding_of(DURABLE_CLIENT)
        return b["name"] if b else None

    @property
    def activity_name(self) -> str:
        return self.trigger.get("activity") or self.name

    @property
    def orchestration_name(self) -> str:
        return self.trigger.get("orchestration") or self.name


@dataclass
class AppCatalog:
    """The functions of one app, indexed by what the host needs to find them by."""

    functions: list[FunctionSpec]

    def of_type(self, trigger_type: str) -> list[FunctionSpec]:
        return [f for f in self.functions if f.trigger_type == trigger_type]

    def orchestrator(self, name: str) -> FunctionSpec | None:
        return self._by_name[ORCHESTRATION_TRIGGER].get(fold_name(name))

    def activity(self, name: str) -> FunctionSpec | None:
        return self._by_name[ACTIVITY_TRIGGER].get(fold_name(name))

    @cached_property
    def _by_name(self) -> dict[str, dict[str, FunctionSpec]]:
        """Orchestrators and activities by folded name (the orchestration/activity name of
        the trigger, and the function name), first registration first; built once, as a
        lookup runs for every episode and activity."""
        index: dict[str, dict[str, FunctionSpec]] = {}
        for kind in (ORCHESTRATION_TRIGGER, ACTIVITY_TRIGGER):
            table = index[kind] = {}
            for f in self.of_type(kind):
                own = f.orchestration_name if kind == ORCHESTRATION_TRIGGER else f.activity_name
                for name in (own, f.name):
                    table.setdefault(fold_name(name), f)
        return index


@lru_cache(maxsize=4096)
def fold_name(name: str) -> str:
    """A function name as the host compares it: the Durable extension's `FunctionName` is
    equal under `StringComparison.OrdinalIgnoreCase` (and the host's function table is
    keyed the same way), so `call_activity('Hello')` runs the activity `hello`.
    OrdinalIgnoreCase upper-cases each character on its own (simple case mapping): a
    character whose upper case is several characters (ß) stays as it is."""
    return "".join(u if len(u := c.upper()) == 1 else c for c in name)


def _binding_json(binding: Any) -> dict[str, Any]:
    import json

    from azure.functions.decorators.utils import StringifyEnumJsonEncoder

    return json.loads(json.dumps(binding.get_dict_repr(), cls=StringifyEnumJsonEncoder))


def _parameters(fn: Callable[..., Any]) -> dict[str, Any]:
    """Parameter name -> annotation, resolving string annotations (``from __future__ import
    annotations``) the way the worker does; an unresolvable one stays a string."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return {}
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    return {p.name: hints.get(p.name, p.annotation) for p in sig.parameters.values()}


def load_app(spec: str, app_dir: str | None = None) -> Any:
    """Import ``module`` or ``module:attribute`` and return the app object. Without an
    attribute the module is searched as the Python worker searches function_app.py
    (azure_functions_worker/loader.py, `index_function_app`): its one top-level
    FunctionApp/DFApp/Blueprint-registering object, whatever its name (`app`, `myApp`)."""
    module_name, _, attr = spec.partition(":")
    if app_dir:
        sys.path.insert(0, str(Path(app_dir).resolve()))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the app's own import error, reported in one line
        raise HostError(
            f"cannot import app module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if not attr:
        return _the_app_of(module)
    try:
        app = getattr(module, attr)
    except AttributeError:
        raise HostError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(app, func.FunctionRegister):
        raise HostError(
            f"{spec} is a {type(app).__name__}, not an azure.functions FunctionApp/DFApp"
        )
    return app


def _the_app_of(module: Any) -> Any:
    """The module's one top-level function app, as the worker finds it: an error when it
    has none or more than one (the worker's own wording)."""
    found = [
        (name, value)
        for name in dir(module)
        if isinstance(value := getattr(module, name, None), func.FunctionRegister)
    ]
    if not found:
        raise HostError(
            f"Could not find top level function app instances in {module.__name__}.py "
            "(no FunctionApp/DFApp object at its top level)"
        )
    if len({id(value) for _, value in found}) > 1:
        names = ", ".join(name for name, _ in found)
        raise HostError(
            f"More than one {type(found[0][1]).__name__} or other top level function app "
            f"instances are defined in {module.__name__}.py: {names}"
        )
    return found[0][1]


# One catalog per app object: `get_functions()` is not idempotent (a second
# call on the same app finds every function name twice and raises, and the
# worker only ever calls it once), while two parts of one process may both
# want the catalog (a test, then the simulation). The catalog lives on the app
# object, and goes with it: a module-level cache kept every app a process ever
# built (the simulation builds one per host per schedule: 3.4 GB after 5,000
# schedules, each slower than the last as the garbage collector walked them).
_CATALOG_ATTRIBUTE = "_devstack_catalog"


def index_app(app: Any) -> AppCatalog:
    """Read the registered functions and their bindings from the app object
    (once per app object: later calls return the same catalog)."""
    hit = getattr(app, _CATALOG_ATTRIBUTE, None)
    if isinstance(hit, AppCatalog):
        return hit
    catalog = _index(app)
    setattr(app, _CATALOG_ATTRIBUTE, catalog)
    return catalog


def _index(app: Any) -> AppCatalog:
    functions: list[FunctionSpec] = []
    seen: set[str] = set()
    for fn in app.get_functions():
        trigger = fn.get_trigger()
        if trigger is None:
            raise HostError(f"function {fn.get_function_name()} has no trigger")
        bindings = [_binding_json(b) for b in fn.get_bindings()]
        trigger_json = _binding_json(trigger)
        name = fn.get_function_name()
        if name in seen:
            raise HostError(f"function name {name!r} is registered twice")
        seen.add(name)
        check_function(fn)  # the worker's FunctionLoadError checks, before anything runs
        user_fn = fn.get_user_function()
        params = _parameters(user_fn)
        functions.append(
            FunctionSpec(
                name=name,
                trigger_type=trigger_json["type"],
                trigger=trigger_json,
                bindings=bindings,
                func=user_fn,
                is_async=inspect.iscoroutinefunction(user_fn),
                params=params,
            )
        )
    return AppCatalog(functions)

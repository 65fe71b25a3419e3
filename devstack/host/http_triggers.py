"""HTTP triggers: the app's `@app.route` functions served on the host's own origin.

The real host serves HTTP functions and the Durable webhooks on one port, under the
route prefix of host.json (`extensions.http.routePrefix`, default `api`). This module
turns each function's route template (ASP.NET Core syntax: `{name}`, `{name?}`,
`{name:int}`, `{name=default}`, `{*rest}`) into a matcher, builds the
`func.HttpRequest` the worker would build, invokes the function, and turns its return
value into the response through the library's own `HttpResponseConverter`, as the
worker does.

Authorization: Core Tools, when it runs an app locally, does not check keys (its
`CliAuthenticationHandler` authenticates every request as admin unless `func start
--enableAuth`), so `authLevel` is read but not enforced here either; see
docs/local-host.md.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import azure.functions as func
from aiohttp import web
from azure.functions.http import HttpResponseConverter
from multidict import CIMultiDict

from .app import FunctionSpec
from .config import resolve_binding_expression
from .errors import HostError
from .invoke import call_function

log = logging.getLogger("devstack.host.http")

# ASP.NET Core inline route constraints the host's routes use most; others match any segment.
_CONSTRAINTS = {
    "int": r"-?\d+",
    "long": r"-?\d+",
    "bool": r"(?i:true|false)",
    "alpha": r"[A-Za-z]+",
    "guid": r"[0-9A-Fa-f]{8}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{12}",
    "double": r"-?\d+(?:\.\d+)?",
    "float": r"-?\d+(?:\.\d+)?",
    "decimal": r"-?\d+(?:\.\d+)?",
    "datetime": r"[^/]+",
}
_PARAM = re.compile(r"\{([^{}]+)\}")
_ENCODED_SLASH = re.compile(r"(%2[Ff])")


def routing_path(raw_path: str) -> str:
    """The request path as the host routes on it: percent-escapes decoded, except `%2F`.

    Core Tools serves on Kestrel, which decodes the path before routing but leaves an
    encoded slash as written (aspnet/KestrelHttpServer#124), so `%2F` never separates
    segments: `/api/orders/a%2Fb` matches `orders/{id}`, and ASP.NET routing does not
    decode route values, so `id` is `a%2Fb` (aspnet/Mvc#6388, dotnet/aspnetcore#4718).
    Locally such a request works; deployed, the front end decodes `%2F` first and the same
    request gets a 404 (azure-functions-host#3998, #9290, Azure/Azure-Functions#1468).
    """
    return "".join(
        part if _ENCODED_SLASH.fullmatch(part) else unquote(part)
        for part in _ENCODED_SLASH.split(raw_path)
    )


@dataclass
class HttpRoute:
    """One HTTP function's route, compiled."""

    spec: FunctionSpec
    template: str
    methods: set[str] | None  # None: every method
    regex: re.Pattern[str]
    defaults: dict[str, str]
    literals: int  # literal segments: more literals take precedence, as in ASP.NET routing
    params: int
    catch_all: bool

    def match(self, path: str) -> dict[str, str] | None:
        m = self.regex.fullmatch(path)
        if m is None:
            return None
        values = {k: v for k, v in m.groupdict().items() if v is not None}
        return {**self.defaults, **values}


def _param_regex(body: str, defaults: dict[str, str]) -> tuple[str, str, bool, bool]:
    """`name[:constraint][?|=default]` -> (group name, pattern, optional, catch-all)."""
    catch_all = body.startswith("*")
    body = body.lstrip("*")
    optional = body.endswith("?")
    body = body.rstrip("?")
    name, _, default = body.partition("=")
    name, *constraints = name.split(":")
    if default:
        defaults[name] = default
        optional = True
    pattern = ".*" if catch_all else "[^/]+"
    for c in constraints:
        c_name = c.split("(")[0].lower()
        if c_name in _CONSTRAINTS and not catch_all:
            pattern = _CONSTRAINTS[c_name]
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise HostError(
            f"route parameter {{{body}}}: {name!r} is not a parameter name devstack.host can route"
        )
    return name, pattern, optional, catch_all


def compile_route(spec: FunctionSpec, prefix: str) -> HttpRoute:
    template = spec.trigger.get("route") or spec.name
    if "%" in template:  # app-setting expressions, resolved as the host resolves them
        template = resolve_binding_expression(template, purpose=f"route of function {spec.name}")
    segments = [s for s in template.strip("/").split("/") if s]
    defaults: dict[str, str] = {}
    parts = [re.escape(p) for p in prefix.strip("/").split("/") if p]
    regex = "/" + "/".join(parts) if parts else ""
    literals = params = 0
    catch_all = False
    for i, seg in enumerate(segments):
        pieces: list[str] = []
        pos = 0
        seg_optional = False
        for m in _PARAM.finditer(seg):
            pieces.append(re.escape(seg[pos : m.start()]))
            name, pattern, optional, is_catch_all = _param_regex(m.group(1), defaults)
            if is_catch_all and i != len(segments) - 1:
                raise HostError(
                    f"function {spec.name}: a catch-all parameter must be the last segment of {template!r}"
                )
            pieces.append(f"(?P<{name}>{pattern})")
            seg_optional = seg_optional or optional or is_catch_all
            catch_all = catch_all or is_catch_all
            params += 1
            pos = m.end()
        pieces.append(re.escape(seg[pos:]))
        if pos == 0:
            literals += 1
        body = "".join(pieces)
        # An optional segment (optional/default/catch-all parameter) may be absent with its slash.
        regex += f"(?:/{body})?" if seg_optional and _PARAM.fullmatch(seg) else f"/{body}"
    methods = spec.trigger.get("methods")
    return HttpRoute(
        spec=spec,
        template=template,
        methods={str(m).upper() for m in methods} if methods else None,
        regex=re.compile(regex + "/?", re.IGNORECASE),
        defaults=defaults,
        literals=literals,
        params=params,
        catch_all=catch_all,
    )


def check_http_function(spec: FunctionSpec) -> None:
    """Refuse what the HTTP trigger support does not cover, naming it."""
    for b in spec.bindings:
        if (
            b.get("type") == "http"
            and b.get("direction") in ("OUT", 1, "out")
            and b.get("name") != "$return"
        ):
            raise HostError(
                f"function {spec.name}: a named HTTP output binding ({b.get('name')}) is not supported "
                "by devstack.host; return the func.HttpResponse instead"
            )


class HttpTriggers:
    """Routes requests to the app's HTTP functions."""

    def __init__(
        self, functions: list[FunctionSpec], route_prefix: str, client_binding: Any
    ) -> None:
        for spec in functions:
            check_http_function(spec)
        self.prefix = route_prefix.strip("/")
        self.client_binding = client_binding
        routes = [compile_route(s, self.prefix) for s in functions]
        # ASP.NET routing order, approximately: more literal segments first, catch-alls last.
        self.routes = sorted(routes, key=lambda r: (r.catch_all, -r.literals, r.params))

    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "function": r.spec.name,
                "route": "/" + "/".join(p for p in (self.prefix, r.template) if p),
                "methods": sorted(r.methods) if r.methods else None,
                "authLevel": r.spec.trigger.get("authLevel"),
            }
            for r in self.routes
        ]

    def find(self, method: str, path: str) -> tuple[HttpRoute, dict[str, str]] | None:
        for route in self.routes:
            values = route.match(path)
            if values is None:
                continue
            if route.methods is not None and method.upper() not in route.methods:
                continue  # the host's route has a method constraint: it does not match
            return route, values
        return None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        # Not request.path: aiohttp decodes %2F there, which would split a segment in two.
        found = self.find(request.method, routing_path(request.rel_url.raw_path))
        if found is None:
            return web.Response(status=404)
        route, values = found
        body = await request.read()
        req = func.HttpRequest(
            method=request.method,
            url=str(request.url),
            headers={k: v for k, v in request.headers.items()},
            params={k: v for k, v in request.query.items()},
            route_params=values,
            body=body,
        )
        spec = route.spec
        kwargs: dict[str, Any] = {spec.trigger["name"]: req}
        if spec.durable_client_param:
            kwargs[spec.durable_client_param] = self.client_binding()
        try:
            value = await call_function(spec, kwargs)
        except Exception:
            log.exception("HTTP function %s failed", spec.name)
            return web.Response(status=500)
        return to_response(spec.name, value)


def to_response(function_name: str, value: Any) -> web.Response:
    """The function's return value as the host would send it (through the worker's converter)."""
    try:
        if value is None:
            # The worker cannot encode None for an http output (azure-functions-python-worker#683):
            # the invocation fails, and the caller gets a 500.
            raise NotImplementedError
        datum = HttpResponseConverter.encode(value, expected_type=None)
    except NotImplementedError:
        log.error(
            "HTTP function %s returned %s, not a func.HttpResponse or str: the invocation fails",
            function_name,
            type(value).__name__,
        )
        return web.Response(status=500)
    if datum.type == "string":
        return web.Response(
            status=200, body=str(datum.value).encode(), content_type="text/plain", charset="utf-8"
        )
    payload = datum.value
    headers = CIMultiDict((k, d.value) for k, d in payload["headers"].items())
    for cookie in (
        payload.get("cookies") or []
    ):  # the converter lifts Set-Cookie headers out as cookies
        for morsel in cookie.values():
            headers.add("Set-Cookie", morsel.OutputString())
    return web.Response(
        status=int(payload["status_code"].value), body=payload["body"].value, headers=headers
    )


def route_prefix(raw_host_json: dict[str, Any]) -> str:
    """host.json `extensions.http.routePrefix` (default `api`; an empty string removes it)."""
    http = (raw_host_json.get("extensions") or {}).get("http") or {}
    prefix = http.get("routePrefix", "api")
    if prefix is None:
        return "api"
    if not isinstance(prefix, str):
        raise HostError(
            f"host.json: extensions.http.routePrefix {json.dumps(prefix)} is not a string"
        )
    return prefix

"""The console's HTTP functions over the composition root: server-rendered
pages and confirm-then-POST actions (views, templates and security rules in
console/), every route behind one sign-in guard (`_guarded`). Anonymous at the
Functions level on purpose: docs/adr/012-console-security.md."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import azure.durable_functions as df
import azure.functions as func
from jinja2 import Environment, FileSystemLoader, select_autoescape
from jinja2.filters import do_urlencode

import console
from bootstrap import App
from console import security, views
from domain import state_machine as sm
from domain.errors import DomainError, NotFoundError, StaleError

log = logging.getLogger(__name__)

HERE = Path(console.__file__).parent  # the console's templates and stylesheet
ANON = func.AuthLevel.ANONYMOUS
REFRESH_CHOICES = (10, 30, 60)  # auto-refresh periods the footer offers, in seconds

_env = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
    finalize=security.mask_for_display,
)
_env.filters["t"] = lambda v: v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if v else ""
_env.filters["hm"] = lambda v: v.astimezone(UTC).strftime("%H:%M:%S") if v else ""
# to the millisecond: events of one second are told apart (and in causal order anyway)
_env.filters["ms"] = lambda v: v.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3] if v else ""
# A URL part is a link, not text: never masked as a card number; a lone
# surrogate, which cannot be percent-encoded, is escaped first (printable).
_env.globals["qs"] = lambda **kw: security.Unmasked(
    urlencode({k: security.printable(str(v)) for k, v in kw.items() if v not in (None, "")})
)
_env.globals["refresh_choices"] = REFRESH_CHOICES
_env.filters["unmasked"] = security.Unmasked  # a link built of parts urlencode made
_env.filters["urlencode"] = lambda v: security.Unmasked(
    do_urlencode(security.printable(v) if isinstance(v, str) else v)
)
# Read once: a file read in the async handler would block the event loop.
_CSS = (HERE / "static" / "console.css").read_bytes()

_SECURITY_HEADERS = {
    # Nothing but our own stylesheet: no script runs on these pages at all.
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


_NEVER_STORED = (
    "An order Submit refused (invalid, or turned away) never is: "
    "its dead letter and its alert say why."
)


def _base(req: func.HttpRequest) -> str:
    """Where the console's links start: a path (or CONSOLE_PUBLIC_URL), never
    a URL built from the request's Host header (console.security.base_path)."""
    return security.base_path(req.url)


def _render(
    req: func.HttpRequest,
    template: str,
    deps: views.Deps | None,
    status: int = 200,
    **context: Any,
) -> func.HttpResponse:
    charges = deps.store.charges if deps is not None else None
    html = _env.get_template(template).render(
        base=_base(req), now=datetime.now(UTC), cost=charges, **_refreshing(req), **context
    )
    return func.HttpResponse(
        # a surrogate in a filter's output must not turn a page into a 500
        html.encode("utf-8", "backslashreplace"),
        status_code=status,
        mimetype="text/html",
        charset="utf-8",
        headers=_SECURITY_HEADERS,
    )


_ONCE = ("refresh", "done", "seq", "sent", "refused")  # what a reload must not repeat


def _refreshing(req: func.HttpRequest) -> dict[str, Any]:
    """`?refresh=N` (5 to 600 s) on a GET: a meta refresh (no script, which
    the Content-Security-Policy forbids); `here`: the query without it."""
    if req.method != "GET":
        return {"refresh": None, "here": None}
    raw = req.params.get("refresh") or ""
    seconds = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 3 else 0
    here = {k: v for k, v in req.params.items() if k not in _ONCE}
    return {"refresh": seconds if 5 <= seconds <= 600 else None, "here": here}


def _error(
    req: func.HttpRequest, status: int, message: str, deps: views.Deps | None = None
) -> func.HttpResponse:
    return _render(req, "error.html", deps, status=status, message=message, status_code=status)


def _signed_in(req: func.HttpRequest) -> str | func.HttpResponse:
    """The operator, or the refusal: 403 while the console is disabled, 401
    when nobody is signed in, 403 when security.operator forbids it."""
    if not security.console_enabled():
        return func.HttpResponse(
            security.DISABLED_MESSAGE,
            status_code=403,
            mimetype="text/plain",
            charset="utf-8",
            headers=_SECURITY_HEADERS,
        )
    try:
        return security.operator(req.headers, req.url)
    except security.Unauthenticated as exc:
        return _error(req, 401, str(exc))
    except security.Forbidden as exc:
        return _error(req, 403, str(exc))


async def _guarded(
    req: func.HttpRequest, respond: Callable[[str], Awaitable[func.HttpResponse]]
) -> func.HttpResponse:
    """Every route's answer, so none can skip the check: `respond(operator)`
    once `_signed_in` lets the request through; views.NotFound answers 404,
    views.BadRequest 400, anything unforeseen is logged and answered 500."""
    who = _signed_in(req)
    if isinstance(who, func.HttpResponse):
        return who
    try:
        return await respond(who)
    except views.NotFound as exc:
        return _error(req, 404, str(exc))
    except views.BadRequest as exc:
        return _error(req, 400, str(exc))
    except Exception:
        log.exception("console: %s %s failed", req.method, security.base_path(req.url))
        return _error(req, 500, "the console failed to answer; the error is in the app's log")


DepsOf = Callable[..., Awaitable[views.Deps]]  # App.console_deps
Handler = Callable[[func.HttpRequest, str, DepsOf], Awaitable[func.HttpResponse]]
View = Callable[[func.HttpRequest, views.Deps], Awaitable[dict[str, Any]]]
# (function name, route, methods, handler) of every route but the order page
_ROUTES: list[tuple[str, str, list[str], Handler]] = []
BOTH = ("GET", "POST")


def _route(
    name: str, route: str, methods: tuple[str, ...] = ("GET",)
) -> Callable[[Handler], Handler]:
    """A handler of `route`: `blueprint` registers it behind `_guarded`."""

    def add(handler: Handler) -> Handler:
        _ROUTES.append((name, route, list(methods), handler))
        return handler

    return add


def _page(name: str, route: str, template: str) -> Callable[[View], View]:
    """A read-only page: the view's data rendered into `template` (`orders.html`
    for the page `orders`: the header marks it)."""

    def add(view: View) -> View:
        async def respond(req: func.HttpRequest, _who: str, deps_of: DepsOf) -> func.HttpResponse:
            deps = await deps_of()
            return _render(req, template, deps, page=template[:-5], **await view(req, deps))

        _route(name, route)(respond)
        return view

    return add


def _from(req: func.HttpRequest) -> int | None:
    return views.parse_sequence(req.params.get("from"))


def _done(req: func.HttpRequest, actions: dict[str, Any]) -> str | None:
    """The action a redirect after it names (`?done=`), when it is one of `actions`."""
    return req.params.get("done") if req.params.get("done") in actions else None


@_page("console_overview", "console", "overview.html")
async def _overview(_req: func.HttpRequest, deps: views.Deps) -> dict[str, Any]:
    return await views.overview(deps)


@_page("console_orders", "console/orders", "orders.html")
async def _orders(req: func.HttpRequest, deps: views.Deps) -> dict[str, Any]:
    return await views.orders(deps, views.parse_filters(dict(req.params)))


@_page("console_stuck", "console/stuck", "stuck.html")
async def _stuck(req: func.HttpRequest, deps: views.Deps) -> dict[str, Any]:
    return await views.stuck(deps, req.params.get("page") or None)


@_page("console_alerts", "console/alerts", "alerts.html")
async def _alerts(req: func.HttpRequest, deps: views.Deps) -> dict[str, Any]:
    return {**await views.alerts(deps, _from(req)), "done": _done(req, views.ALERT_ACTIONS)}


@_page("console_deadletters", "console/deadletters/{queue?}", "deadletters.html")
async def _dead_letters(req: func.HttpRequest, deps: views.Deps) -> dict[str, Any]:
    data = await views.dead_letters(deps, req.route_params.get("queue") or None, _from(req))
    done = _done(req, views.DEAD_LETTER_ACTIONS)
    return {**data, "done": done, "done_seq": views.parse_sequence(req.params.get("seq"))}


@_page("console_statuses", "console/statuses", "statuses.html")
async def _statuses(req: func.HttpRequest, deps: views.Deps) -> dict[str, Any]:
    """The parked statuses; after a resend, what became of it (`done`)."""
    said = {k: req.params.get(k) for k in ("sent", "refused")}
    done = said if _done(req, views.STATUS_ACTIONS) else None
    return {**await views.parked_statuses(deps, req.params.get("queue") or None), "done": done}


def _see_other(location: str) -> func.HttpResponse:
    """Post/Redirect/Get: reloading the page redirected to does not act again."""
    return func.HttpResponse(status_code=303, headers={"Location": location, **_SECURITY_HEADERS})


# An action, given the operator's reason: the query of the page to redirect
# to (None: `?done={action}`), or the page that says what it did.
Act = Callable[[str], Awaitable[dict[str, Any] | func.HttpResponse | None]]


async def _confirm_then_act(
    req: func.HttpRequest,
    who: str,
    deps: views.Deps,
    bound: tuple[str, str, str],
    act: Act,
    done: str,
    template: str,
    titles: dict[str, tuple[str, str]],
    **shown: Any,
) -> func.HttpResponse:
    """An action's two requests. GET: its confirmation page, `template`
    showing `shown` and `titles[action]`, its form's token bound to the
    operator and `bound`. POST: the token checked, `act(reason)` run, then a
    redirect to `done` (`_see_other`), or the page `act` answered. A refusal
    answers 403 (the token), 409 (the target changed or is gone) or 503."""
    action = bound[1]
    if req.method == "GET":
        title, explanation = titles[action]
        token = security.Unmasked(security.form_token(who, *bound))
        context: dict[str, Any] = {"action": action, "title": title, "explanation": explanation}
        return _render(req, template, deps, csrf=token, who=who, **context, **shown)
    form = dict(parse_qsl(req.get_body().decode("utf-8", "replace")))
    try:
        security.check_csrf(req.headers, form, who, *bound, request_url=req.url)
        query = await act(form.get("reason", ""))
    except security.Forbidden as exc:
        return _error(req, 403, str(exc), deps)
    except (views.NotFound, sm.IllegalTransition, StaleError) as exc:
        return _error(req, 409, f"{action} refused: {exc}", deps)
    except DomainError as exc:
        return _error(req, 503, f"{action} failed: {exc}", deps)
    if isinstance(query, func.HttpResponse):
        return query
    return _see_other(f"{_base(req)}/{done}?{urlencode(query or {'done': action})}")


@_route(
    "console_deadletter_action", "console/deadletters/{queue}/{sequence:int}/{action:alpha}", BOTH
)
@_route("console_alert_action", "console/alerts/{sequence:int}/{action:alpha}", BOTH)
async def _message_action(req: func.HttpRequest, who: str, deps_of: DepsOf) -> func.HttpResponse:
    """Resend or discard a dead letter of `queue`, or (no queue in the route)
    acknowledge or close an alert: one message by its sequence number, so a
    token acts once (a message acted on is gone)."""
    queue = req.route_params.get("queue")
    action = req.route_params.get("action", "")
    sequence = views.parse_sequence(req.route_params.get("sequence"))
    titles = views.DEAD_LETTER_ACTIONS if queue else views.ALERT_ACTIONS
    if action not in titles or sequence is None:
        return _error(req, 404, f"No action {action} for message {sequence} of {queue or 'alerts'}")
    deps = await deps_of()
    if queue:
        message = await views.dead_letter(deps, queue, sequence)  # views.NotFound: 404
        page, done, bound = "deadletters", f"deadletters/{quote(queue, safe='')}", queue
    else:
        message = await views.alert(deps, sequence)
        page, done, bound = "alerts", "alerts", "alerts"

    async def act(reason: str) -> dict[str, Any]:
        if queue:
            await views.act_on_dead_letter(deps, queue, sequence, action, who, reason)
        else:
            await views.act_on_alert(deps, sequence, action, who, reason)
        return {"done": action, "seq": sequence}

    template = "confirm_deadletter.html" if queue else "confirm_alert.html"
    shown = {"titles": titles, "page": page, "queue": queue, "m": message}
    target = (f"{bound}/{sequence}", action, "dead-letter" if queue else "alert")
    return await _confirm_then_act(req, who, deps, target, act, done, template, **shown)


@_route("console_status_action", "console/statuses/{queue}/{action:alpha}", BOTH)
async def _status_action(req: func.HttpRequest, who: str, deps_of: DepsOf) -> func.HttpResponse:
    """Resend a reply queue's parked terminal statuses now, or one order's
    (`?order=`); then the statuses page says how many went."""
    queue = req.route_params.get("queue", "")
    action = req.route_params.get("action", "")
    order_id = req.params.get("order") or None
    if action not in views.STATUS_ACTIONS or (order_id and not views.valid_order_id(order_id)):
        return _error(req, 404, f"No action {action} for statuses of {queue}")
    deps = await deps_of()
    parked = await views.parked_statuses(deps, queue, order_id)

    async def act(reason: str) -> dict[str, Any]:
        said = await views.resend_statuses(deps, queue, order_id, who, reason)
        return {"queue": queue, "done": action, **said}

    bound = (f"statuses/{queue}/{order_id or ''}", action, "outbox")
    shown = {"titles": views.STATUS_ACTIONS, "page": "statuses", "order": order_id, **parked}
    return await _confirm_then_act(
        req, who, deps, bound, act, "statuses", "confirm_statuses.html", **shown
    )


async def _order_page(
    req: func.HttpRequest, deps_of: DepsOf, client: df.DurableOrchestrationClient
) -> func.HttpResponse:
    order_id = req.route_params.get("order_id", "")

    async def respond(_who: str) -> func.HttpResponse:
        deps = await deps_of(durable=client)
        data = await views.order_detail(deps, order_id)
        if data is None:
            return _error(req, 404, f"No order {order_id} is stored. {_NEVER_STORED}", deps)
        return _render(req, "order.html", deps, page="orders", done=req.params.get("done"), **data)

    return await _guarded(req, respond)


@_route("console_action", "console/orders/{order_id}/{action:alpha}", BOTH)
async def _action(req: func.HttpRequest, who: str, deps_of: DepsOf) -> func.HttpResponse:
    """Resubmit, compensate or retry one order (its token is bound to the
    record's version: once done the record changed, so a token acts once)."""
    order_id = req.route_params.get("order_id", "")
    action = req.route_params.get("action", "")
    if action not in views.ACTIONS or not views.valid_order_id(order_id):
        return _error(req, 404, f"No action {action} for order {order_id}")
    deps = await deps_of()
    try:
        record, _ = await deps.store.read(order_id)
    except NotFoundError:
        return _error(req, 404, f"No order {order_id}", deps)
    version = security.record_version(record)

    async def act(reason: str) -> None:
        await views.act(deps, order_id, action, who, reason, expected_version=version)

    done = f"orders/{quote(order_id, safe='')}"
    shown: dict[str, Any] = {"titles": views.ACTIONS, "page": "orders", "record": record}
    return await _confirm_then_act(
        req, who, deps, (order_id, action, version), act, done, "confirm.html", **shown
    )


_BULK = "bulk"  # the token's target prefix: a bulk form acts on its list only


@_route("console_bulk_action", "console/bulk/{action:alpha}", BOTH)
async def _bulk_action(req: func.HttpRequest, who: str, deps_of: DepsOf) -> func.HttpResponse:
    """Resubmit (or compensate) several orders: GET confirms, the token bound
    to the list and each order's version; POST acts on each order still at
    the version shown and lists what became of each."""
    action = req.route_params.get("action", "")
    deps = await deps_of()
    shown: dict[str, Any] = {"titles": views.ACTIONS, "page": "orders"}
    if req.method == "GET":
        ids = views.bulk_ids(parse_qsl(urlsplit(req.url).query))
        shown["targets"] = await views.bulk_targets(deps, ids, action)
        shown["ready"] = [t for t in shown["targets"] if t["why"] is None]
        chosen = [(t["id"], t["version"]) for t in shown["ready"]]
    else:
        pairs = parse_qsl(req.get_body().decode("utf-8", "replace"))
        versions = [v for k, v in pairs if k == "version"]
        chosen = list(zip(views.bulk_ids(pairs), versions, strict=False))
    # The token is bound to the list and each version.
    target = _BULK + "\x1f".join(i for i, _ in chosen)
    version = "\x1e".join(v for _, v in chosen)

    async def act(reason: str) -> func.HttpResponse:
        results = await views.bulk_act(deps, chosen, action, who, reason)
        return _render(req, "bulk_done.html", deps, page="orders", action=action, results=results)

    bound = (target, action, version)
    return await _confirm_then_act(req, who, deps, bound, act, "", "confirm_bulk.html", **shown)


@_route("console_static", "console/static/console.css")
async def _stylesheet(_req: func.HttpRequest, _who: str, _deps_of: DepsOf) -> func.HttpResponse:
    return func.HttpResponse(
        _CSS, mimetype="text/css", headers={**_SECURITY_HEADERS, "Cache-Control": "max-age=300"}
    )


@_route("console_find", "console/find")
async def _find(req: func.HttpRequest, _who: str, _deps_of: DepsOf) -> func.HttpResponse:
    """The header's search box: an order key (`webshop:ORD-1`) opens that
    order; an OrderID or the start of one lists the orders, in any state and
    application, whose OrderID starts with it."""
    order_id = (req.params.get("id") or "").strip()
    if ":" in order_id and views.valid_order_id(order_id):
        return _see_other(f"{_base(req)}/orders/{quote(order_id, safe='')}")
    try:
        views.parse_filters({"state": views.ANY_STATE, "prefix": order_id})
    except views.BadRequest:
        return _error(req, 404, f"No order {order_id}")
    query = urlencode({"state": views.ANY_STATE, "prefix": order_id})
    return _see_other(f"{_base(req)}/orders?{query}")


def _register(
    bp: df.Blueprint, name: str, route: str, methods: list[str], handle: Handler, deps_of: DepsOf
) -> None:
    async def answer(req: func.HttpRequest) -> func.HttpResponse:
        return await _guarded(req, lambda who: handle(req, who, deps_of))

    bp.function_name(name)(bp.route(route=route, methods=methods, auth_level=ANON)(answer))


def blueprint(root: App) -> df.Blueprint:
    """The console's routes over `root`'s console_deps: `_ROUTES`, and the
    order page, which also reads the orchestrations through the durable client."""
    bp = df.Blueprint()
    deps_of = root.console_deps
    for name, route, methods, handler in _ROUTES:
        _register(bp, name, route, methods, handler, deps_of)

    @bp.function_name("console_order")
    @bp.route(route="console/orders/{order_id}", methods=["GET"], auth_level=ANON)
    @bp.durable_client_input(client_name="client")
    async def console_order(
        req: func.HttpRequest, client: df.DurableOrchestrationClient
    ) -> func.HttpResponse:
        return await _order_page(req, deps_of, client)

    return bp

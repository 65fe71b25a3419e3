"""What the orders the local host ran cost, counted on the Cosmos server.

The local Cosmos server keeps a journal of document requests while a bench
asks it to (devstack/cosmos/launcher.js, `/_devstack/journal`): each request's
method, path, status, the body sent and the body answered. Every entry becomes
an `Op` (bench/cosmos_ru.py) with the documents it touched (the version a
replace or delete removed is the last one the journal saw of that id), and is
priced by the same published RU rules as the simulation's (bench/order_cost.py).

The order's own requests are kept apart from the periodic ones by the same
rule on both sides (`periodic`): queries (the Starter's, the Supervisor's) and
the documents whose id starts with `_` (the backlog gauge, the Supervisor's
checkpoints) cost per run or per cache period, not per order."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.cosmos_ru import Op, RuModel

JOURNAL = "/_devstack/journal"


def periodic(op: Op) -> bool:
    """The Starter's and the Supervisor's work and the shared documents, not
    one order's: see the module docstring."""
    if op.kind == "query":
        return True
    doc = op.new or op.old or (op.returned[0] if op.returned else None)
    return bool(doc) and str(doc.get("id", "")).startswith("_")


def _journal(port: int, method: str) -> Any:
    import http.client
    import json
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the dev server's self-signed certificate
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=60)
    connection.request(method, JOURNAL)
    return json.loads(connection.getresponse().read())


def start_journal(port: int) -> None:
    _journal(port, "PUT")


def take_journal(port: int) -> list[dict[str, Any]]:
    """The entries since the journal started (or was last taken)."""
    return _journal(port, "GET")


def ops_from_journal(entries: list[dict[str, Any]], containers: dict[str, str]) -> list[Op]:
    """The journal's entries as Ops. `containers`: the Cosmos container name ->
    the model's name (state, orders, index); other containers are left out."""
    known: dict[tuple[str, str], dict[str, Any]] = {}  # (container, id) -> last version seen
    added: set[str] = set()  # index entries written during the journal
    ops: list[Op] = []
    for entry in entries:
        parts = entry["path"].strip("/").split("/")
        if len(parts) < 5 or parts[2] != "colls" or parts[4] != "docs":
            continue
        container = containers.get(parts[3])
        if container is None:
            continue
        doc_id = parts[5] if len(parts) > 5 else None
        method, status = entry["method"], int(entry["status"])
        request, response = entry.get("request"), entry.get("response")
        if method == "GET":
            kind = "read"
        elif method == "PUT":
            kind = "replace"
        elif method == "DELETE":
            kind = "delete"
        elif method == "PATCH":
            kind = "patch"
        elif entry.get("query"):
            kind = "query"
        elif isinstance(request, list):
            kind = "batch"
        else:
            kind = "upsert" if entry.get("upsert") else "create"
        op = Op(container, kind, "host", failed=status >= 400)
        if kind in ("create", "upsert", "replace", "patch"):
            body = response if isinstance(response, dict) and "id" in response else request
            doc_id = doc_id or (body or {}).get("id")
            op.old = known.get((container, str(doc_id)))
            if kind == "patch":
                op.kind = "replace"  # charged as the replace of the whole document
            if not op.failed and isinstance(body, dict):
                op.new = body
                known[(container, str(doc_id))] = body
                if container == "index":
                    added.add(str(doc_id))
        elif kind == "read":
            if not op.failed and isinstance(response, dict):
                op.returned = [response]
                known[(container, str(doc_id))] = response
            else:  # a 404: which document it missed still says whose read it was
                op.old = {"id": str(doc_id)}
        elif kind == "delete":
            # One written before the journal started: priced as the smallest document.
            op.old = known.pop((container, str(doc_id)), None) or {"id": str(doc_id)}
        elif kind == "query":
            docs = (response or {}).get("Documents") if isinstance(response, dict) else None
            op.returned = [d for d in docs or [] if isinstance(d, dict)]
        elif kind == "batch":
            results = response if isinstance(response, list) else []
            for i, operation in enumerate(request or []):
                if str(operation.get("operationType", "")).lower() != "delete":
                    continue
                ok = i < len(results) and int(results[i].get("statusCode", 500)) < 300
                gone = known.pop((container, str(operation.get("id"))), None)
                if ok and gone is not None:
                    op.deleted.append(gone)
        ops.append(op)
    return ops + _removals_due(known, added)


def _removals_due(known: dict[tuple[str, str], dict[str, Any]], added: set[str]) -> list[Op]:
    """The removals of the index entries written during the journal that the
    host still holds back at its end (adapters.recovery_index gathers them
    into batches per partition and sends them with later ones): priced as
    if flushed then, one request per partition, as the simulation's
    measurement flushes its own (bench/order_cost.py)."""
    by_bucket: dict[str, list[dict[str, Any]]] = {}
    for (container, doc_id), doc in known.items():
        if container == "index" and doc_id in added:
            by_bucket.setdefault(str(doc.get("bucket")), []).append(doc)
    return [
        Op("index", "batch", "host", deleted=docs)
        if len(docs) > 1
        else Op("index", "delete", "host", old=docs[0])
        for _, docs in sorted(by_bucket.items())
    ]


@dataclass
class Priced:
    """Per order: requests and RU by "container kind", the order's own and
    the periodic ones apart."""

    orders: int
    requests: dict[str, float] = field(default_factory=dict)
    ru: dict[str, float] = field(default_factory=dict)
    periodic_requests: float = 0.0
    periodic_ru: float = 0.0
    requests_per_order: float = 0.0  # the order's own, all kinds
    ru_per_order: float = 0.0


def price(ops: list[Op], model: RuModel, orders: int) -> Priced:
    requests: Counter[str] = Counter()
    ru: Counter[str] = Counter()
    out = Priced(orders)
    n = max(1, orders)
    for op in ops:
        charge = model.charge(op)
        if periodic(op):
            out.periodic_requests += 1 / n
            out.periodic_ru += charge / n
            continue
        key = f"{op.container} {op.kind}" + (" (refused)" if op.failed else "")
        requests[key] += 1
        ru[key] += charge
    out.requests = {k: v / n for k, v in sorted(requests.items())}
    out.ru = {k: v / n for k, v in sorted(ru.items())}
    out.requests_per_order, out.ru_per_order = sum(requests.values()) / n, sum(ru.values()) / n
    return out

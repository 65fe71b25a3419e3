"""The published Cosmos DB request-unit model, applied to documents we measured.

Cosmos DB charges every request in request units (RU). Microsoft publishes
the rule for point operations (learn.microsoft.com/azure/cosmos-db/
understand-request-unit-consumption, the figures in bench/limits.yaml):

- point read: by the stored document's size (1 KB = 1 RU, 2 KB = 1.04, ...);
- create: a size-based charge (1 KB = 4.95 RU, 2 KB = 6.29, ...) plus 0.2 RU
  for every index term the indexing policy makes of the document;
- replace (and an upsert of an existing document): a delete of the old
  version and an insert of the new (two size-based charges) plus 0.2 RU for
  every index term removed and every term added;
- delete: a size-based charge plus 0.2 RU per index term removed.

This is an approximation, stated as one: the page calls its values
"illustrative", the size charge is interpolated between its rows, index terms
are counted as one per indexed scalar (path, value) plus one per composite
index the document fills, and the stored size is the compact JSON the SDK
sends plus the system properties the service adds. Queries have no published
formula: they are charged a base per request (an assumption, in limits.yaml)
plus a point read of every document they return; a request the service
refuses (404, 409, 412) is charged 1 RU, also an assumption.

The indexing policies are read from the Bicep (infra/app/state-store.bicep):
a container with `indexingPolicy: null` gets Cosmos DB's default policy,
every path indexed."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STATE_STORE_BICEP = ROOT / "infra" / "app" / "state-store.bicep"

# The Bicep's container-name parameters, as the simulation names the containers.
BICEP_CONTAINERS = {
    "stateContainerName": "state",
    "recoveryIndexContainerName": "index",
    "ordersContainerName": "orders",
}

# Cosmos DB's default indexing policy (what a container created without one gets).
DEFAULT_POLICY: dict[str, Any] = {
    "includedPaths": [{"path": "/*"}],
    "excludedPaths": [{"path": '/"_etag"/?'}],
}

# What the service adds to every stored document (the shape of a real one; the
# values' lengths are fixed by the service's formats).
SYSTEM_PROPERTIES = (
    ',"_rid":"dR0BAOS8ZfUBAAAAAAAAAA==","_self":"dbs/dR0BAA==/colls/dR0BAOS8ZfU=/docs/'
    'dR0BAOS8ZfUBAAAAAAAAAA==/","_etag":"\\"00000000-0000-0000-b94a-58b0f15a01db\\"",'
    '"_attachments":"attachments/","_ts":1764576000'
)
_SYSTEM_KEYS = ("_rid", "_self", "_etag", "_attachments", "_ts")


def stored_bytes(doc: dict[str, Any]) -> int:
    """Bytes of the document as stored: the SDK's compact JSON of the body
    (azure.cosmos serializes with separators=(",", ":")) plus the system
    properties, counted once whether or not the body already carries them."""
    body = {k: v for k, v in doc.items() if k not in _SYSTEM_KEYS}
    return len(json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()) + len(
        SYSTEM_PROPERTIES
    )


@cache
def bicep_policies(path: Path = STATE_STORE_BICEP) -> dict[str, dict[str, Any]]:
    """Indexing policy by container (simulation name), from the Bicep."""
    from pycep import BicepParser

    doc = BicepParser().parse(file_path=path)
    out: dict[str, dict[str, Any]] = {}
    for var in ("stateContainers", "ordersContainers"):
        for container in doc["variables"][var]["value"]:
            name = BICEP_CONTAINERS.get(container["name"])
            if name is None:
                raise ValueError(f"{path}: unknown container parameter {container['name']!r}")
            out[name] = container.get("indexingPolicy") or DEFAULT_POLICY
    missing = set(BICEP_CONTAINERS.values()) - set(out)
    if missing:
        raise ValueError(f"{path}: no container for {sorted(missing)}")
    return out


def _pattern(path: str) -> tuple[tuple[str, ...], bool]:
    """'/History/*' -> (('History',), True); '/"_etag"/?' -> (('_etag',), False)."""
    parts = [p.strip('"') for p in path.strip("/").split("/")]
    if parts and parts[-1] == "*":
        return tuple(parts[:-1]), True
    if parts and parts[-1] == "?":
        return tuple(parts[:-1]), False
    return tuple(parts), False


def _leaves(value: Any, prefix: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*prefix, k))
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v, (*prefix, "[]"))
    else:
        yield prefix, value


@dataclass(frozen=True)
class IndexPolicy:
    included: tuple[tuple[tuple[str, ...], bool], ...]
    excluded: tuple[tuple[tuple[str, ...], bool], ...]
    composites: tuple[tuple[str, ...], ...] = ()

    @classmethod
    def of(cls, policy: dict[str, Any]) -> IndexPolicy:
        if str(policy.get("indexingMode", "consistent")).lower() == "none":
            return cls((), ())  # no index at all: no term is written
        return cls(
            tuple(_pattern(p["path"]) for p in policy.get("includedPaths") or ()),
            tuple(_pattern(p["path"]) for p in policy.get("excludedPaths") or ()),
            tuple(
                tuple(p["path"].strip("/") for p in composite)
                for composite in policy.get("compositeIndexes") or ()
            ),
        )

    @staticmethod
    def _match(path: tuple[str, ...], pattern: tuple[tuple[str, ...], bool]) -> int:
        """How specific a match `pattern` is for `path` (-1: none)."""
        parts, wildcard = pattern
        if wildcard:
            return len(parts) if path[: len(parts)] == parts else -1
        return len(parts) + 1 if path == parts else -1

    def indexed(self, path: tuple[str, ...]) -> bool:
        """The most specific matching path wins (Cosmos DB's precedence rule)."""
        inc = max((self._match(path, p) for p in self.included), default=-1)
        exc = max((self._match(path, p) for p in self.excluded), default=-1)
        return inc >= 0 and inc > exc

    def terms(self, doc: dict[str, Any]) -> Counter[str]:
        body = {k: v for k, v in doc.items() if k not in _SYSTEM_KEYS}
        out: Counter[str] = Counter()
        for path, value in _leaves(body):
            if self.indexed(path):
                out["/".join(path) + "=" + json.dumps(value, sort_keys=True)] += 1
        for composite in self.composites:
            values = [body.get(p) for p in composite]
            if all(v is not None for v in values):
                out["composite:" + ",".join(composite) + "=" + json.dumps(values)] += 1
        return out


def _interpolate(table: list[list[float]], kb: float) -> float:
    """Linear between the published rows; the first row's value below it."""
    if kb <= table[0][0]:
        return table[0][1]
    for (k0, v0), (k1, v1) in itertools.pairwise(table):
        if kb <= k1:
            return v0 + (v1 - v0) * (kb - k0) / (k1 - k0)
    (k0, v0), (k1, v1) = table[-2], table[-1]
    return v1 + (v1 - v0) * (kb - k1) / (k1 - k0)


@dataclass
class Op:
    """One request the product sent, with the documents it touched."""

    container: str
    kind: str  # create, replace, upsert, read, delete, query, batch
    actor: str
    new: dict[str, Any] | None = None  # the body written
    old: dict[str, Any] | None = None  # the version it replaced or deleted
    returned: list[dict[str, Any]] = field(default_factory=list)  # read/query results
    deleted: list[dict[str, Any]] = field(default_factory=list)  # batch deletes
    failed: bool = False  # the service refused it (404, 409, 412)


class RuModel:
    def __init__(self, limits: dict[str, Any], policies: dict[str, dict[str, Any]]) -> None:
        ru = limits["cosmos"]["ru_model"]
        self.read_table = ru["point_read_ru_by_kb"]["value"]
        self.write_table = ru["write_ru_by_kb"]["value"]
        self.per_term = float(ru["ru_per_index_term"]["value"])
        self.query_base = float(ru["query_base_ru"]["value"])
        self.policies = {name: IndexPolicy.of(p) for name, p in policies.items()}

    def size_write(self, doc: dict[str, Any]) -> float:
        return _interpolate(self.write_table, stored_bytes(doc) / 1024)

    def size_read(self, doc: dict[str, Any]) -> float:
        return _interpolate(self.read_table, stored_bytes(doc) / 1024)

    def charge(self, op: Op) -> float:
        if op.failed:
            # No published figure for a refused request; charged as a 1 KB read.
            return 1.0
        policy = self.policies[op.container]
        if op.kind in ("create", "upsert", "replace") and op.new is not None:
            if op.old is None:
                return self.size_write(op.new) + self.per_term * sum(policy.terms(op.new).values())
            old, new = policy.terms(op.old), policy.terms(op.new)
            changed = sum((old - new).values()) + sum((new - old).values())
            return self.size_write(op.old) + self.size_write(op.new) + self.per_term * changed
        if op.kind == "delete" and op.old is not None:
            return self.size_write(op.old) + self.per_term * sum(policy.terms(op.old).values())
        if op.kind == "batch":
            return sum(
                self.size_write(d) + self.per_term * sum(policy.terms(d).values())
                for d in op.deleted
            )
        if op.kind == "read":
            return self.size_read(op.returned[0]) if op.returned else 1.0
        if op.kind == "query":
            return self.query_base + sum(
                self.size_read(d) for d in op.returned if isinstance(d, dict)
            )
        raise ValueError(f"no RU rule for {op.kind} ({op.container})")

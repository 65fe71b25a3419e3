"""An in-memory Cosmos DB container: the subset of `azure.cosmos.aio.ContainerProxy`
the project's adapters call (create/read/replace/upsert/delete_item, query_items),
raising the real azure.cosmos exception types, so the adapters' own code (state
store, recovery index, orders DB, checkpoints) runs unchanged in the simulation.

Queries are evaluated by a small interpreter of the SQL subset the adapters use
(SELECT [TOP n] * | c.f, ... | VALUE COUNT(1) | VALUE MIN(c.f) FROM c [WHERE ...] [ORDER BY ...]),
not matched by their text, so a changed filter keeps working.

Faults (drawn by the world's seed): 429 with retry-after, and a read that returns
the previous version of a document (session-consistency lag across clients).
A query on a lagging replica keeps Session consistency's guarantees within a
session (one host process's client, `SimContainer.session`): it shows a
document no older than the version that session wrote or read last
(read-your-writes, monotonic reads); another session's writes it may miss,
however old (Cosmos bounds no other session's lag).
In the fallible world (issue 21, `FaultConfig.cosmos_fail` ...): a 429 past the
SDK's own retries, a 503 or a refused connection before the effect, a lasting
outage of the account (every call fails for a window), a write applied whose
answer is lost (a reset connection, the client's timeout, a 408), and a query
that returns a document's previous version. Each is raised as the SDK raises it
(CosmosHttpResponseError with its status, azure.core's ServiceRequestError /
ServiceResponseError, CosmosClientTimeoutError), so the adapters' own
`translate_error` is what classifies it."""

from __future__ import annotations

import re
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from azure.cosmos.exceptions import (
    CosmosAccessConditionFailedError,
    CosmosBatchOperationError,
    CosmosClientTimeoutError,
    CosmosHttpResponseError,
    CosmosResourceExistsError,
    CosmosResourceNotFoundError,
)

from adapters.cosmos_client import DEFAULT_THROTTLE_MAX_WAIT_SECONDS, DEFAULT_THROTTLE_RETRIES

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+)|(?P<param>@\w+)|(?P<str>'[^']*')|(?P<op>>=|<=|!=|<>|=|<|>|\(|\)|,|\*)"
    r"|(?P<name>[A-Za-z_][\w.]*))"
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"cannot parse query near {text[pos : pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
    return out


_MISSING = object()


def _field(doc: dict, path: str) -> Any:
    value: Any = doc
    for part in path.split(".")[1:]:
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _cmp(op: str, a: Any, b: Any) -> bool:
    if a is _MISSING or b is _MISSING:
        return False
    if op == "=":
        return a == b
    if op in ("!=", "<>"):
        return a != b
    if type(a) is not type(b) and not (isinstance(a, int | float) and isinstance(b, int | float)):
        return False  # Cosmos: comparing different types is undefined -> no match
    if a is None:
        return False
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


class _Query:
    """Parses once; `run(docs, params)` returns the result list."""

    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self._expect_word("SELECT")
        self.top: Any = None
        if self._word("TOP"):
            self.top = self._value_token()
        self.select: tuple[str, str | None]
        if self._word("VALUE"):
            fn = self._next()[1].upper()
            self._expect("(")
            arg = self._next()[1]
            self._expect(")")
            self.select = (fn, arg)
        elif self._word("*"):
            self.select = ("*", None)
        else:
            # A projection `c.a, c.b, ...` (the console's lists): each named
            # field that the document has, under its last name.
            self.fields: list[str] = [self._next()[1]]
            while self._word(","):
                self.fields.append(self._next()[1])
            self.select = ("FIELDS", None)
        self._expect_word("FROM")
        self._next()
        self.where = self._or() if self._word("WHERE") else (lambda d, p: True)
        self.order: list[tuple[str, bool]] = []
        if self._word("ORDER"):
            self._expect_word("BY")
            while True:
                name = self._next()[1]
                desc = False
                if self._word("DESC"):
                    desc = True
                else:
                    self._word("ASC")
                self.order.append((name, desc))
                if not self._peek(","):
                    break
                self.i += 1

    # --- token helpers
    def _next(self) -> tuple[str, str]:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def _peek(self, value: str) -> bool:
        return self.i < len(self.toks) and self.toks[self.i][1].upper() == value.upper()

    def _word(self, value: str) -> bool:
        if self._peek(value):
            self.i += 1
            return True
        return False

    def _expect(self, value: str) -> None:
        if not self._word(value):
            raise ValueError(f"expected {value} at token {self.i}")

    _expect_word = _expect

    def _value_token(self):
        kind, text = self._next()
        if kind == "num":
            return int(text)
        if kind == "param":
            return ("param", text)
        raise ValueError(f"unexpected {text}")

    # --- expressions
    def _or(self):
        left = self._and()
        while self._word("OR"):
            right = self._and()
            left = (lambda a, b: lambda d, p: a(d, p) or b(d, p))(left, right)
        return left

    def _and(self):
        left = self._not()
        while self._word("AND"):
            right = self._not()
            left = (lambda a, b: lambda d, p: a(d, p) and b(d, p))(left, right)
        return left

    def _not(self):
        if self._word("NOT"):
            inner = self._not()
            return lambda d, p: not inner(d, p)
        return self._atom()

    def _atom(self):
        if self._word("("):
            inner = self._or()
            self._expect(")")
            return inner
        kind, text = self._next()
        if kind == "name" and text.upper() in ("IS_NULL", "IS_DEFINED"):
            self._expect("(")
            path = self._next()[1]
            self._expect(")")
            if text.upper() == "IS_NULL":
                return lambda d, p: _field(d, path) is None
            return lambda d, p: _field(d, path) is not _MISSING
        left = self._operand(kind, text)
        op = self._next()[1]
        right = self._operand(*self._next())
        return lambda d, p: _cmp(op, left(d, p), right(d, p))

    def _operand(self, kind: str, text: str):
        if kind == "param":
            return lambda d, p: p.get(text, _MISSING)
        if kind == "num":
            return lambda d, p: int(text)
        if kind == "str":
            return lambda d, p: text[1:-1]
        if text.lower() in ("true", "false"):
            return lambda d, p: text.lower() == "true"
        if text.lower() == "null":
            return lambda d, p: None
        return lambda d, p: _field(d, text)

    def run(self, docs: list[dict], params: dict[str, Any]) -> list[Any]:
        hits = [d for d in docs if self.where(d, params)]
        for name, desc in reversed(self.order):
            hits.sort(key=lambda d, n=name: (_field(d, n) is _MISSING, _field(d, n)), reverse=desc)
        fn, arg = self.select
        if fn == "COUNT":
            return [len(hits)]
        if fn == "MIN":
            values = [_field(d, arg) for d in hits if _field(d, arg) not in (_MISSING, None)]
            return [min(values)] if values else []
        top = self.top
        if isinstance(top, tuple):
            top = params[top[1]]
        if top is not None:
            hits = hits[:top]
        if fn == "FIELDS":
            return [
                {
                    f.rpartition(".")[2]: _copy(_field(d, f))
                    for f in self.fields
                    if _field(d, f) is not _MISSING
                }
                for d in hits
            ]
        return [_copy(d) for d in hits]


_PARSED: dict[str, _Query] = {}


def _copy(value: Any) -> Any:
    """A copy of a JSON document (dicts, lists, scalars): what a round trip
    through the service gives, several times faster than copy.deepcopy."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _error(cls, status: int, message: str, headers: dict | None = None):
    exc = cls(status_code=status, message=message)
    exc.headers = headers or {}
    return exc


def _failure(kind: str, what: str) -> Exception:
    """The exception the SDK raises for a fault kind of sim.world.Faults."""
    if kind == "throttle_429":
        return _error(
            CosmosHttpResponseError, 429, "Request rate is large", {"x-ms-retry-after-ms": "500"}
        )
    if kind == "cosmos_503":
        return _error(CosmosHttpResponseError, 503, "Service is currently unavailable")
    if kind == "refused":
        return ServiceRequestError(f"Cannot connect to host sim.invalid:443 ({what})")
    if kind == "reset":
        return ServiceResponseError(f"Connection reset by peer ({what})")
    if kind == "client_timeout":
        return CosmosClientTimeoutError()
    if kind == "408":
        return _error(CosmosHttpResponseError, 408, "Request timed out")
    raise ValueError(f"no Cosmos fault {kind!r}")


class _Pages:
    def __init__(self, items: list[Any]) -> None:
        self._items = items

    def __aiter__(self):
        return self._gen()

    async def _gen(self):
        for item in self._items:
            yield item


# How long after its delete a document may still be seen by a lagging
# replica (the simulation's lagging Supervisor), in seconds.
DELETED_LAG = 5.0
# How long after its create a document may still be missing on a lagging
# replica (the fallible world's `query_lag`), in seconds.
NEW_DOCUMENT_LAG = 2.0


class SimContainer:
    """One container; `world` gives await points, faults and the trace."""

    def __init__(self, world, name: str, pk_path: str) -> None:
        self.world = world
        self.name = name
        self._pk = pk_path.strip("/")
        self.docs: dict[tuple[str, str], dict] = {}
        self.previous: dict[tuple[str, str], dict] = {}
        self.created: dict[tuple[str, str], Any] = {}  # when create_item made a document
        self._etag = 0
        self.on_write = None  # (old doc or None, new doc): the simulation's bookkeeping
        self.on_delete = None  # (doc)
        # Whether this read (or query: "query") comes from a replica that has
        # not seen the latest writes, besides the seed's own draws: the
        # simulation's lagging Supervisor (sim.system, its own stream).
        self.lagging: Any = lambda what: False
        # Documents deleted in the last DELETED_LAG seconds (their last
        # version, and when): what such a lagging replica still shows.
        self.deleted: dict[tuple[str, str], tuple[dict, Any]] = {}
        # The session of the running call (a host process's client), or None
        # (a client of its own: an operator's command, a foreign program).
        self.session: Any = lambda: None
        # Per session, the newest version of each document it wrote or read
        # (the number in its etag): what its session token makes a replica show.
        self._seen: dict[Any, dict[tuple[str, str], int]] = {}
        # When a COUNT of Processing last missed another session's claim.
        self.missed_claim_at: Any = None

    def _key_of(self, body: dict) -> tuple[str, str]:
        return (str(body[self._pk]), str(body["id"]))

    def _stamp(self, body: dict) -> dict:
        self._etag += 1
        doc = _copy(body)
        doc["_etag"] = f'"{self.name}-{self._etag}"'
        doc["_ts"] = int(self.world.clock.now.timestamp())
        return doc

    def _note_missed_claims(self, view: list[tuple[tuple[str, str], dict]]) -> None:
        """A COUNT of Processing on a lagging replica that shows a record as it
        was before another session's claim: when (`missed_claim_at`), for the
        admission check, whose promise assumes every COUNT sees every landed
        claim (docs/design.md, admission)."""
        for key, shown in view:
            current = self.docs.get(key)
            if (
                current is not None
                and current.get("ProcessState") == "Processing"
                and shown.get("ProcessState") != "Processing"
            ):
                self.missed_claim_at = self.world.clock.now
                self.world.log(f"cosmos {self.name} COUNT missed the claim of {key[1]}")
                return

    @staticmethod
    def _version(doc: dict) -> int:
        return int(str(doc["_etag"]).strip('"').rpartition("-")[2])

    def _saw(self, key: tuple[str, str], doc: dict) -> None:
        """The running call's session has seen `doc` (written or read it)."""
        session = self.session()
        if session is not None:
            seen = self._seen.setdefault(session, {})
            seen[key] = max(seen.get(key, 0), self._version(doc))

    async def _op(self, op: str, hook) -> None:
        await self.world.point(f"cosmos.{self.name}.{op}")
        # The SDK below ContainerProxy retries a 429 itself, as the product
        # configures it (adapters.cosmos_client: a few retries within a few
        # seconds, each after the service's retry-after); only then does the
        # caller see the 429.
        waited = 0.0
        for retry in range(DEFAULT_THROTTLE_RETRIES + 1):
            retry_ms = self.world.faults.cosmos_throttle(self.name)
            if retry_ms is None:
                break
            wait = retry_ms / 1000
            if (
                retry == DEFAULT_THROTTLE_RETRIES
                or waited + wait > DEFAULT_THROTTLE_MAX_WAIT_SECONDS
            ):
                raise _error(
                    CosmosHttpResponseError,
                    429,
                    "Request rate is large",
                    {"x-ms-retry-after-ms": str(retry_ms)},
                )
            waited += wait
            await self.world.point(f"cosmos.{self.name}.{op} throttled", delay=wait)
        failure = self.world.faults.cosmos_call(self.name, op)
        if failure == "outage":
            # An account down answers 503 while its gateway is up, and refuses
            # the connection when it is not (alternately, by the world's count).
            failure = "cosmos_503" if self.world.counters["cosmos_outage"] % 2 else "refused"
        if failure is not None:
            raise _failure(failure, f"{self.name}.{op}")
        if hook is not None:
            hook({"x-ms-request-charge": "1"}, {})

    def _answer_lost(self, op: str, missing: bool = False) -> None:
        """After a write's effect (or its 404: `missing`): its answer may be
        lost on the way back."""
        failure = self.world.faults.cosmos_answer_lost(self.name, op, missing)
        if failure is not None:
            done = "found nothing" if missing else "applied"
            self.world.log(f"cosmos {self.name} {op} {done}, answer lost ({failure})")
            raise _failure(failure, f"{self.name}.{op}")

    async def create_item(self, body: dict, response_hook=None, **_: Any) -> dict:
        await self._op("create", response_hook)
        key = self._key_of(body)
        if key in self.docs:
            raise _error(
                CosmosResourceExistsError, 409, "Entity with the specified id already exists"
            )
        self.docs[key] = self._stamp(body)
        self.created[key] = self.world.clock.now
        self._saw(key, self.docs[key])
        self._wrote(None, self.docs[key])
        self._answer_lost("create")
        return _copy(self.docs[key])

    def _wrote(self, old, new) -> None:
        if self.on_write is not None:
            self.on_write(old, new)

    async def upsert_item(self, body: dict, response_hook=None, **_: Any) -> dict:
        await self._op("upsert", response_hook)
        key = self._key_of(body)
        old = self.docs.get(key)
        if old is not None:
            self.previous[key] = old
        self.docs[key] = self._stamp(body)
        self._saw(key, self.docs[key])
        self._wrote(old, self.docs[key])
        self._answer_lost("upsert")
        return _copy(self.docs[key])

    async def read_item(self, item: str, partition_key: Any, response_hook=None, **_: Any) -> dict:
        await self._op("read", response_hook)
        key = (str(partition_key), str(item))
        if key not in self.docs:
            raise _error(
                CosmosResourceNotFoundError, 404, "Entity with the specified id does not exist"
            )
        if key in self.previous and (
            self.world.faults.session_lag(f"{self.name} {item}") or self.lagging(item)
        ):
            self.world.log(f"cosmos {self.name} stale read of {item}")
            self._saw(key, self.previous[key])
            return _copy(self.previous[key])
        created = self.created.get(key)
        if (
            key not in self.previous
            and created is not None
            and (self.world.clock.now - created).total_seconds() < NEW_DOCUMENT_LAG
            and self.world.faults.new_document_lag(f"{self.name} {item}")
        ):
            # A replica another host reads from has not seen the create yet.
            self.world.log(f"cosmos {self.name} read of {item} before it replicated: 404")
            raise _error(
                CosmosResourceNotFoundError, 404, "Entity with the specified id does not exist"
            )
        self._saw(key, self.docs[key])
        return _copy(self.docs[key])

    @staticmethod
    def _match(current: dict, etag: str | None, match_condition: Any) -> None:
        """As the SDK reads the two (azure.cosmos._base._get_match_headers): an
        etag is a condition only with its match condition, and one without
        the other is refused before any request."""
        if match_condition is None and etag is not None:
            raise ValueError("'etag' specified without 'match_condition'.")
        if match_condition is not None:
            if match_condition != MatchConditions.IfNotModified:
                raise TypeError(f"the fake supports IfNotModified only, not {match_condition}")
            if not etag:
                raise ValueError("'match_condition' specified without 'etag'.")
            if current["_etag"] != etag:
                raise _error(CosmosAccessConditionFailedError, 412, "Precondition failed")

    async def replace_item(
        self,
        item: str,
        body: dict,
        etag: str | None = None,
        match_condition: Any = None,
        response_hook=None,
        **_: Any,
    ) -> dict:
        await self._op("replace", response_hook)
        key = self._key_of(body)
        current = self.docs.get(key)
        if current is None:
            raise _error(
                CosmosResourceNotFoundError, 404, "Entity with the specified id does not exist"
            )
        self._match(current, etag, match_condition)
        self.previous[key] = current
        self.docs[key] = self._stamp(body)
        self._saw(key, self.docs[key])
        self._wrote(current, self.docs[key])
        self._answer_lost("replace")
        return _copy(self.docs[key])

    async def delete_item(
        self,
        item: str,
        partition_key: Any,
        etag: str | None = None,
        match_condition: Any = None,
        response_hook=None,
        **_: Any,
    ) -> None:
        await self._op("delete", response_hook)
        key = (str(partition_key), str(item))
        if key not in self.docs:
            self._answer_lost("delete", missing=True)  # a 404 can be lost on its way too
            raise _error(
                CosmosResourceNotFoundError, 404, "Entity with the specified id does not exist"
            )
        self._match(self.docs[key], etag, match_condition)
        if self.on_delete is not None:
            self.on_delete(self.docs[key])
        self.deleted[key] = (self.docs.pop(key), self.world.clock.now)
        self.previous.pop(key, None)
        self.world.log(f"cosmos {self.name} delete {item}")
        self._answer_lost("delete")

    async def execute_item_batch(
        self, batch_operations: list, partition_key: Any, response_hook=None, **_: Any
    ) -> list:
        """A transactional batch of deletes in one partition (all the
        adapters use): one request; if any operation fails, none applies and
        CosmosBatchOperationError names the first that failed."""
        await self._op("batch", response_hook)
        keys = []
        for index, (op, args, *_rest) in enumerate(batch_operations):
            if op != "delete":
                raise NotImplementedError(f"batch operation {op}")
            key = (str(partition_key), str(args[0]))
            if key not in self.docs:
                raise CosmosBatchOperationError(
                    error_index=index,
                    headers={},
                    status_code=404,
                    message="Entity with the specified id does not exist",
                    operation_responses=[],
                )
            keys.append(key)
        for key in keys:
            if self.on_delete is not None:
                self.on_delete(self.docs[key])
            self.deleted[key] = (self.docs.pop(key), self.world.clock.now)
            self.previous.pop(key, None)
            self.world.log(f"cosmos {self.name} delete {key[1]} (batch)")
        self._answer_lost("batch")
        return [{"statusCode": 204} for _ in keys]

    def _view(self) -> dict[tuple[str, str], dict]:
        """The documents a query reads: now and then (the fallible world's
        `query_lag`, one draw per query) a lagging replica's, where every
        document written since holds its previous version."""
        if self.previous and self.world.faults.query_lag(self.name):
            self.world.log(f"cosmos {self.name} query on a lagging replica")
            seen = self._seen.get(self.session(), {})
            return {
                **self.docs,
                **{
                    k: v
                    for k, v in self.previous.items()
                    if k in self.docs and seen.get(k, 0) < self._version(self.docs[k])
                },
            }
        now = self.world.clock.now
        for key in [
            k for k, (_, at) in self.deleted.items() if (now - at).total_seconds() > DELETED_LAG
        ]:
            del self.deleted[key]
        if (self.previous or self.deleted) and self.lagging("query"):
            # The lagging Supervisor's replica: every document written since
            # in its previous version, and those deleted lately still there.
            self.world.log(f"cosmos {self.name} query on a lagging replica (deletes unseen)")
            gone = {k: doc for k, (doc, _) in self.deleted.items() if k not in self.docs}
            return {
                **gone,
                **self.docs,
                **{k: v for k, v in self.previous.items() if k in self.docs},
            }
        return self.docs

    def query_items(
        self,
        query: str,
        parameters: list | None = None,
        partition_key: Any = None,
        response_hook=None,
        **_: Any,
    ):
        container = self

        class _Async:
            def __aiter__(self):
                return self._gen()

            async def _gen(self):
                await container._op("query", response_hook)
                parsed = _PARSED.get(query)
                if parsed is None:
                    parsed = _PARSED[query] = _Query(query)
                params = {p["name"]: p["value"] for p in (parameters or [])}
                view = [
                    (key, d)
                    for key, d in sorted(container._view().items())
                    if partition_key is None or key[0] == str(partition_key)
                ]
                for key, d in view:
                    # The replica's session token: the session has seen its view.
                    if key in container.docs:
                        container._saw(key, d)
                docs = [d for _, d in view]
                if "COUNT(1)" in query and params.get("@state") == "Processing":
                    container._note_missed_claims(view)
                items = parsed.run(docs, params)
                if container.name == "index" and items:
                    container.world.log(
                        f"cosmos index query {params} -> {[d.get('id', d) if isinstance(d, dict) else d for d in items]}"
                    )
                for item in items:
                    yield item

        return _Async()


class SimDatabase:
    """`CosmosClient.create_database_if_not_exists(...)`'s database proxy."""

    def __init__(self, client: SimCosmosClient, name: str) -> None:
        self.client = client
        self.name = name

    async def create_container_if_not_exists(self, id: str, partition_key: Any = None, **_: Any):
        await self.client._setup(f"{self.name}/{id}")
        return self.client.containers[id]


class SimCosmosClient:
    """What the local stack's container setup (adapters.cosmos_client.
    ensure_container, adapters.recovery_index.ensure_index_container) needs of
    azure.cosmos.aio.CosmosClient: the containers exist already (the
    simulation builds them); each setup call is a scheduling point and meets
    the same faults as any other call of the account."""

    def __init__(self, world, containers: dict[str, SimContainer]) -> None:
        self.world = world
        self.containers = containers

    async def create_database_if_not_exists(self, id: str, **_: Any) -> SimDatabase:
        await self._setup(id)
        return SimDatabase(self, id)

    async def _setup(self, what: str) -> None:
        await self.world.point(f"cosmos.setup.{what}")
        failure = self.world.faults.cosmos_call("setup", what)
        if failure == "outage":
            failure = "cosmos_503" if self.world.counters["cosmos_outage"] % 2 else "refused"
        if failure is not None:
            raise _failure(failure, f"setup {what}")

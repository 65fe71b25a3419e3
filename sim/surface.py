"""The fault surface (`python -m sim --fault-surface`, issue 21).

Two halves:

- `scan()`: every call site in the product's code (statically, by `ast`) of an
  SDK method that reaches Azure or the remote service: Cosmos container
  methods, Service Bus sends, settlements and receives, the Durable client,
  aiohttp requests. Each site gets the fault kinds applicable to it
  (`APPLICABLE`), named as the simulation names them; a kind marked in
  `NOT_SIMULATED` is one the simulation cannot inject yet.
- `Recorder`: while the simulation runs with the flag, every fault injected at
  a call (a `Faults.draw` hit of a call-level kind, a 429 that reaches the
  product, an outage or decline answering a remote call, a lost lock at a
  settlement, a crash at an await point) is attributed to the first product
  frame on the stack at that moment (`sim.world` calls `attribute`), with the
  simulator frame just inside it (the fake's method). Off unless the flag is
  on: `sim.world.SURFACE` is None and the hooks cost one comparison.

`report()` joins the two: per call site the kinds injected there (with
counts) and the applicable kinds never injected there (the gaps). Where the
simulation fakes a port *above* the adapter (the MessagePublisher, the
agents' ReplySender and Settlement, the RemoteService), the adapter's SDK call
never runs in the simulation: its kinds stay gaps, and what was injected at
the port is shown beside it (`STAND_INS`)."""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The product's packages and modules (console/ is the operator UI, which the
# simulation does not drive; `scan(packages=...)` can add it).
PRODUCT = (
    "adapters",
    "agents",
    "activities",
    "orchestrators",
    "submit",
    "supervisor",
    "reporting",
    "triggers",
    "bootstrap.py",
)

# --- what an SDK call is -------------------------------------------------------

COSMOS_WRITE = {
    "create_item",
    "replace_item",
    "upsert_item",
    "delete_item",
    "patch_item",
    "execute_item_batch",
    "delete_all_items_by_partition_key",
}
COSMOS_READ = {
    "read_item",
    "query_items",
    "read_all_items",
    "read_items",
    "query_items_change_feed",
}
COSMOS_SETUP = {"create_container_if_not_exists", "create_database_if_not_exists"}
SB_SEND = {"send_messages", "schedule_messages", "cancel_scheduled_messages"}
SB_SETTLE = {
    "complete_message",
    "abandon_message",
    "dead_letter_message",
    "defer_message",
    "renew_message_lock",
}
# The Functions binding's ServiceBusMessageActions (`actions.complete`, ...).
SB_ACTIONS = {"complete", "abandon", "deadletter", "dead_letter", "defer", "renew_message_lock"}
SB_RECEIVE = {"receive_messages", "peek_messages", "receive_deferred_messages"}
DURABLE_UNIQUE = {
    "start_new",
    "raise_event",
    "purge_instance_history",
    "purge_instance_history_by",
    "get_status_all",
    "get_status_by",
    "signal_entity",
    "read_entity_state",
}
DURABLE_GENERIC = {"get_status", "terminate", "rewind", "suspend", "resume"}
HTTP = {"get", "post", "put", "patch", "delete", "head", "request"}

# Applicable kinds per service, as the simulation names them. A kind in
# NOT_SIMULATED is applicable but the simulation has no such fault.
APPLICABLE: dict[str, tuple[str, ...]] = {
    # a 429 that reaches the product (after the SDK's own retries), a 503 or
    # refused connection, a call during an outage of the account, a crash at
    # the call (before its effect) and at the next await point after it, and
    # for a write its answer lost after its effect
    "cosmos write": (
        "throttle_429",
        "crash",
        "crash_after",
        "cosmos_503",
        "cosmos_outage",
        "cosmos_timeout_after",
    ),
    "cosmos read": (
        "throttle_429",
        "session_lag",
        "crash",
        "crash_after",
        "cosmos_503",
        "cosmos_outage",
    ),
    "cosmos setup": ("throttle_429", "cosmos_503", "cosmos_outage", "crash", "crash_after"),
    "servicebus send": (
        "send_fail",
        "message_duplicate",
        "message_delay",
        "crash",
        "crash_after",
        "send_timeout_after",
        "servicebus_outage",
    ),
    "servicebus settle": ("lock_lost", "settle_fail", "settle_timeout_after", "servicebus_outage"),
    "servicebus receive": ("receive_fail",),
    "durable": ("durable_fail", "durable_fail_after", "crash", "crash_after"),
    "http": (
        "outage",
        "outage_lost",
        "rate_limited",
        "decline",
        "odd_answer",
        "crash",
        "crash_after",
        "http_timeout",
    ),
}
NOT_SIMULATED: dict[str, str] = {}
# Sim kinds drawn at a call (attributed to the stack); every other drawn kind is
# world-level (drawn at setup or by the world's own actors) and not attributed.
CALL_KINDS = {
    "status_send_fail": "send_fail",
    "alert_send_fail": "send_fail",
    "reply_send_fail": "send_fail",
    "message_duplicate": "message_duplicate",
    "message_delay": "message_delay",
    "session_lag": "session_lag",
    "durable_fail": "durable_fail",
    "durable_fail_after": "durable_fail_after",
    "odd_answer": "odd_answer",
    "receive_fail": "receive_fail",
}
# Fakes that stand in for a port above the adapter: their faults land on the
# port's callers, and the adapter's SDK method (value) never runs. None since
# the simulation fakes the SDK clients below the adapters (sim/bus.py,
# sim/remote.py): kept so that a new port faked above its adapter shows as such.
STAND_INS: dict[str, tuple[tuple[str, str], ...]] = {}

# The targeted pass (`--fault-surface`, after the seeds): a kind a site still
# lacks is injected at the site's first call in a schedule that reached it.
# Per sim draw kind, the surface kinds it can be forced as, and the variant of
# the draw that is that kind (None: the draw has one). World-level kinds (a
# downstream outage window, a permanent decline) are not forcible at one call.
FORCIBLE: dict[str, dict[str, str | None]] = {
    "cosmos_fail": {"throttle_429": "throttle_429", "cosmos_503": "cosmos_503"},
    "cosmos_answer_lost": {"cosmos_timeout_after": None},
    "session_lag": {"session_lag": None},
    "query_lag": {"session_lag": None},
    "new_document_lag": {"session_lag": None},
    "settle_fail": {
        "settle_fail": "dropped",
        "lock_lost": "lock_lost",
        "settle_timeout_after": "after",
    },
    "send_lost": {"send_timeout_after": "after", "send_fail": "refused"},
    "status_send_fail": {"send_fail": None},
    "alert_send_fail": {"send_fail": None},
    "reply_send_fail": {"send_fail": None},
    "message_duplicate": {"message_duplicate": None},
    "message_delay": {"message_delay": None},
    "durable_fail": {"durable_fail": None},
    "durable_fail_after": {"durable_fail_after": None},
    "odd_answer": {"odd_answer": None},
    "slow_answer": {"http_timeout": None},
    "receive_fail": {"receive_fail": None},
}
# Kinds forced outside a draw: a crash at a scheduling point (sim.world.World.run)
# and a short Cosmos or Service Bus outage opened at the call (sim.world.Faults.cosmos_call,
# Faults.bus_outage).
FORCED_ELSEWHERE = {"crash", "crash_after", "cosmos_outage", "servicebus_outage"}


def forcible(kind: str) -> bool:
    return kind in FORCED_ELSEWHERE or any(kind in kinds for kinds in FORCIBLE.values())


@dataclass(frozen=True)
class Site:
    path: str  # relative to the repository
    line: int
    end_line: int
    function: str  # enclosing qualname
    func_span: tuple[int, int]
    service: str
    method: str

    @property
    def applicable(self) -> tuple[str, ...]:
        kinds = APPLICABLE[self.service]
        if self.service == "durable" and self.method.startswith(("get_status", "read_")):
            # a read has no effect to lose the answer of: a failure after it is one before it
            kinds = tuple(k for k in kinds if k != "durable_fail_after")
        return kinds

    def label(self) -> str:
        return f"{self.path}:{self.line} {self.function} ({self.service}: {self.method})"


def _service(method: str, receiver: str) -> str | None:
    r = receiver.lower()
    if method in COSMOS_WRITE:
        return "cosmos write"
    if method in COSMOS_READ:
        return "cosmos read"
    if method in COSMOS_SETUP:
        return "cosmos setup"
    if method in SB_SEND:
        return "servicebus send"
    if method in SB_SETTLE or (method in SB_ACTIONS and "actions" in r):
        return "servicebus settle"
    if method in SB_RECEIVE:
        return "servicebus receive"
    if method in DURABLE_UNIQUE or (
        method in DURABLE_GENERIC and ("client" in r or "durable" in r)
    ):
        return "durable"
    if method in HTTP and "session" in r:
        return "http"
    return None


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.scope: list[str] = []
        self.spans: list[tuple[int, int]] = []
        self.sites: list[Site] = []

    def _scoped(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.spans.append((node.lineno, node.end_lineno or node.lineno))
        self.generic_visit(node)
        self.scope.pop()
        self.spans.pop()

    visit_ClassDef = _scoped
    visit_FunctionDef = _scoped
    visit_AsyncFunctionDef = _scoped

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # A call `x.m(...)` and a method handed over uncalled (`asyncio.to_thread(x.m, ...)`).
        service = _service(node.attr, ast.unparse(node.value))
        if service is not None:
            span = self.spans[-1] if self.spans else (1, 10**9)
            self.sites.append(
                Site(
                    self.path,
                    node.lineno,
                    node.end_lineno or node.lineno,
                    ".".join(self.scope) or "<module>",
                    span,
                    service,
                    node.attr,
                )
            )
        self.generic_visit(node)


def product_files(root: Path = ROOT, packages: tuple[str, ...] = PRODUCT) -> list[Path]:
    files: list[Path] = []
    for name in packages:
        p = root / name
        files.extend([p] if p.is_file() else sorted(p.rglob("*.py")))
    return files


def scan(root: Path = ROOT, packages: tuple[str, ...] = PRODUCT) -> list[Site]:
    """Every SDK call site in the product's files under `root` (never sim/,
    tests/, devstack/ or bench/: only `packages` are read)."""
    sites: list[Site] = []
    for file in product_files(root, packages):
        rel = file.relative_to(root).as_posix()
        scanner = _Scanner(rel)
        scanner.visit(ast.parse(file.read_text(encoding="utf-8"), filename=rel))
        sites.extend(scanner.sites)
    return sorted(sites, key=lambda s: (s.path, s.line))


# --- dynamic attribution -------------------------------------------------------

_SIM_DIR = Path(__file__).resolve().parent
REACH_SEEDS = 6  # seeds kept per product call for the targeted pass


@dataclass
class Target:
    """One (site, kind) to force at the site's first call in a schedule."""

    site: Site
    kind: str
    done: bool = False

    def spec(self) -> str:
        return f"{self.site.path}:{self.site.line}:{self.kind}"


def parse_target(spec: str, sites: list[Site]) -> Target:
    """`path:line:kind` (as the replay command prints it) -> a Target."""
    try:
        path, line, kind = spec.rsplit(":", 2)
        number = int(line)
    except ValueError:
        raise ValueError(f"--target {spec!r}: expected path:line:kind") from None
    found = [s for s in sites if s.path == path and s.line == number]
    if not found:
        raise ValueError(f"--target {spec!r}: no SDK call site at {path}:{number}")
    site = found[0]
    if kind not in site.applicable or not forcible(kind):
        raise ValueError(
            f"--target {spec!r}: {kind} cannot be forced there "
            f"(applicable: {' '.join(k for k in site.applicable if forcible(k))})"
        )
    return Target(site, kind)


@dataclass
class Recorder:
    """Faults injected at calls, by (product file, line, fake's qualname)."""

    root: Path = ROOT
    packages: tuple[str, ...] = PRODUCT
    hits: Counter[tuple[str, int, str, str]] = field(default_factory=Counter)
    unattributed: Counter[str] = field(default_factory=Counter)
    _product: dict[str, str | None] = field(default_factory=dict)
    # The targeted pass: the schedule running now (its seed), the seeds that
    # reached each product call (first few, by (path, line, fakes)), and the
    # one (site, kind) to force in this schedule.
    seed: int | None = None
    reached: dict[tuple[str, int, str], list[int]] = field(default_factory=dict)
    target: Target | None = None
    _sites: list[Site] | None = None
    _matches: dict[tuple[str, int, str], list[Site]] = field(default_factory=dict)

    def _rel(self, filename: str) -> str | None:
        """The product-relative path of a code file, or None (cached per file)."""
        if filename in self._product:
            return self._product[filename]
        rel: str | None = None
        try:
            path = Path(filename).resolve().relative_to(self.root).as_posix()
        except ValueError:
            path = None
        if path is not None:
            top = path.split("/", 1)[0]
            if top in self.packages or path in self.packages:
                rel = path
        self._product[filename] = rel
        return rel

    def where(self, frame: FrameType | None) -> tuple[str, int, str] | None:
        """(product path, line, fakes) of the first product frame outward from
        `frame`; `fakes`: the qualnames of the frames inside it, innermost
        first, joined by "|" (the fake's method, and any wrapper around it)."""
        inner: list[str] = []
        while frame is not None:
            code = frame.f_code
            rel = self._rel(code.co_filename)
            if rel is not None:
                at = (rel, frame.f_lineno, "|".join(inner))
                if self.seed is not None:
                    seeds = self.reached.setdefault(at, [])
                    if len(seeds) < REACH_SEEDS and self.seed not in seeds:
                        seeds.append(self.seed)
                return at
            inner.append(code.co_qualname)
            frame = frame.f_back
        return None

    def attribute_draw(self, drawn: str, frame: FrameType | None) -> None:
        """A fault drawn by sim.world.Faults.draw, at the call in `frame`:
        attributed under its call kind, when it is one (CALL_KINDS)."""
        if drawn in CALL_KINDS:
            self.attribute(CALL_KINDS[drawn], frame)

    def attribute(self, kind: str, frame: FrameType | None) -> None:
        at = self.where(frame)
        if at is None:
            self.unattributed[kind] += 1
            return
        self.hits[(*at, kind)] += 1

    def at(self, where: tuple[str, int, str] | None, kind: str) -> None:
        if where is None:
            self.unattributed[kind] += 1
        else:
            self.hits[(*where, kind)] += 1

    # --- the targeted pass
    def sites(self) -> list[Site]:
        """The call sites, scanned once (at install: the code the run loaded,
        whose line numbers the frames carry, even if a file changes meanwhile)."""
        if self._sites is None:
            self._sites = scan(self.root, self.packages)
        return self._sites

    def sites_at(self, where: tuple[str, int, str] | None) -> list[Site]:
        """The static call sites a product frame position stands for (cached)."""
        if where is None:
            return []
        if where not in self._matches:
            self._matches[where] = _sites_for(self.sites(), *where)
        return self._matches[where]

    def _aimed(self, where: tuple[str, int, str] | None) -> bool:
        t = self.target
        return t is not None and not t.done and t.site in self.sites_at(where)

    def force(self, draw_kind: str, frame: FrameType | None) -> str | None:
        """In a targeted schedule: the surface kind to force this draw as, at
        the target's first call, or None. Marks the target done."""
        t = self.target
        if t is None or t.done:
            return None
        kinds = FORCIBLE.get(draw_kind, {})
        if t.kind not in kinds or not self._aimed(self.where(frame)):
            return None
        t.done = True
        return t.kind

    def variant(self, draw_kind: str, kind: str) -> str | None:
        return FORCIBLE[draw_kind][kind]

    def force_outage(self, frame: FrameType | None, kind: str = "cosmos_outage") -> bool:
        t = self.target
        if t is None or t.done or t.kind != kind:
            return False
        if not self._aimed(self.where(frame)):
            return False
        t.done = True
        return True

    def force_crash(self, site: Any, previous: Any, label: str) -> bool:
        """A crash at this scheduling point: the target's call (before its
        effect) or the actor's next point after it."""
        t = self.target
        if t is None or t.done:
            return False
        if t.kind == "crash" and self._aimed(site):
            t.done = True
            return True
        if t.kind == "crash_after" and not label.endswith("throttled") and self._aimed(previous):
            t.done = True
            return True
        return False


def _parts(fakes: str) -> set[str]:
    return {p for q in fakes.split("|") for p in q.split(".")}


def _stand_in(fakes: str) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    for q in fakes.split("|"):
        q = q.replace(".<locals>", "")
        for fake, targets in STAND_INS.items():
            if q.endswith(fake):
                return fake, targets
    return None


def _sites_for(sites: list[Site], path: str, line: int, fake: str) -> list[Site]:
    """The static sites a fault (or call) at (path, line) through the fakes
    `fake` belongs to: the call on that line of the fake's method, else the
    nearest call of that method in the same function."""
    parts = _parts(fake)
    here = [s for s in sites if s.path == path and s.func_span[0] <= line <= s.func_span[1]]
    exact = [s for s in here if s.line <= line <= s.end_line and s.method in parts]
    named = [s for s in here if s.method in parts]
    return exact or sorted(named, key=lambda s: abs(s.line - line))[:1]


def reached_sites(sites: list[Site], recorder: Recorder) -> dict[Site, list[int]]:
    """Per static site, the seeds whose schedules called it (a few)."""
    out: dict[Site, list[int]] = {}
    for (path, line, fake), seeds in recorder.reached.items():
        for s in _sites_for(sites, path, line, fake):
            have = out.setdefault(s, [])
            have.extend(x for x in seeds if x not in have)
    return out


def gaps(sites: list[Site], recorder: Recorder) -> list[tuple[Site, str]]:
    """The (site, kind) pairs applicable and never injected in the run so far."""
    by_site, _ = resolve(sites, recorder)
    return [(s, k) for s in sites for k in s.applicable if not by_site[s].get(k)]


def resolve(
    sites: list[Site], recorder: Recorder
) -> tuple[dict[Site, Counter[str]], dict[tuple[str, int, str], Counter[str]]]:
    """Injected kinds per static site; the rest (port callers, sleeps) by where they landed."""
    by_site: dict[Site, Counter[str]] = {s: Counter() for s in sites}
    other: dict[tuple[str, int, str], Counter[str]] = {}
    for (path, line, fake, kind), n in recorder.hits.items():
        targets = _sites_for(sites, path, line, fake)
        if targets:
            for s in targets:
                by_site[s][kind] += n
        else:
            other.setdefault((path, line, fake), Counter())[kind] += n
    return by_site, other


def _counts(c: Counter[str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(c.items())) or "none"


def report(sites: list[Site], recorder: Recorder) -> tuple[list[str], int]:
    """The listing's lines, and the number of gaps ((site, applicable kind)
    pairs never injected at the site)."""
    by_site, other = resolve(sites, recorder)
    port: dict[tuple[str, str], Counter[str]] = {}  # (path, SDK method) -> kinds at the port
    at_port: dict[tuple[str, int, str], Counter[str]] = {}  # (caller, line, fake) -> kinds
    ported = 0
    for (path, line, fakes), kinds in other.items():
        stood = _stand_in(fakes)
        if stood is None:
            continue
        fake, targets = stood
        ported += sum(kinds.values())
        for target in targets:
            port.setdefault(target, Counter()).update(kinds)
        at_port.setdefault((path, line, fake), Counter()).update(kinds)
    port_lines = [
        f"  {path}:{line} via {fake} (for "
        + ", ".join(f"{p} {m}" for p, m in STAND_INS[fake])
        + f"): {_counts(kinds)}"
        for (path, line, fake), kinds in sorted(at_port.items())
    ]
    stood_in = {t for targets in STAND_INS.values() for t in targets}
    lines = ["fault surface: SDK call sites in the product, kinds injected there in this run"]
    gaps = missing_sim = 0
    for s in sites:
        injected = by_site[s]
        missing = [k for k in s.applicable if not injected.get(k)]
        gaps += len(missing)
        missing_sim += sum(1 for k in missing if k not in NOT_SIMULATED)
        lines.append(f"  {s.label()}")
        lines.append(f"      injected: {_counts(injected)}")
        if (s.path, s.method) in stood_in and not injected:
            lines.append(
                "      not run by the simulation (a fake port stands in above it); "
                f"at the port: {_counts(port.get((s.path, s.method), Counter()))}"
            )
        if missing:
            lines.append(
                "      missing: "
                + " ".join(k + ("*" if k in NOT_SIMULATED else "") for k in missing)
            )
    if port_lines:
        lines.append("port call sites (the simulation fakes the port above the adapter):")
        lines.extend(port_lines)
    elsewhere = sum(sum(c.values()) for c in other.values()) - ported
    lines.append(
        f"elsewhere: {elsewhere} faults at other product frames (clock sleeps and the like), "
        f"{sum(recorder.unattributed.values())} with no product frame on the stack "
        f"({_counts(recorder.unattributed)})"
    )
    if NOT_SIMULATED:
        lines.append(
            "* = a kind the simulation cannot inject yet: "
            + "; ".join(f"{k}: {v}" for k, v in NOT_SIMULATED.items())
        )
    lines.append(
        f"gaps: {missing_sim} of kinds the simulation has, {gaps - missing_sim} of kinds it lacks (*)"
    )
    lines.append(f"fault surface: {len(sites)} call sites, {gaps} gaps")
    return lines, gaps


def install() -> Recorder:
    """Switch attribution on for the runs that follow (sim.world.SURFACE)."""
    from . import world

    recorder = Recorder()
    recorder.sites()
    world.SURFACE = recorder
    return recorder


def uninstall() -> None:
    from . import world

    world.SURFACE = None


__all__ = [
    "APPLICABLE",
    "FORCIBLE",
    "NOT_SIMULATED",
    "Recorder",
    "Site",
    "Target",
    "gaps",
    "install",
    "parse_target",
    "reached_sites",
    "report",
    "resolve",
    "scan",
    "uninstall",
]

"""What the checks read: the state of one schedule as the simulation keeps
it (`Observed`, the base of the checks and of the world's fault set-up, which
`sim.drive.Simulation` fills in), and the helpers both kinds of check use.

The checks come in two kinds: those on the path (`sim.path_checks`), run as
each write, send, call or delivery happens, which record what they find;
and those at the end (`sim.checks`), run once the schedule has stopped,
over the stores, the queues, the remote ledger and what the path checks
recorded."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from adapters.settings import Settings

from .bus import Bus
from .cosmos import SimContainer
from .durable import SimDurable
from .options import Options
from .remote import SimRemote
from .world import World


class Observed:
    """The schedule's state the checks read (set by `Simulation.__init__`)."""

    seed: int
    o: Options
    world: World
    bus: Bus
    state_c: SimContainer
    orders_c: SimContainer
    index_c: SimContainer
    remote: SimRemote
    durable: SimDurable
    settings: Settings
    # What the path checks record as they go (sim.path_checks.PathChecks) and
    # the end reports (EndChecks.report_path_findings).
    deadline_mismatch: list[str]
    quit_early: list[str]
    step_deadline_reused: list[str]
    due_not_recovered: list[str]
    index_not_visited: list[str]
    index_entry_late: list[str]
    live_entry_deleted: list[str]
    cursor_passed: list[str]
    late_calls: list[str]
    long_calls: list[str]
    retried_refusals: list[str]
    wrong_payloads: list[str]  # remote calls whose payload is not their step's fields
    unanswered: list[str]
    uncounted_failures: list[str]
    paced_given_up: list[str]
    count_run_out: list[str]
    bad_identity: list[str]
    lost_requests: list[str]
    lost_copies: list[str]
    overwritten: list[str]
    reply_misrouted: list[str]
    timer_off_deadline: list[str]
    landed_not_written: list[str]
    stopped_reading: list[str]
    status_refused: dict[str, str]  # instance -> its record's state when its status was refused
    # per refusing reply queue: the Starter's sends it refused in its spell (at what time)
    starter_refused: dict[str, list[datetime]]
    # per Starter object (one per host process): (first, last) run
    starter_spans: dict[int, list[datetime]]
    processed_at: dict[str, datetime]  # order key -> when its record was written Processed
    # order key -> (message id, when written) of each outbox entry that carries an alert
    alerting_entries: dict[str, list[tuple[str, datetime]]]
    refused_sends: dict[str, int]  # queue -> sends it refused (any sender, any cause)
    servicebus: Any  # sim.bus.SimServiceBusClient
    hostile: Any  # sim.hostile.Hostile, or None: no forgeries in this schedule
    # The orders: order key -> (application, OrderID), and back.
    orders: dict[str, tuple[str, str]]
    key_of: dict[tuple[str, str], str]
    order_ids: list[str]
    junk: list[str]  # ids of the garbage documents (foreign_docs)
    newer_fields: set[str]  # records a newer version added a field to
    bad: dict[str, str]  # message id -> kind of a bad submission
    changed_resends: list[tuple[str, str]]  # (order key, message id)
    operator_done: set[tuple[str, str]]  # (order key, action)
    undo_sent: dict[str, list[str]]  # instance -> the steps its undo requests name
    supervisor_costs: list[tuple[int, int]]  # (requests, pages) per Supervisor run
    rows: Counter[str]  # transition rows hit (DESIGN.md section 3)
    violations: list[tuple[str, str]]  # (check, detail), in the order found
    bound: timedelta  # the liveness bound after faults stop
    end: datetime  # when the schedule stopped

    def fail(self, check: str, detail: str) -> None:
        self.violations.append((check, detail))

    def _instance(self) -> str | None:
        """The orchestration instance the running task is an activity of."""
        name = self.world._names.get(asyncio.current_task(), "")
        return name.split(":", 2)[2] if name.startswith("act:") else None

    def _actor(self) -> str:
        """Who the running task is: `orchestration` (an activity), `starter`,
        `supervisor`, `submit`, `agent`, `operator`, ..."""
        task = asyncio.current_task()
        name = self.world._names.get(task, "")
        if name.startswith("act:"):
            return "orchestration"
        return name.split(":")[0].rstrip("0123456789")


# What a Cosmos call the store could not answer looks like in an orchestration's
# failure (adapters.cosmos_client.translate_error's transient texts).
_STORE_UNAVAILABLE = (
    "Cosmos DB answered 429",
    "Cosmos DB answered 503",
    "Cosmos DB answered 408",
    "ServiceRequestError",
    "ServiceResponseError",
    "CosmosClientTimeoutError",
)


def store_unavailable(failure: str) -> bool:
    return any(text in failure for text in _STORE_UNAVAILABLE)


def cosmos_text(iso_text: str) -> str:
    """An ISO time as the state store writes it (adapters.state_store.cosmos_time)."""
    from adapters.state_store import cosmos_time

    return cosmos_time(datetime.fromisoformat(iso_text))

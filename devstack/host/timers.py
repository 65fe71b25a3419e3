"""Timer triggers: NCRONTAB (six fields, seconds first) or TimeSpan schedules.

As in the Functions host, a timer's listener is a singleton across host processes:
the host that holds the blob lease ``azure-webjobs-hosts/locks/{hostId}/Host.Functions.{name}.Listener``
in the AzureWebJobsStorage account runs the schedule, the others keep trying to take
the lease. The schedule status (Last, Next, LastUpdated) is kept in
``timers/{hostId}/Host.Functions.{name}/status``, so a listener that starts after a
missed occurrence fires once with ``past_due`` set, and `run_on_startup` fires when
the listener starts. Occurrences missed while the process slept (or the test clock
jumped) are coalesced into one late invocation, with ``past_due`` set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core.exceptions import HttpResponseError, ResourceExistsError
from azure.functions.timer import TimerRequest
from azure.storage.blob.aio import BlobClient, BlobLeaseClient, BlobServiceClient
from croniter import croniter

from .app import FunctionSpec
from .clock import Clock
from .config import resolve_binding_expression
from .errors import HostError
from .invoke import call_function

log = logging.getLogger("devstack.host.timers")

HOSTS_CONTAINER = "azure-webjobs-hosts"
LEASE_SECONDS = 15
RENEW_EVERY = 5.0
ACQUIRE_RETRY = 2.0
PAST_DUE_TOLERANCE = timedelta(seconds=1)


class Schedule:
    """A six-field NCRONTAB expression or a TimeSpan interval (``hh:mm:ss``)."""

    def __init__(self, expression: str) -> None:
        self.expression = expression.strip()
        self.interval: timedelta | None = None
        if re.fullmatch(r"(\d+\.)?\d{1,2}:\d{2}:\d{2}", self.expression):
            days, _, rest = self.expression.rpartition(".")
            h, m, s = (int(x) for x in rest.split(":"))
            self.interval = timedelta(days=int(days or 0), hours=h, minutes=m, seconds=s)
            if self.interval <= timedelta(0):
                raise HostError(f"timer schedule {expression!r} must be a positive interval")
            return
        fields = self.expression.split()
        if len(fields) != 6:
            raise HostError(
                f"timer schedule {expression!r} is not a six-field NCRONTAB expression "
                "({second} {minute} {hour} {day} {month} {day-of-week})"
            )
        if not croniter.is_valid(self.expression, second_at_beginning=True):
            raise HostError(f"timer schedule {expression!r} is not a valid NCRONTAB expression")

    def next_after(self, when: datetime) -> datetime:
        if self.interval is not None:
            return when + self.interval
        it = croniter(self.expression, when.astimezone(UTC), second_at_beginning=True)
        nxt = it.get_next(datetime)
        return nxt if nxt.tzinfo else nxt.replace(tzinfo=UTC)


def _iso(dt: datetime | None) -> str | None:
    return dt.astimezone(UTC).isoformat() if dt else None


def _parse(value: str | None) -> datetime | None:
    if not value:
        return None
    dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


class TimerListener:
    def __init__(
        self,
        spec: FunctionSpec,
        clock: Clock,
        service: BlobServiceClient | None,
        host_id: str,
        client_binding: Callable[[], str],
    ) -> None:
        self.spec = spec
        self.clock = clock
        self.service = service
        self.host_id = host_id
        self.client_binding = client_binding
        expr = resolve_binding_expression(
            spec.trigger["schedule"], purpose=f"schedule of function {spec.name}"
        )
        self.schedule = Schedule(expr)
        self.run_on_startup = bool(spec.trigger.get("runOnStartup"))
        self._stopping = False
        self._lease: BlobLeaseClient | None = None
        self._lost = asyncio.Event()
        self.timer_name = f"Host.Functions.{spec.name}"
        self.next: datetime | None = None  # set while this process runs the schedule

    # -- singleton lease --

    def _lock_blob(self) -> BlobClient:
        assert self.service is not None
        return self.service.get_blob_client(
            HOSTS_CONTAINER, f"locks/{self.host_id}/{self.timer_name}.Listener"
        )

    def _status_blob(self) -> BlobClient:
        assert self.service is not None
        return self.service.get_blob_client(
            HOSTS_CONTAINER, f"timers/{self.host_id}/{self.timer_name}/status"
        )

    async def _acquire(self) -> bool:
        blob = self._lock_blob()
        try:
            await blob.upload_blob(b"", overwrite=False)
        except ResourceExistsError:
            pass
        except HttpResponseError as exc:
            if exc.status_code != 412:  # 412: leased by another host while we tried to create
                raise
        lease = BlobLeaseClient(blob)
        try:
            await lease.acquire(lease_duration=LEASE_SECONDS)
        except HttpResponseError as exc:
            if exc.status_code == 409:
                return False
            raise
        self._lease = lease
        self._lost.clear()
        return True

    async def _renew_loop(self) -> None:
        while not self._stopping and self._lease is not None:
            await asyncio.sleep(RENEW_EVERY)
            try:
                await self._lease.renew()
            except Exception as exc:
                log.warning("timer %s: lost its singleton lease (%s)", self.spec.name, exc)
                self._lease = None
                self._lost.set()
                return

    async def _read_status(self) -> dict[str, Any]:
        try:
            data = await (await self._status_blob().download_blob()).readall()
            return json.loads(data)
        except Exception:
            return {}

    async def _write_status(self, last: datetime | None, nxt: datetime) -> None:
        body = json.dumps(
            {"Last": _iso(last), "Next": _iso(nxt), "LastUpdated": _iso(self.clock.now())}
        )
        try:
            await self._status_blob().upload_blob(body.encode(), overwrite=True)
        except Exception as exc:
            log.warning("timer %s: cannot write its schedule status: %s", self.spec.name, exc)

    # -- schedule --

    async def run(self) -> None:
        while not self._stopping:
            try:
                await self._run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error(
                    "timer %s: listener failed (%s: %s); restarting it",
                    self.spec.name,
                    type(exc).__name__,
                    exc,
                )
                await asyncio.sleep(ACQUIRE_RETRY)

    async def _run(self) -> None:
        first = True
        while not self._stopping:
            if self.service is not None:
                try:
                    got = await self._acquire()
                except Exception as exc:
                    log.warning(
                        "timer %s: storage unavailable for its singleton lease (%s)",
                        self.spec.name,
                        exc,
                    )
                    got = False
                if not got:
                    await asyncio.sleep(ACQUIRE_RETRY)
                    continue
                renew = asyncio.create_task(self._renew_loop())
            else:
                renew = None
            try:
                await self._run_schedule(startup=first)
            finally:
                first = False
                if renew is not None:
                    renew.cancel()
                if self._lease is not None:
                    with contextlib.suppress(Exception):
                        await self._lease.release()
                    self._lease = None

    async def _run_schedule(self, *, startup: bool) -> None:
        status = await self._read_status() if self.service is not None else {}
        now = self.clock.now()
        last = _parse(status.get("Last"))
        recorded_next = _parse(status.get("Next"))
        if recorded_next is not None and recorded_next < now:
            # The occurrence the previous holder recorded was missed: fire once, late.
            await self._fire(recorded_next, past_due=True, last=last)
            last = recorded_next
        elif startup and self.run_on_startup:
            await self._fire(now, past_due=False, last=last)
        nxt = self.schedule.next_after(self.clock.now())
        await self._write_status(last, nxt)
        self.next = nxt
        while not self._stopping and not self._lost.is_set():
            now = self.clock.now()
            if now < nxt:
                await self.clock.wait(nxt, max_wait=0.5)
                continue
            past_due = now - nxt > PAST_DUE_TOLERANCE
            await self._fire(nxt, past_due=past_due, last=last)
            last = nxt
            nxt = self.schedule.next_after(max(self.clock.now(), nxt))
            await self._write_status(last, nxt)
            self.next = nxt
        self.next = None

    async def _fire(self, scheduled: datetime, *, past_due: bool, last: datetime | None) -> None:
        nxt = self.schedule.next_after(scheduled)
        request = TimerRequest(
            past_due=past_due,
            schedule_status={
                "Last": _iso(last),
                "Next": _iso(nxt),
                "LastUpdated": _iso(self.clock.now()),
            },
            schedule={"AdjustForDST": True},
        )
        kwargs: dict[str, Any] = {self.spec.trigger["name"]: request}
        if self.spec.durable_client_param:
            kwargs[self.spec.durable_client_param] = self.client_binding()
        log.info(
            "timer %s fires for %s%s",
            self.spec.name,
            _iso(scheduled),
            " (past due)" if past_due else "",
        )
        try:
            await call_function(self.spec, kwargs)
        except Exception as exc:
            log.warning("timer function %s failed: %s: %s", self.spec.name, type(exc).__name__, exc)

    def stop(self) -> None:
        self._stopping = True
        self._lost.set()
        self.clock.poke()


class TimerTriggers:
    def __init__(
        self,
        specs: list[FunctionSpec],
        clock: Clock,
        storage_connection: str | None,
        host_id: str,
        client_binding: Callable[[], str],
    ) -> None:
        self.specs = specs
        self.clock = clock
        self.storage_connection = storage_connection
        self.host_id = host_id
        self.client_binding = client_binding
        self.service: BlobServiceClient | None = None
        self.listeners: list[TimerListener] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        if not self.specs:
            return
        if self.storage_connection:
            self.service = BlobServiceClient.from_connection_string(self.storage_connection)
            # Probe once without retries, so that a wrong address fails at start in one line.
            probe = BlobServiceClient.from_connection_string(self.storage_connection, retry_total=0)
            try:
                await asyncio.wait_for(probe.create_container(HOSTS_CONTAINER), 15)
            except ResourceExistsError:
                pass
            except Exception as exc:
                await self.service.close()
                raise HostError(
                    f"cannot reach the AzureWebJobsStorage account for timer singletons "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                ) from None
            finally:
                await probe.close()
        self.listeners = [
            TimerListener(s, self.clock, self.service, self.host_id, self.client_binding)
            for s in self.specs
        ]
        self._tasks = [asyncio.create_task(listener.run()) for listener in self.listeners]

    def describe(self) -> list[dict[str, Any]]:
        """Each timer, its schedule, and the next occurrence if this process holds its lease."""
        return [
            {"function": lst.spec.name, "schedule": lst.schedule.expression, "next": _iso(lst.next)}
            for lst in self.listeners
        ]

    async def stop(self) -> None:
        for listener in self.listeners:
            listener.stop()
        for t in self._tasks:
            try:
                await asyncio.wait_for(t, 10)
            except (Exception, asyncio.CancelledError):
                t.cancel()
        if self.service is not None:
            await self.service.close()

"""The standalone agent worker's own loop in the simulation (sim/worker.py,
issue 21): agents/worker's AgentWorker receives, registers with the lock
renewer, limits its concurrency, pauses after a failed receive and drains on
its stop, over a simulated receiver of the bus and on the world's time. And
the checks that watch it can fail."""

from __future__ import annotations

import pytest

from agents.messaging import ReceiverSettlement
from agents.worker import AgentWorker
from sim.system import Options, Simulation, options_for, simulate
from sim.worker import CHECK, WorkerRun
from sim.world import FaultConfig


def _run(seed: int, options: Options, busy_stop: bool | None = None) -> Simulation:
    sim = Simulation(seed, options.orders, options=options)
    if busy_stop is not None:
        for worker in sim.workers:
            worker.busy_stop = busy_stop
    return simulate(sim)


# Every agent request of the first 200 s goes to the worker (share 1.0), and
# half its receives fail.
FAILING_RECEIVES = Options(
    orders=3,
    faults=FaultConfig(receive_fail=0.5),
    workers=(WorkerRun(start=0.0, stop=200.0, concurrency=2, grace=5.0, share=1.0),),
)
# A worker stopped while slow answers keep requests in flight past its
# 0.5 s grace, and a second one that goes on receiving.
STOPPED_IN_FLIGHT = Options(
    orders=3,
    faults=FaultConfig(slow_answers=0.5),
    workers=(
        WorkerRun(start=0.0, stop=40.0, concurrency=8, grace=0.5, share=1.0),
        WorkerRun(start=0.0, stop=200.0, concurrency=2, grace=5.0, share=1.0),
    ),
)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_requests_are_handled_by_the_worker_loop_through_failing_receives(seed):
    sim = _run(seed, FAILING_RECEIVES)

    assert sim.violations == []
    failed = [f for f in sim.world.faults.injected if f.kind == "receive_fail"]
    assert len(failed) >= 3
    assert all("worker0" in f.detail for f in failed)
    (worker,) = sim.workers
    assert worker.receive_failed
    assert worker.ended is not None
    # While the worker ran it received every request (the Functions agent
    # none), each handled by a task of its own and settled.
    assert sim.world.counters["worker received"] >= 3
    assert not [
        line
        for line in sim.world.trace
        if line.startswith("t+") and "deliver agent-requests" in line and _at(line) < 200
    ]
    assert all(
        h.task is not None and h.task.done() and h.settled for h in worker.handlings.values()
    )
    # It paused after each failed receive and went on receiving.
    for failed_at in worker.receive_failed:
        later = [t for t in worker.receive_calls if t > failed_at]
        assert not later or (later[0] - failed_at).total_seconds() >= 2.0


def test_requests_in_flight_at_the_stop_are_abandoned_and_handled_again():
    sim = _run(5, STOPPED_IN_FLIGHT)

    assert sim.violations == []
    first = sim.workers[0]
    cancelled = [h for h in first.handlings.values() if h.task and h.task.cancelled()]
    assert cancelled
    assert all(h.settled == ["abandon"] for h in cancelled)
    again = {h.delivery.message_id for h in sim.workers[1].handlings.values()}
    assert {h.delivery.message_id for h in cancelled} <= again


def test_requests_in_flight_at_the_stop_finish_within_the_grace():
    # One at a time, stopped while it handles one: the loop waits on it or the
    # stop, so the drain has it in flight, and 30 s are enough to finish it.
    options = Options(
        orders=3,
        workers=(WorkerRun(start=0.0, stop=5.0, concurrency=1, grace=30.0, share=1.0),),
    )
    sim = _run(1, options, busy_stop=True)

    assert sim.violations == []
    (worker,) = sim.workers
    assert worker.stopped_at is not None
    in_flight = [h for h in worker.handlings.values() if h.ended and h.ended > worker.stopped_at]
    assert in_flight
    assert not [h for h in in_flight if h.task is None or h.task.cancelled()]
    assert all(h.settled for h in in_flight)
    assert "stop deferred until it is at its limit" in " ".join(sim.world.trace)


def test_the_check_sees_a_worker_that_does_not_pause_after_a_failed_receive(monkeypatch):
    wait = AgentWorker._until_stopped

    async def no_pause(self, stop, tasks, timeout=None):
        if timeout is None:
            await wait(self, stop, tasks, timeout)

    monkeypatch.setattr(AgentWorker, "_until_stopped", no_pause)
    sim = _run(1, FAILING_RECEIVES)

    assert any(check == CHECK and "no pause" in detail for check, detail in sim.violations)


def test_the_check_sees_a_handler_cancelled_without_abandoning(monkeypatch):
    async def kept(self) -> None:
        return None

    monkeypatch.setattr(ReceiverSettlement, "abandon", kept)
    sim = _run(5, STOPPED_IN_FLIGHT)

    assert any(
        check == CHECK and "without abandoning" in detail for check, detail in sim.violations
    )


def test_schedules_draw_worker_runs_and_failing_receives():
    drawn = [options_for(seed, 3) for seed in range(1, 41)]
    with_workers = [o for o in drawn if o.workers]
    assert with_workers
    assert len(with_workers) < len(drawn)
    assert any(o.faults.receive_fail > 0 for o in with_workers)
    assert all(r.stop <= o.fault_window for o in with_workers for r in o.workers)


def _at(line: str) -> float:
    return float(line.split(" ", 1)[0].removeprefix("t+"))

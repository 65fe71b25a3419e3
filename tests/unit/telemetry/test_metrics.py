"""The app's metrics are real OpenTelemetry instruments, recorded where the
events are logged (reporting, the Starter, the Supervisor, Submit)."""

from __future__ import annotations

from adapters import telemetry


def _points(reader, name):
    data = reader.get_metrics_data()
    out = []
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    out.extend(metric.data.data_points)
    return out


def _sum(reader, name, **attrs):
    return sum(
        p.value
        for p in _points(reader, name)
        if all(p.attributes.get(k) == v for k, v in attrs.items())
    )


def test_terminal_statuses_count_their_outcome(metric_reader):
    before = {k: _sum(metric_reader, f"orders.{k}") for k in ("processed", "failed", "compensated")}
    for status in (
        "Processed",
        "Processed",
        "Failed",
        "CompensationFailed",
        "Compensated",
        "Received",
    ):
        telemetry.count_terminal_status(status)
    after = {k: _sum(metric_reader, f"orders.{k}") for k in ("processed", "failed", "compensated")}
    assert {k: after[k] - before[k] for k in after} == {
        "processed": 2,
        "failed": 2,
        "compensated": 1,
    }


async def test_a_supervisor_run_records_recoveries_and_its_scan_cost(metric_reader):
    from supervisor.supervisor import SupervisorReport, _record_metrics

    before = _sum(metric_reader, "orders.recoveries", outcome="recovered")
    _record_metrics(
        SupervisorReport(read=7, recovered=3, failed=1, requests=4, request_charge=12.5)
    )
    assert _sum(metric_reader, "orders.recoveries", outcome="recovered") - before == 3
    charges = _points(metric_reader, "supervisor.scan.request_charge")
    assert charges
    assert charges[0].max >= 12.5


async def test_the_starter_sets_the_backlog_gauge_and_counts_attempts(metric_reader):
    from tests.unit.orchestrators.driver import StartingClient, World

    world = World()
    await world.submitted("B1")
    await world.submitted("B2")
    before = _sum(metric_reader, "orders.attempts")
    report = await world.starter().run(StartingClient())
    assert report.claimed == 2
    assert _sum(metric_reader, "orders.attempts") - before == 2
    backlog = {p.attributes["state"]: p.value for p in _points(metric_reader, "orders.backlog")}
    assert backlog == {"Pending": 2, "Processing": 0}

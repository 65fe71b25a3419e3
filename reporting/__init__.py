"""Status reporting and operator alerts (docs/design.md §2 item 8, §4 'Operational
visibility'): what the submitting application and the operators are told."""

from reporting.alerts import Alerts
from reporting.status import StatusOutbox, StatusReporter

__all__ = ["Alerts", "StatusOutbox", "StatusReporter"]

"""What the submitting application (statuses) and the operators (alerts) are told."""

from reporting.alerts import Alerts
from reporting.status import Delivery, StatusOutbox, StatusReporter

__all__ = ["Alerts", "Delivery", "StatusOutbox", "StatusReporter"]

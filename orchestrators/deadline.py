"""The deadline race every remote step uses (DESIGN.md §4 'Deadline race').

`yield from race(context, task, deadline)` waits for `task` (an external event
or an activity) or the durable timer, whichever completes first; when the task
wins, the timer is cancelled so the instance does not linger until it fires.
Returns the task's result, or None when the deadline passed first."""

from __future__ import annotations

from datetime import datetime


def race(context, task, deadline: datetime):
    timer = context.create_timer(deadline)
    winner = yield context.task_any([task, timer])
    if winner is timer:
        return None
    if not timer.is_completed:
        timer.cancel()
    return task.result

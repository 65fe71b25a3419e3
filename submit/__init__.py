"""Submit: the front door. Turns each `OrderSubmitted` message into an order and
a state record, idempotently, or dead-letters it with a reason."""

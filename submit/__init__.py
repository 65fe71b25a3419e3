"""Submit: the front door. Takes `OrderSubmitted` messages off the `orders`
queue and turns each into an order (orders DB) and a state record (state store),
idempotently, or dead-letters it with a reason."""

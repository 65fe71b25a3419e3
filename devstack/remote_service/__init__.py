"""A small HTTP service that plays the downstream systems (inventory, payment,
shipping) the Agents call, with the guarantees a well-behaved remote service
gives and the failures a real one has, on request.

    python -m devstack.remote_service --port 7081 [--state-file state.json]

- `POST /{service}/{operation}` with headers `Idempotency-Key: {OrderID}/{step}`
  and `Fencing-Token: {attempt}` and a JSON object body.
- Idempotency: one side effect per (key, operation); a repeat gets the stored
  answer (header `Idempotent-Replayed: true`).
- Fencing: a token lower than the highest seen for the order is refused with
  409 `{"code": "FencingTokenRejected", ...}`.
- Fault injection, side-effect counts and reset under `/_admin/` (see app.py).
- `--state-file`: the ledger survives a restart (faults do not).
"""

from devstack.remote_service.app import create_app
from devstack.remote_service.faults import FaultRule
from devstack.remote_service.ledger import CATALOG, Ledger

__all__ = ["CATALOG", "FaultRule", "Ledger", "create_app"]

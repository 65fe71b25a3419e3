"""Which shard (one whole deployment) an order belongs to, the same in every
process, language and version: SHA-256 of `{AppId}:{OrderID}` in UTF-8, its
first 8 bytes big-endian, modulo the shard count (docs/adr/020e-task-hub-shards.md).

    python -m domain.shards --count 4 webshop ORD-1   # prints 1, its shard
"""

from __future__ import annotations

import argparse
import hashlib
import sys

from domain.boundary import check_order_id

#: Shard counts a deployment may state (SHARD_COUNT); three digits are plenty.
MAX_SHARDS = 999


def check_shard_count(count: int) -> int:
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"a shard count must be 1 to {MAX_SHARDS}, not {count}")
    return count


def shard_of(app_id: str, order_id: str, count: int) -> int:
    """The shard (0 .. count-1) of application `app_id`'s order `order_id`."""
    check_shard_count(count)
    check_order_id(order_id)
    if count == 1:
        return 0
    digest = hashlib.sha256(f"{app_id}:{order_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="print the shard of an order")
    parser.add_argument("--count", type=int, required=True, help="the deployment's SHARD_COUNT")
    parser.add_argument("app_id")
    parser.add_argument("order_id")
    args = parser.parse_args(argv)
    try:
        print(shard_of(args.app_id, args.order_id, args.count))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

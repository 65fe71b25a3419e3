"""Resume a Supervisor-style scan from a saved continuation token, in a fresh
process: `python -m tests.integration.adapters.resume_scan ARGS`. Prints one
JSON object: {"pages": [[id, ...], ...]} (used by test_expired_paging)."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import datetime

from adapters.cosmos_client import build_client
from adapters.settings import CosmosAccount
from adapters.state_store import CosmosStateStore


async def scan(args: argparse.Namespace) -> list[list[str]]:
    account = CosmosAccount(args.endpoint, args.key, verify_tls=False)
    client = build_client(account)
    try:
        container = client.get_database_client(args.database).get_container_client(args.container)
        store = CosmosStateStore(container)
        now, start = datetime.fromisoformat(args.now), datetime.fromisoformat(args.window_start)
        token: str | None = args.token
        pages: list[list[str]] = []
        while True:
            page, token = await store.query_expired(now, start, args.page_size, token)
            pages.append([record.id for record, _etag in page])
            if token is None:
                return pages
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--endpoint", "--key", "--database", "--container", "--now", "--window-start"):
        parser.add_argument(name, required=True)
    parser.add_argument("--page-size", type=int, required=True)
    parser.add_argument("--token", required=True)
    args = parser.parse_args()
    print(json.dumps({"pages": asyncio.run(scan(args))}))


if __name__ == "__main__":
    main()

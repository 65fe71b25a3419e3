"""Writes per recovery-index partition key per simulated second as the order
rate grows (issue 23 item 3, docs/adr/019b-sharded-recovery-index.md).

Drives the real `CosmosRecoveryIndex` on the simulation's Cosmos fake
(sim/partitions.py `drive_index`: orders claimed at a fixed rate, each
attempt's entry added at its claim and discarded five seconds later, as
workflow 2.0 does) and prints one line per (rate, shards):

    rate=<orders/s> shards=<n> keys=<partition keys written> writes_per_s=<all keys>
        mean_per_key_s=<writes per busy key-second> peak_per_key_s=<most in one key-second>

    python bench/index_partitions.py [--rates 100,1000] [--shards 1,16] [--seconds 60]

With `--shards scaled` the count grows with the rate (rate / 25, at least 1):
the figure a deployment sized by the capacity model would see. The fake
charges nothing per request: multiply by the RU of a write (bench/capacity.py)
for the load on one logical partition.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.partitions import drive_index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="100,1000")
    parser.add_argument("--shards", default="1,16,scaled")
    parser.add_argument("--seconds", type=int, default=60)
    args = parser.parse_args(argv)
    try:
        rates = [int(r) for r in args.rates.split(",")]
        counts = [s if s == "scaled" else int(s) for s in args.shards.split(",")]
    except ValueError:
        parser.error("--rates and --shards take whole numbers (and 'scaled' for --shards)")
    if any(r < 1 for r in rates) or any(c != "scaled" and not 1 <= c <= 999 for c in counts):
        parser.error("rates must be at least 1, shard counts 1 to 999")
    if args.seconds < 1:
        parser.error("--seconds must be at least 1")
    for count in counts:
        for rate in rates:
            shards = max(1, rate // 25) if count == "scaled" else count
            s = drive_index(rate, int(shards), seconds=args.seconds).summary
            print(
                f"rate={rate} shards={shards}{' (scaled)' if count == 'scaled' else ''} "
                f"keys={s['keys']} writes_per_s={s['writes_per_second']:.0f} "
                f"mean_per_key_s={s['mean_per_key_second']:.1f} "
                f"peak_per_key_s={s['peak_per_key_second']}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

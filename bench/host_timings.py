"""Where an order's time goes inside the hosts of one pipeline-bench run.

    BENCH_KEEP_RUN_DIR=1 python bench/pipeline_bench.py --configs 1x200 --set HOST_TIMINGS=1
    python bench/host_timings.py /tmp/bench-XXXX

Sums what bench/probe/sitecustomize.py's `Timings` wrote in each host
process (<run>/cosmos-calls/<pid>.timing): per Scheduler activity, Submit's
handler and each queue's sends, the count and mean seconds (and how many
sends found every link to their queue busy); the admission document's takes
(wanted, granted, refused) and each count's limit, rate and leased slots.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def summary(run_dir: Path) -> list[str]:
    files = sorted((run_dir / "cosmos-calls").glob("*.timing"))
    if not files:
        raise SystemExit(f"{run_dir}: no timings (run the bench with --set HOST_TIMINGS=1)")
    sums: Counter[str] = Counter()
    counts: list[dict] = []
    for path in files:
        data = json.loads(path.read_text())
        sums.update(data["sums"])
        counts.extend(data["counts"])
    lines = [f"{len(files)} host process(es)"]
    for key in sorted(k for k in sums if k.endswith(" n") and not k.startswith("admission")):
        name = key[:-2]
        n = sums[key]
        line = f"  {name:32s} {n:7.0f}  mean {sums[name + ' s'] / n * 1000:7.1f} ms"
        busy = sums.get(f"{name} found every link busy")
        if busy is not None:
            line += f"  found every link busy {busy / n:.0%}"
        lines.append(line)
    if sums["admission take n"]:
        lines.append(
            f"  admission: {sums['admission take n']:.0f} takes, "
            f"{sums['admission slots granted']:.0f} of {sums['admission slots wanted']:.0f} "
            f"slots granted, {sums['admission take refused']:.0f} refused"
        )
    for c in sorted(counts, key=lambda c: c["at"]):
        lines.append(
            f"  count +{c['at'] - counts[0]['at']:5.1f} s: counted {c['counted']}, "
            f"limit {c['limit']}, rate {c['rate']}/s, leased {c['leased']}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        raise SystemExit(__doc__)
    print("\n".join(summary(Path(args[0]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

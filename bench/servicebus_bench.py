"""Throughput of the local Service Bus emulator with the real SDK.

Starts `python -m devstack.servicebus` on a free port, then for the sync and
the async client: sends N messages (in batches), receives them in PEEK_LOCK
and completes each one, and prints messages/s each way. Ends with the
emulator's peak resident memory (VmHWM). A measurement, not a test: nothing
here asserts a speed.

    .venv/bin/python bench/servicebus_bench.py [--count 10000] [--batch 100] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from azure.servicebus import ServiceBusClient, ServiceBusMessage  # noqa: E402
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient  # noqa: E402

from devstack.process import Child, exit_on_signals, read_line  # noqa: E402

QUEUE = "bench"
BODY = "x" * 256  # a small order-sized message


def start_emulator(workdir: Path, data_dir: str | None) -> tuple[Child, str]:
    config = workdir / "Config.json"
    config.write_text(
        json.dumps(
            {
                "UserConfig": {
                    "Namespaces": [
                        {
                            "Name": "bench",
                            "Queues": [
                                {
                                    "Name": QUEUE,
                                    "Properties": {"LockDuration": "PT1M", "MaxDeliveryCount": 10},
                                },
                            ],
                        }
                    ]
                }
            }
        )
    )
    command = [sys.executable, "-m", "devstack.servicebus", "--port", "0", "--config", str(config)]
    if data_dir:
        command += ["--data-dir", data_dir]
    process = Child.start("servicebus", command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.process.stdout is not None
    line = read_line(process.process.stdout, 30)
    match = re.search(r"port=(\d+)", line)
    if not match:
        process.kill()
        raise SystemExit(f"emulator did not start: {line!r}")
    connection_string = (
        f"Endpoint=sb://127.0.0.1:{match[1]};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
    )
    return process, connection_string


def peak_memory_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    kilobytes = int(re.search(r"VmHWM:\s+(\d+) kB", status)[1])  # type: ignore[index]
    return kilobytes / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the emulator used (shows whether it or the SDK is the bottleneck)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_sync(connection_string: str, count: int, batch: int) -> tuple[float, float]:
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_sender(QUEUE) as sender:
            started = time.perf_counter()
            for offset in range(0, count, batch):
                sender.send_messages(
                    [ServiceBusMessage(BODY) for _ in range(min(batch, count - offset))]
                )
            send_rate = count / (time.perf_counter() - started)
        with client.get_queue_receiver(QUEUE, prefetch_count=batch) as receiver:
            started = time.perf_counter()
            received = 0
            while received < count:
                messages = receiver.receive_messages(max_message_count=batch, max_wait_time=10)
                if not messages:
                    raise SystemExit(f"sync: only {received} of {count} messages came back")
                for message in messages:
                    receiver.complete_message(message)
                received += len(messages)
            receive_rate = count / (time.perf_counter() - started)
    return send_rate, receive_rate


async def bench_async(connection_string: str, count: int, batch: int) -> tuple[float, float]:
    async with AsyncServiceBusClient.from_connection_string(connection_string) as client:
        async with client.get_queue_sender(QUEUE) as sender:
            started = time.perf_counter()
            for offset in range(0, count, batch):
                await sender.send_messages(
                    [ServiceBusMessage(BODY) for _ in range(min(batch, count - offset))]
                )
            send_rate = count / (time.perf_counter() - started)
        async with client.get_queue_receiver(QUEUE, prefetch_count=batch) as receiver:
            started = time.perf_counter()
            received = 0
            while received < count:
                messages = await receiver.receive_messages(
                    max_message_count=batch, max_wait_time=10
                )
                if not messages:
                    raise SystemExit(f"async: only {received} of {count} messages came back")
                for message in messages:
                    await receiver.complete_message(message)
                received += len(messages)
            receive_rate = count / (time.perf_counter() - started)
    return send_rate, receive_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument(
        "--batch", type=int, default=100, help="messages per send call and per receive call"
    )
    parser.add_argument(
        "--data-dir", default=None, help="run the emulator with SQLite persistence here"
    )
    args = parser.parse_args()
    exit_on_signals()  # SIGTERM/SIGHUP run the `finally` that stops the emulator
    with tempfile.TemporaryDirectory() as workdir:
        process, connection_string = start_emulator(Path(workdir), args.data_dir)
        try:
            sync_send, sync_receive = bench_sync(connection_string, args.count, args.batch)
            async_send, async_receive = asyncio.run(
                bench_async(connection_string, args.count, args.batch)
            )
            peak = peak_memory_mb(process.pid)
            cpu = cpu_seconds(process.pid)
        finally:
            process.stop()
    mode = f"data-dir={args.data_dir}" if args.data_dir else "memory only"
    print(
        f"{args.count} messages of {len(BODY)} B, batches of {args.batch}, PEEK_LOCK + complete, {mode}"
    )
    print(f"sync  client: send {sync_send:8.0f} msg/s   receive+complete {sync_receive:8.0f} msg/s")
    print(
        f"async client: send {async_send:8.0f} msg/s   receive+complete {async_receive:8.0f} msg/s"
    )
    print(f"emulator peak memory (VmHWM): {peak:.1f} MB, CPU time {cpu:.1f} s")


if __name__ == "__main__":
    main()

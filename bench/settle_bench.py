"""How long a settlement takes on the local host's Service Bus path, with and without its fix.

Runs our emulator, a PEEK_LOCK receive loop on a thread's event loop (as the host's
Service Bus loop runs it: one message at a time, 1 s receive waits), and settles each
received message from the main thread through `run_coroutine_threadsafe(...).result()`,
as a function's synchronous `ServiceBusMessageActions.complete()` does, 50 ms after the
receive loop went back to waiting. Prints settle p50/max (ms) for the SDK as it is and
for the host's `split_transport_locks`, at the SDK's default socket timeout (0.2 s) and
the host's (0.05 s). Figures only.

    python bench/settle_bench.py [--messages 30]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode  # noqa: E402
from azure.servicebus.aio import ServiceBusClient  # noqa: E402

from devstack.host.servicebus import RECEIVE_SOCKET_TIMEOUT, split_transport_locks  # noqa: E402
from devstack.process import free_port  # noqa: E402
from devstack.servicebus import CONNECTION_STRING_TEMPLATE  # noqa: E402


def measure(connection: str, split: bool, socket_timeout: float, n: int) -> list[float]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    received: list[Any] = []
    state: dict[str, Any] = {}

    async def receive_loop() -> None:
        client = ServiceBusClient.from_connection_string(connection)
        receiver = client.get_queue_receiver(
            "orders", receive_mode=ServiceBusReceiveMode.PEEK_LOCK, socket_timeout=socket_timeout
        )
        await receiver.__aenter__()
        state["receiver"], state["client"] = receiver, client
        while not state.get("stop"):
            if split:
                split_transport_locks(receiver)
            received.extend(await receiver.receive_messages(max_message_count=1, max_wait_time=1))

    async def send() -> None:
        async with (
            ServiceBusClient.from_connection_string(connection) as client,
            client.get_queue_sender("orders") as sender,
        ):
            await sender.send_messages([ServiceBusMessage(b"x") for _ in range(n)])

    loop_task = asyncio.run_coroutine_threadsafe(receive_loop(), loop)
    asyncio.run(send())
    times: list[float] = []
    deadline = time.monotonic() + 60 + n
    while len(times) < n and time.monotonic() < deadline:
        if not received:
            time.sleep(0.01)
            continue
        message = received.pop(0)
        time.sleep(0.05)  # the receive loop is back in its idle read
        t0 = time.perf_counter()
        asyncio.run_coroutine_threadsafe(state["receiver"].complete_message(message), loop).result(
            10
        )
        times.append((time.perf_counter() - t0) * 1000)
    state["stop"] = True

    async def close() -> None:
        await state["receiver"].close()
        await state["client"].close()

    loop_task.result(5)
    asyncio.run_coroutine_threadsafe(close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=30)
    args = parser.parse_args()
    port = free_port()
    emulator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devstack.servicebus",
            "--port",
            str(port),
            "--config",
            str(ROOT / "devstack" / "servicebus" / "Config.json"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert emulator.stdout is not None
        while "ready" not in (line := emulator.stdout.readline()):
            if not line:
                raise RuntimeError("the emulator did not start")
        connection = CONNECTION_STRING_TEMPLATE.format(host="127.0.0.1", port=port)
        for split in (False, True):
            for timeout in (0.2, RECEIVE_SOCKET_TIMEOUT):
                t = measure(connection, split, timeout, args.messages)
                print(
                    f"settle: split={'yes' if split else 'no '} socket_timeout={timeout:.2f} s "
                    f"p50={statistics.median(t):.1f} ms max={max(t):.1f} ms",
                    flush=True,
                )
    finally:
        emulator.terminate()
        emulator.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

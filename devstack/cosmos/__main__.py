"""`python -m devstack.cosmos --port PORT`: run the patched local Cosmos DB
server in the foreground until interrupted. Prints one ready line:
`cosmosdb-server ready at https://127.0.0.1:PORT/ ...`. `--data-file F` keeps
the data in F across restarts."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from devstack.cosmos.server import REPO_ROOT, ServerStartError, launcher_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.cosmos", description=__doc__)
    parser.add_argument("--port", type=int, default=8081, help="0 picks a free port (default 8081)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--faults", help="JSON list of fault rules to start with (see faults.py)")
    parser.add_argument(
        "--data-file",
        help="keep the data in this file: loaded at start, written within a second of "
        "every change and at stop (default: memory only)",
    )
    args = parser.parse_args(argv)
    try:
        command = launcher_command(args.port, args.host, args.faults, args.data_file)
    except ServerStartError as exc:
        print(exc, file=sys.stderr)
        return 2
    os.chdir(REPO_ROOT)  # node resolves @vercel/cosmosdb-server from here
    if os.name == "posix":
        # Replace this process: signals sent to our pid reach node directly.
        os.execv(command[0], command)
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())

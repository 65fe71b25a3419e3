"""The app's own list of functions: what `import function_app` registers,
given the settings that decide it (ORDER_INGRESS_QUEUES adds one Submit
function per client application).

The import runs in a child process, so the caller's modules and environment
stay as they were. `python -m deploy.app_functions` prints the names, one a
line, with the settings of the current environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_LIST = """
import json, sys
import function_app
names = sorted(f.get_function_name() for f in function_app.app.get_functions())
sys.stdout.write("\\n" + json.dumps(names))
"""


def expected_functions(
    settings: Mapping[str, str] | None = None, python: str | None = None
) -> list[str]:
    """Function names of function_app.py under `settings` (added to the
    current environment)."""
    env = {**os.environ, **(settings or {})}
    done = subprocess.run(
        [python or sys.executable, "-c", _LIST],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"import function_app failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print("\n".join(expected_functions()))

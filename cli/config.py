"""Settings for the tool: the environment, filled in where a name is unset from
$LOCAL_SETTINGS, else your own ./local.settings.json, else the running stack's
(the one started last under ./.devstack/), else one an earlier `up` wrote.
`SOURCE` says which, so that a connection error can name what it tried."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from adapters.settings import Settings, SettingsError, load_settings

# What `python -m devstack up` puts into a local.settings.json it writes.
WRITTEN_BY = "devstack"


@dataclass
class SettingsSource:
    path: Path | None  # the file read, if any
    stack: Path | None  # the running stack's run directory, when its settings were used
    note: str  # how the file was chosen


SOURCE: SettingsSource | None = None


def local_settings(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        values = json.loads(path.read_text()).get("Values", {})
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{path} is not valid JSON: {exc}") from None
    return {k: str(v) for k, v in values.items()}


def _written_by_devstack(path: Path) -> bool:
    try:
        return WRITTEN_BY in json.loads(path.read_text())
    except (OSError, ValueError, TypeError):
        return False


def _running_stack() -> tuple[Path, Path] | None:
    runs = Path.cwd() / ".devstack"
    if not runs.is_dir():
        return None
    try:
        from devstack.stack import running_stack_settings
    except ImportError:  # the tool without the local stack (a deployment's copy)
        return None
    return running_stack_settings(runs)


def choose_settings(path: Path | None = None) -> SettingsSource:
    """Which settings file the tool reads (see the module's docstring)."""
    if path is not None:
        return SettingsSource(path, None, "as given")
    if os.environ.get("LOCAL_SETTINGS"):
        return SettingsSource(Path(os.environ["LOCAL_SETTINGS"]), None, "from $LOCAL_SETTINGS")
    local = Path("local.settings.json")
    if local.exists() and not _written_by_devstack(local):
        return SettingsSource(local, None, "your own local.settings.json")
    running = _running_stack()
    if running is not None:
        run_dir, settings = running
        return SettingsSource(settings, run_dir, f"the running stack in {run_dir}")
    if local.exists():
        return SettingsSource(local, None, "written by an earlier `up`; no running stack found")
    return SettingsSource(None, None, "no local.settings.json and no running stack found")


def tool_settings(path: Path | None = None) -> Settings:
    global SOURCE
    source = choose_settings(path)
    SOURCE = source
    file_values = local_settings(source.path) if source.path else {}
    env = {**file_values, **os.environ}
    try:
        return load_settings(env)
    except SettingsError as exc:
        if source.path is not None and source.path.exists():
            raise
        raise SettingsError(
            f"{source.path or 'local.settings.json'} not found, no running stack under "
            f"./.devstack/, and the environment does not have the settings ({exc}). Start the "
            "stack (`make up`: it writes the settings), or make them from the template: "
            "cp local.settings.template.json local.settings.json (or point LOCAL_SETTINGS at yours)"
        ) from None


_ENDPOINT = re.compile(r"(?:Account)?Endpoint=([^;]+)", re.IGNORECASE)


def _endpoint(value: str) -> str:
    """The address in a connection string, without keys."""
    m = _ENDPOINT.search(value)
    if m:
        return m.group(1)
    if value.startswith("http"):
        return value
    return "(set)"


def connection_hint(setting: str) -> str:
    """What a connection error appends: the setting, its endpoint, where it came from, the
    stack it tried, and where to look."""
    value = os.environ.get(setting)
    origin = "the environment"
    if value is None and SOURCE is not None and SOURCE.path is not None:
        value = local_settings(SOURCE.path).get(setting) if SOURCE.path.exists() else None
        origin = str(SOURCE.path)
    where = _endpoint(value) if value else "(unset)"
    if SOURCE is not None and SOURCE.stack is not None:
        stack = f"stack {SOURCE.stack}"
    else:
        stack = f"no running stack ({SOURCE.note})" if SOURCE else "no running stack"
    return (
        f" [{setting}={where} from {origin}; {stack}; `make status` shows the running stacks "
        "and their ports]"
    )

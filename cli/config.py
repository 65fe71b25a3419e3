"""Settings for the tool: the environment, filled in from local.settings.json
(the same file `func start` and the local host read) where a name is unset."""

from __future__ import annotations

import json
import os
from pathlib import Path

from adapters.settings import Settings, SettingsError, load_settings


def local_settings(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        values = json.loads(path.read_text()).get("Values", {})
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{path} is not valid JSON: {exc}") from None
    return {k: str(v) for k, v in values.items()}


def tool_settings(path: Path | None = None) -> Settings:
    path = path or Path(os.environ.get("LOCAL_SETTINGS", "local.settings.json"))
    env = {**local_settings(path), **os.environ}
    try:
        return load_settings(env)
    except SettingsError as exc:
        if path.exists():
            raise
        raise SettingsError(
            f"{path} not found, and the environment does not have the settings ({exc}). "
            "Make it from the template: cp local.settings.template.json local.settings.json "
            "(or point LOCAL_SETTINGS at yours)"
        ) from None

"""devstack/ is a product of its own (#10): its packaging metadata names every package
it has, and the Functions app never imports it."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEVSTACK = ROOT / "devstack"
APP_PACKAGES = [
    "activities",
    "adapters",
    "agents",
    "domain",
    "orchestrators",
    "reporting",
    "submit",
    "supervisor",
    "console",
    "triggers",
]


def test_the_metadata_lists_every_package_and_the_launcher() -> None:
    meta = tomllib.loads((DEVSTACK / "pyproject.toml").read_text())
    found = {
        ".".join(("devstack", *p.parent.relative_to(DEVSTACK).parts))
        for p in DEVSTACK.rglob("__init__.py")
        if "build" not in p.parts
    }
    assert set(meta["tool"]["setuptools"]["packages"]) == found
    assert meta["project"]["scripts"]["devstack"] == "devstack.__main__:main"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_app_never_imports_the_local_stack() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for pkg in APP_PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if "devstack" in _imports(p)
    ]
    offenders += [
        f for f in ("function_app.py", "bootstrap.py") if "devstack" in _imports(ROOT / f)
    ]
    assert offenders == []

"""The app imports, and indexes every function, the way the Python worker
loads it on Flex Consumption: with the protobuf and grpcio the 3.11 worker
declares already imported, and the app's requirements installed as the
remote build installs them (pip --target .python_packages/lib/site-packages).

The worker's packages and the app's are installed once per content of
requirements.txt and WORKER_PINS (a cache directory, WORKER_PINS_CACHE or
under the system temp directory; pip's own cache makes a rebuild quick); the
package is rebuilt from the repository on every run with .funcignore applied
(deploy/package.py), so a module the app imports from an excluded folder
fails here. Each case runs tests/deploy/worker_import.py in a fresh venv
(standard library only), which follows the worker's DependencyManager.

PYTHON_ISOLATE_WORKER_DEPENDENCIES=1 (set in infra/app/api.bicep) must index
the app's full list with the app's own protobuf; with isolation off the
preview Service Bus binding cannot load against the worker's protobuf, which
is why the setting is there (docs/adr/017c-worker-dependency-isolation.md)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from deploy.app_functions import expected_functions
from deploy.package import copy_package
from tests.infra.bicep_model import INFRA, ROOT

pytestmark = pytest.mark.slow

# What the worker for Python 3.10-3.12 declares (azure-functions-python-worker,
# workers/pyproject.toml, `dependencies`, the entries for python_version <= '3.13'
# and < '3.13'): the packages it ships in its own directory on the platform.
WORKER_PINS = (
    "protobuf~=5.29.0",
    "grpcio~=1.70.0",
    "grpcio-tools~=1.70.0",
    "python-dateutil~=2.9.0",
    "azure-functions==1.26.0b3",
    "azurefunctions-extensions-base==1.3.0b1",
)
# Two client applications, as main.bicep's defaults: one Submit function each.
SETTINGS = {
    "ORDER_INGRESS_QUEUES": json.dumps(
        {"webshop": "orders-webshop", "partner-portal": "orders-partner-portal"}
    ),
    "REPLY_QUEUE_REGISTRY": json.dumps(
        {"webshop": "replies-webshop", "partner-portal": "replies-partner-portal"}
    ),
}
CHILD = Path(__file__).with_name("worker_import.py")


def _pip(*args: str) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-warn-conflicts",
            *args,
        ],
        check=True,
        timeout=900,
    )


def _cache_root() -> Path:
    key = hashlib.sha256(
        "\n".join([sys.version, (ROOT / "requirements.txt").read_text(), *WORKER_PINS]).encode()
    ).hexdigest()[:16]
    base = Path(
        os.environ.get("WORKER_PINS_CACHE")
        or Path(tempfile.gettempdir()) / "order-processing-worker-pins"
    )
    return base / key


@pytest.fixture(scope="session")
def installed() -> Path:
    """<cache>/worker (the worker's packages), <cache>/site-packages (the
    app's, as the remote build installs them) and <cache>/venv (a bare venv)."""
    root = _cache_root()
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one pytest worker builds, the others wait
        if not (root / "done").exists():
            shutil.rmtree(root, ignore_errors=True)
            build = Path(tempfile.mkdtemp(dir=root.parent, prefix=f"{root.name}-build-"))
            _pip("--target", str(build / "worker"), *WORKER_PINS)
            _pip("--target", str(build / "site-packages"), "-r", str(ROOT / "requirements.txt"))
            subprocess.run(
                [sys.executable, "-m", "venv", "--without-pip", str(build / "venv")], check=True
            )
            (build / "done").write_text("\n".join(WORKER_PINS))
            build.rename(root)
    return root


@pytest.fixture(scope="session")
def app_dir(installed: Path, tmp_path_factory) -> Path:
    """The deployed package: the repository less .funcignore, with the remote
    build's .python_packages beside it."""
    app = tmp_path_factory.mktemp("wwwroot")
    copy_package(app)
    packages = app / ".python_packages" / "lib"
    packages.mkdir(parents=True)
    (packages / "site-packages").symlink_to(installed / "site-packages")
    return app


def _index(installed: Path, app: Path, isolate: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(SETTINGS)
    done = subprocess.run(
        [
            str(installed / "venv" / "bin" / "python"),
            str(CHILD),
            str(installed / "worker"),
            str(app),
            "1" if isolate else "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_worker_packages_are_the_declared_ones(installed: Path, app_dir: Path):
    result = _index(installed, app_dir, isolate=True)
    assert result["worker"]["protobuf"].startswith("5.29.")
    assert result["worker"]["grpc"].startswith("1.70.")


def test_with_isolation_every_function_is_indexed_with_the_apps_own_protobuf(
    installed: Path, app_dir: Path
):
    result = _index(installed, app_dir, isolate=True)
    assert "error" not in result, result.get("traceback")
    assert result["functions"] == expected_functions(SETTINGS)
    assert {
        "submit_order_webshop",
        "submit_order_partner-portal",
        "agent_requests",
        "reply_bridge",
    } <= set(result["functions"])
    # Every Service Bus trigger gets the SDK type it is annotated with.
    assert sorted(result["sdk_bindings"]) == result["service_bus_triggers"]
    site_packages = str(app_dir / ".python_packages")
    assert result["protobuf"]["file"].startswith(site_packages), result["protobuf"]
    assert result["grpc"]["file"].startswith(site_packages), result["grpc"]
    assert int(result["protobuf"]["version"].split(".")[0]) >= 6


def test_without_isolation_the_binding_fails_against_the_workers_protobuf(
    installed: Path, app_dir: Path
):
    """Why infra/app/api.bicep sets PYTHON_ISOLATE_WORKER_DEPENDENCIES: the
    worker's default on 3.11 leaves its protobuf loaded, and the import fails
    (the worker then indexes no function). If this starts to index the app, the
    worker's pins have caught up and the ADR can be revisited."""
    result = _index(installed, app_dir, isolate=False)
    assert "functions" not in result
    assert "VersionError" in result["error"] or "grpc" in result["error"], result["error"]


def test_the_bicep_turns_isolation_on():
    text = (INFRA / "app" / "api.bicep").read_text()
    assert "  PYTHON_ISOLATE_WORKER_DEPENDENCIES: '1'\n" in text


def test_requirements_pin_what_the_binding_needs_at_import():
    """The binding's generated code checks protobuf >= 6.31.1 and grpcio >=
    1.74 when it is imported; the app declares both, so the remote build never
    settles on older ones."""
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    assert any(line.startswith("protobuf>=6.31.1") for line in lines)
    assert any(line.startswith("grpcio>=1.74") for line in lines)

"""azd's files: azure.yaml points at the templates and the app, and
main.parameters.json gives main.bicep every parameter it requires and no
parameter it does not declare."""

from __future__ import annotations

import json
import re

from tests.infra.bicep_model import INFRA, MAIN, ROOT, parse

PARAMETERS = INFRA / "main.parameters.json"


def test_parameters_file_matches_main_bicep():
    given = json.loads(PARAMETERS.read_text())["parameters"]
    declared = parse(MAIN)["parameters"]
    assert set(given) <= set(declared), set(given) - set(declared)
    required = {name for name, spec in declared.items() if spec.get("default") is None}
    assert required <= set(given), required - set(given)
    assert given["environmentName"]["value"] == "${AZURE_ENV_NAME}"
    assert given["location"]["value"] == "${AZURE_LOCATION}"


def test_parameters_file_client_list_matches_the_default_queues():
    given = json.loads(PARAMETERS.read_text())["parameters"]["clientApplications"]["value"]
    default = parse(MAIN)["parameters"]["clientApplications"]["default"]
    strip = [{k: v for k, v in app.items() if k != "principalId"} for app in given]
    assert strip == [{k: v for k, v in app.items() if k != "principalId"} for app in default]
    assert all(re.fullmatch(r"\$\{[A-Z_]+\}", app["principalId"]) for app in given)


def test_azure_yaml_deploys_the_function_app_from_the_root():
    text = (ROOT / "azure.yaml").read_text()
    assert re.search(
        r"^infra:\n  provider: bicep\n  path: infra\n  module: main$", text, re.MULTILINE
    )
    assert re.search(
        r"^  api:\n    project: \.\n    language: python\n    host: function$", text, re.MULTILINE
    )
    # azd finds the app by this tag.
    assert "'azd-service-name': 'api'" in (INFRA / "app" / "api.bicep").read_text()


def test_template_is_resource_group_scoped():
    assert parse(MAIN)["globals"]["scope"]["value"] == "resourceGroup"


FUNCIGNORE = ROOT / ".funcignore"


def _ignored() -> set[str]:
    lines = (line.strip() for line in FUNCIGNORE.read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


def test_funcignore_keeps_tooling_state_and_caches_out_of_the_package():
    ignored = _ignored()
    for entry in (
        ".azure/",
        ".venv/",
        ".python_packages/",
        "__pycache__/",
        ".pytest_cache/",
        ".ruff_cache/",
        "cli/",
        "tests/",
        "devstack/",
        "bench/",
        "infra/",
        "local.settings.json",
    ):
        assert entry in ignored, entry


def _top_level_imports(path) -> set[str]:
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_funcignore_keeps_everything_the_app_imports():
    """Follow function_app.py's imports through the project's own packages: none may be ignored."""
    ignored = {entry.rstrip("/") for entry in _ignored()}
    assert not {"function_app.py", "host.json", "requirements.txt"} & ignored
    seen, todo = set(), ["function_app"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        files = (
            [ROOT / f"{name}.py"]
            if (ROOT / f"{name}.py").exists()
            else sorted((ROOT / name).rglob("*.py"))
        )
        for file in files:
            todo += [
                n
                for n in _top_level_imports(file)
                if (ROOT / n).is_dir() or (ROOT / f"{n}.py").exists()
            ]
    assert "domain" in seen
    assert "submit" in seen
    assert not seen & ignored, seen & ignored


def test_an_unset_remote_service_url_is_refused_by_the_template():
    """Issue 24, risk 4: azd passes an unset REMOTE_SERVICE_URL as ''."""
    decorators = parse(MAIN)["parameters"]["remoteServiceUrl"]["decorators"]
    assert {"type": "min_length", "argument": len("https://a.bc")} in decorators, decorators


def test_funcignore_keeps_the_simulation_and_the_tooling_out():
    """Issue 24, risk 7: nothing the app imports lives there (the test above
    follows the imports; tests/deploy/test_worker_pins.py imports the app from
    exactly what ships)."""
    for entry in ("sim/", "deploy/", "pyproject.toml", "requirements-dev.txt"):
        assert entry in _ignored(), entry

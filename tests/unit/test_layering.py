"""The layering of docs/adr/020a-entry-layer.md holds: only the entry layer
(function_app.py, triggers/, cli/ and the standalone worker's entry) imports
the composition root, nothing but function_app imports the triggers, and the
product has no import cycle.

The contracts live in pyproject.toml ([tool.importlinter]) and are checked by
import-linter here, so the test command CI runs checks them. import-linter
cannot take the top-level modules bootstrap.py and function_app.py as root
packages; the cycle check below adds their imports to the graph itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
PACKAGES = (
    "activities",
    "adapters",
    "agents",
    "cli",
    "console",
    "domain",
    "orchestrators",
    "reporting",
    "submit",
    "supervisor",
    "triggers",
)
TOP_LEVEL = ("bootstrap", "function_app")


def test_the_import_contracts_are_kept() -> None:
    # In a process of its own: import-linter configures logging with
    # dictConfig, which disables every logger that exists, so in this process
    # later tests that read log lines (caplog) would see none.
    run = subprocess.run(
        [sys.executable, "-c", _LINT, str(PYPROJECT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr


_LINT = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))"
)


def _runtime_imports(path: Path) -> set[str]:
    """The modules `path` imports, leaving out `if TYPE_CHECKING:` blocks (as
    the contracts do: exclude_type_checking_imports)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _product_graph() -> grimp.ImportGraph:
    graph = grimp.build_graph(
        *PACKAGES,
        include_external_packages=False,
        exclude_type_checking_imports=True,
        cache_dir=None,
    )
    for module in TOP_LEVEL:
        graph.add_module(module)
    for module in TOP_LEVEL:
        for name in _runtime_imports(ROOT / f"{module}.py"):
            if name in graph.modules and name != module:
                graph.add_import(importer=module, imported=name)
    return graph


def _cycles(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    """Every direct import a -> b with a chain back from b to a."""
    return sorted(
        (importer, imported)
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if graph.chain_exists(importer=imported, imported=importer)
    )


def test_the_product_has_no_import_cycle() -> None:
    graph = _product_graph()
    # The graph does see the root's own imports (else a cycle through it would pass).
    assert "orchestrators.starter" in graph.find_modules_directly_imported_by("bootstrap")
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle_through_the_root() -> None:
    """The check is not vacuous: the import that made the product's one cycle
    before the entry layer (the Starter's lazy `import bootstrap`) is found."""
    graph = _product_graph()
    graph.add_import(importer="orchestrators.starter", imported="bootstrap")
    assert ("bootstrap", "orchestrators.starter") in _cycles(graph)

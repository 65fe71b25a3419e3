"""sim/ has no import circle: each module's imports of sim's own modules,
read from its source with the standard library's ast (every import: at
module level, inside a function, under `if TYPE_CHECKING:`), make a graph
without a cycle, so the world, the drive and the checks can be read (and
replaced) one at a time. A planted circle is found."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

SIM = Path(__file__).parents[2] / "sim"


def _own_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of the package (by their names in it) that `path` imports."""
    package = path.parent.name
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == package:
                    found.add(parts[1] if len(parts) > 1 else "__init__")
        elif isinstance(node, ast.ImportFrom):
            if node.level > 1:
                continue  # above the package: not one of its modules
            parts = (node.module or "").split(".") if node.module else []
            if node.level == 0:
                if not parts or parts[0] != package:
                    continue
                parts = parts[1:]
            if parts:
                found.add(parts[0])
            else:  # `from . import x` (or `from sim import x`): x may be a module
                found.update(alias.name for alias in node.names)
    return (found & modules) - {path.stem}


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = {p.stem for p in root.glob("*.py")}
    return {p.stem: _own_imports(p, modules) for p in sorted(root.glob("*.py"))}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (its modules in import order, the first
    repeated at the end), or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for imported in sorted(graph.get(module, ())):
            cycle = visit(imported, [*path, module])
            if cycle:
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle:
            return cycle
    return None


def test_sim_has_no_import_circle():
    graph = import_graph(SIM)
    assert {"drive", "checks", "path_checks", "world", "options"} <= set(graph)
    assert "world" in graph["drive"]
    assert "checks" in graph["drive"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle in sim/: " + " -> ".join(cycle or [])


def _planted(tmp_path: Path, module: str, line: str, where: str = "") -> dict[str, set[str]]:
    copy = tmp_path / "sim"
    shutil.copytree(SIM, copy, ignore=shutil.ignore_patterns("*.json", "__pycache__"))
    path = copy / f"{module}.py"
    path.write_text(path.read_text(encoding="utf-8") + where + line, encoding="utf-8")
    return import_graph(copy)


def test_a_planted_circle_is_found(tmp_path):
    # The world imports the drive, which imports the world: for types only.
    graph = _planted(
        tmp_path, "world", "    from .drive import Simulation\n", "\nif TYPE_CHECKING:\n"
    )
    cycle = find_cycle(graph)
    assert cycle is not None
    assert {"world", "drive"} <= set(cycle)
    assert cycle[0] == cycle[-1]


def test_a_circle_through_a_function_or_the_package_name_is_found(tmp_path):
    graph = _planted(tmp_path, "options", "\n\ndef late():\n    from sim import checks\n")
    cycle = find_cycle(graph)
    assert cycle is not None
    assert {"options", "checks"} <= set(cycle)
    shutil.rmtree(tmp_path / "sim")
    graph = _planted(tmp_path, "observed", "\nimport sim.drive\n")
    assert find_cycle(graph) is not None

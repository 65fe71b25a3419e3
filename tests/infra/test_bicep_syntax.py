"""Every Bicep file parses, and the files fit together the way the Bicep
compiler would insist on: modules and imports resolve, each module call passes
exactly the parameters the module declares, and every resource type and API
version is one Azure publishes (checked against the list below, each looked up
in the Azure resource reference or the templates Azure's own samples use).

tree-sitter-bicep is a second, independent grammar: pycep-parser is lenient in
places, tree-sitter flags any ERROR or MISSING node."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lark.exceptions import LarkError
from pycep import BicepParser

from tests.infra.bicep_model import INFRA, MAIN, bicep_files, parse

FILES = bicep_files()
IDS = [str(p.relative_to(INFRA)) for p in FILES]

# (resource type, API version) pairs the templates may use.
KNOWN_API_VERSIONS = {
    ("Microsoft.Web/serverfarms", "2024-04-01"),
    ("Microsoft.Web/sites", "2024-04-01"),
    ("Microsoft.Web/sites/config", "2024-04-01"),
    ("Microsoft.Storage/storageAccounts", "2023-05-01"),
    ("Microsoft.Storage/storageAccounts/blobServices", "2023-05-01"),
    ("Microsoft.Storage/storageAccounts/blobServices/containers", "2023-05-01"),
    ("Microsoft.ServiceBus/namespaces", "2024-01-01"),
    ("Microsoft.ServiceBus/namespaces/queues", "2024-01-01"),
    ("Microsoft.DocumentDB/databaseAccounts", "2024-11-15"),
    ("Microsoft.DocumentDB/databaseAccounts/sqlDatabases", "2024-11-15"),
    ("Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers", "2024-11-15"),
    ("Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments", "2024-11-15"),
    ("Microsoft.OperationalInsights/workspaces", "2023-09-01"),
    ("Microsoft.Insights/components", "2020-02-02"),
    ("Microsoft.Insights/actionGroups", "2023-01-01"),
    ("Microsoft.Insights/scheduledQueryRules", "2023-12-01"),
    ("Microsoft.Insights/metricAlerts", "2018-03-01"),
    ("Microsoft.Authorization/roleAssignments", "2022-04-01"),
    ("Microsoft.ManagedIdentity/userAssignedIdentities", "2023-01-31"),
    ("Microsoft.Web/sites/basicPublishingCredentialsPolicies", "2024-04-01"),
    ("Microsoft.Insights/diagnosticSettings", "2021-05-01-preview"),
    ("Microsoft.DurableTask/schedulers", "2025-11-01"),
    ("Microsoft.DurableTask/schedulers/taskHubs", "2025-11-01"),
    ("Microsoft.DurableTask/schedulers/retentionPolicies", "2025-11-01"),
    ("Microsoft.Resources/resourceGroups", "2024-03-01"),
    ("Microsoft.KeyVault/vaults", "2023-07-01"),
    ("Microsoft.Network/virtualNetworks", "2024-05-01"),
    ("Microsoft.Network/privateEndpoints", "2024-05-01"),
    ("Microsoft.Network/privateEndpoints/privateDnsZoneGroups", "2024-05-01"),
    ("Microsoft.Network/privateDnsZones", "2020-06-01"),
    ("Microsoft.Network/privateDnsZones/virtualNetworkLinks", "2020-06-01"),
}


def test_there_are_templates():
    assert MAIN in FILES
    assert len(FILES) >= 10


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_pycep_parses(path: Path):
    doc = parse(path)
    assert doc, f"{path} parsed to nothing"


def _tree_sitter_parser():
    ts = pytest.importorskip(
        "tree_sitter", reason="tree-sitter is not installed (requirements-dev.txt)"
    )
    tsb = pytest.importorskip(
        "tree_sitter_bicep", reason="tree-sitter-bicep is not installed (requirements-dev.txt)"
    )
    return ts.Parser(ts.Language(tsb.language()))


def _syntax_errors(parser, source: bytes) -> list[str]:
    errors = []
    stack = [parser.parse(source).root_node]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            errors.append(f"line {node.start_point[0] + 1}: {node.type} {node.text[:60]!r}")
        stack.extend(node.children)
    return errors


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_tree_sitter_finds_no_syntax_error(path: Path):
    parser = _tree_sitter_parser()
    assert _syntax_errors(parser, path.read_bytes()) == []


BROKEN = "param x string = 'a'\nresource s 'Microsoft.Storage/storageAccounts@2023-05-01' = {\n  name: x\n  location: \n"


def test_both_parsers_reject_broken_bicep():
    """The parse tests above mean something only if a broken file fails them."""
    with pytest.raises((ValueError, LarkError)):
        BicepParser().parse(text=BROKEN)
    assert _syntax_errors(_tree_sitter_parser(), BROKEN.encode())


def _resources(doc):
    """(symbol, type, api version) of each resource, including nested child resources."""
    for symbol, res in doc.get("resources", {}).items():
        yield symbol, res["type"], res["api_version"]


def _nested_children(path: Path) -> list[str]:
    """Child resources declared inside a parent (`resource x 'config' = {`)."""
    return re.findall(r"^\s+resource \w+ '([A-Za-z]+)' =", path.read_text(), re.MULTILINE)


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_resource_types_and_api_versions_are_known(path: Path):
    for symbol, rtype, version in _resources(parse(path)):
        assert (rtype, version) in KNOWN_API_VERSIONS, (
            f"{path.name}: {symbol} uses {rtype}@{version}"
        )
    for child in _nested_children(path):
        assert child in {"config", "blobServices", "containers", "privateDnsZoneGroups"}, (
            f"{path.name}: nested {child}"
        )


def _module_targets():
    for path in FILES:
        for symbol, module in parse(path).get("modules", {}).items():
            yield path, symbol, module


MODULES = list(_module_targets())


@pytest.mark.parametrize(
    ("path", "symbol", "module"),
    MODULES,
    ids=[f"{p.relative_to(INFRA)}:{s}" for p, s, _ in MODULES],
)
def test_module_calls_match_module_parameters(path: Path, symbol: str, module: dict):
    assert module["type"] == "local", f"{symbol}: only local modules (no registry needed to build)"
    target = (path.parent / module["detail"]["path"]).resolve()
    assert target.is_file(), f"{path.name}: module {symbol} -> {target} does not exist"
    declared = parse(target)["parameters"]
    config = module["config"]
    if "loop_type" in config or "condition" in config:
        config = config["config"]
    given = set(config.get("params", {}))
    unknown = given - set(declared)
    assert not unknown, (
        f"{symbol} passes parameters {target.name} does not declare: {sorted(unknown)}"
    )
    # pycep reports a parameter without a default as default None.
    required = {name for name, spec in declared.items() if spec.get("default") is None}
    missing = required - given
    assert not missing, (
        f"{symbol} leaves required parameters of {target.name} unset: {sorted(missing)}"
    )


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_imports_resolve_to_exported_types(path: Path):
    for names, source in re.findall(
        r"^import \{([^}]*)\} from '([^']+)'", path.read_text(), re.MULTILINE
    ):
        target = (path.parent / source).resolve()
        assert target.is_file(), f"{path.name} imports from missing {source}"
        exported = re.findall(r"@export\(\)\s*(?:@[^\n]*\n\s*)*type (\w+)", target.read_text())
        for name in (n.strip() for n in names.split(",")):
            assert name in exported, f"{path.name} imports {name}, which {source} does not export"


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_each_real_file_fails_the_parse_once_broken(path: Path):
    """Not only a made-up snippet: every template with its last closing brace
    dropped (an unfinished edit) is reported by tree-sitter, so the parse check
    of that file can fail. pycep-parser alone misses some of these, which is
    why both parsers run."""
    text = path.read_text()
    cut = text.rindex("}")
    broken = text[:cut] + text[cut + 1 :]
    assert _syntax_errors(_tree_sitter_parser(), broken.encode()), path.name


_CONDITIONAL = re.compile(r"^(?:module|resource)\s+(\w+)\s+'[^']+'\s*=\s*if\s*\(", re.MULTILINE)


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_a_conditional_modules_outputs_are_read_with_a_null_assertion(path: Path):
    """Issue 46, item 6 (BCP318): the outputs of a module or resource deployed
    under a condition may be null; the compiler warns unless the access is
    asserted (`x!.outputs`, under the same condition) or safe (`x.?outputs`)."""
    text = path.read_text()
    code = "\n".join(line.split("//", 1)[0] for line in text.splitlines())
    for symbol in _CONDITIONAL.findall(code):
        unguarded = re.findall(rf"\b{symbol}\.(?:outputs|properties|id|name)\b", code)
        assert not unguarded, f"{path.name}: {symbol} is conditional, read as {unguarded}"


def test_the_null_assertion_check_finds_an_unguarded_read():
    planted = "module m 'x.bicep' = if (c) {\n  name: 'm'\n}\nvar v = c ? m.outputs.endpoint : ''\n"
    symbols = _CONDITIONAL.findall(planted)
    assert symbols == ["m"]
    assert re.findall(r"\bm\.(?:outputs|properties|id|name)\b", planted)

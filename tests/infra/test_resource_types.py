"""Every resource body in infra/ against Azure's published resource type
definitions for the API version it uses (tests/infra/resource_types.py):
no unknown property, no write to a read-only one, no required one missing,
no literal outside an enum. The definitions are the bicep-types-az ones the
Bicep compiler checks with; they are read from BICEP_TYPES_AZ (or
../shared/bicep-types-az beside the repository) and the two tests that need
them say so and skip without them. The checker's own rules are tested here
on definitions written for the test, so they run everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.infra.bicep_model import INFRA, bicep_files
from tests.infra.resource_types import check_template, types_root

ROOT_TYPES = types_root()


def needs_types(test):
    """A test that reads Azure's definitions: marked `azure_types`, which
    `make test` deselects unless they are here (the Makefile says so in its
    log), and skipped with the reason when run without them directly."""
    return pytest.mark.azure_types(
        pytest.mark.skipif(
            ROOT_TYPES is None,
            reason="Azure's resource type definitions are not here: set BICEP_TYPES_AZ to a "
            "checkout of Azure/bicep-types-az (docs/deploying.md, Checking the templates)",
        )(test)
    )


@needs_types
@pytest.mark.parametrize(
    "path", bicep_files(), ids=[str(p.relative_to(INFRA)) for p in bicep_files()]
)
def test_every_resource_body_matches_its_published_type(path: Path):
    assert ROOT_TYPES is not None
    assert check_template(path, ROOT_TYPES) == []


@needs_types
def test_a_misspelt_property_in_a_real_template_is_found(tmp_path: Path):
    assert ROOT_TYPES is not None
    source = (INFRA / "core" / "keyvault" / "key-vault.bicep").read_text()
    planted = tmp_path / "key-vault.bicep"
    planted.write_text(source.replace("enableRbacAuthorization:", "enableRbacAuthorisation:"))
    problems = check_template(planted, ROOT_TYPES)
    assert problems == [
        "key-vault.bicep: vault (Microsoft.KeyVault/vaults@2023-07-01).properties."
        "enableRbacAuthorisation: no such property in VaultProperties"
    ]


# --- the checker's rules, on definitions written for the test -------------------------

# bicep-types-az's format: a list of types referring to each other as #/N.
FLAGS_REQUIRED, FLAGS_READ_ONLY = 1, 2
TYPES = [
    {"$type": "StringType"},  # 0
    {"$type": "StringLiteralType", "value": "Standard"},  # 1
    {"$type": "StringLiteralType", "value": "Premium"},  # 2
    {"$type": "UnionType", "elements": [{"$ref": "#/1"}, {"$ref": "#/2"}]},  # 3
    {  # 4
        "$type": "ObjectType",
        "name": "Sku",
        "properties": {"name": {"type": {"$ref": "#/3"}, "flags": FLAGS_REQUIRED}},
    },
    {  # 5
        "$type": "ObjectType",
        "name": "WidgetProperties",
        "properties": {
            "color": {"type": {"$ref": "#/0"}, "flags": 0},
            "endpoint": {"type": {"$ref": "#/0"}, "flags": FLAGS_READ_ONLY},
        },
    },
    {  # 6
        "$type": "ObjectType",
        "name": "Contoso.Widgets/widgets",
        "properties": {
            "name": {"type": {"$ref": "#/0"}, "flags": FLAGS_REQUIRED},
            "location": {"type": {"$ref": "#/0"}, "flags": FLAGS_REQUIRED},
            "sku": {"type": {"$ref": "#/4"}, "flags": 0},
            "properties": {"type": {"$ref": "#/5"}, "flags": 0},
        },
    },
    {
        "$type": "ResourceType",
        "name": "Contoso.Widgets/widgets@2025-01-01",
        "body": {"$ref": "#/6"},
    },
]


@pytest.fixture
def widget_types(tmp_path: Path) -> Path:
    folder = tmp_path / "generated" / "widgets" / "contoso.widgets" / "2025-01-01"
    folder.mkdir(parents=True)
    (folder / "types.json").write_text(json.dumps(TYPES))
    return tmp_path / "generated"


def _widget(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "widget.bicep"
    path.write_text(
        "param skuName string = 'Standard'\nparam premium bool = false\n"
        f"resource widget 'Contoso.Widgets/widgets@2025-01-01' = {{\n{body}\n}}\n"
    )
    return path


def test_a_body_that_fits_its_type_passes(tmp_path, widget_types):
    body = "  name: 'w'\n  location: 'x'\n  sku: {\n    name: skuName\n  }\n  properties: {\n    color: 'red'\n  }"
    assert check_template(_widget(tmp_path, body), widget_types) == []


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            "  name: 'w'\n  location: 'x'\n  properties: {\n    colour: 'red'\n  }",
            ".properties.colour: no such property in WidgetProperties",
        ),
        (
            "  name: 'w'\n  location: 'x'\n  properties: {\n    endpoint: 'https://x'\n  }",
            ".properties.endpoint: read-only",
        ),
        ("  name: 'w'", ".location: required, missing"),
        (
            "  name: 'w'\n  location: 'x'\n  sku: {\n    name: 'Basic'\n  }",
            ".sku.name: 'Basic' is not one of ['Premium', 'Standard']",
        ),
        (
            "  name: 'w'\n  location: 'x'\n  sku: {\n    name: premium ? 'Premium' : 'Gold'\n  }",
            ".sku.name: 'Gold' is not one of ['Premium', 'Standard']",
        ),
    ],
    ids=["unknown", "read-only", "required", "enum", "enum-in-a-branch"],
)
def test_each_rule_finds_its_problem(tmp_path, widget_types, body, problem):
    assert check_template(_widget(tmp_path, body), widget_types) == [
        f"widget.bicep: widget (Contoso.Widgets/widgets@2025-01-01){problem}"
    ]


def test_a_type_with_no_published_definition_is_a_problem(tmp_path, widget_types):
    path = tmp_path / "other.bicep"
    path.write_text("resource o 'Contoso.Widgets/gadgets@2025-01-01' = {\n  name: 'g'\n}\n")
    assert check_template(path, widget_types) == [
        "other.bicep: o (Contoso.Widgets/gadgets@2025-01-01): no published type definition"
    ]

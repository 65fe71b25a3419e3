"""A fourth step added by data alone: the shipped catalog (domain/steps.json)
with one more entry, "reserve-warehouse-slot" on its own service "warehouse",
which the tests put at another base URL (REMOTE_SERVICE_URL__WAREHOUSE). No
product code names it; the simulation, the unit tests and an e2e order run it."""

from __future__ import annotations

import json
from pathlib import Path

from domain.steps import DEFAULT_CATALOG, StepCatalog, parse_catalog

WAREHOUSE_STEP = {
    "name": "reserve-warehouse-slot",
    "service": "warehouse",
    "do": "reserve",
    "undo": "release",
    "payload": ["Lines"],
}


def with_warehouse_step() -> StepCatalog:
    shipped = [s.model_dump(by_alias=True) for s in DEFAULT_CATALOG.steps]
    return parse_catalog({"steps": [*shipped, WAREHOUSE_STEP]}, "added steps")


def write_catalog(path: Path, catalog: StepCatalog | None = None) -> Path:
    """`catalog` (default: with the warehouse step) as a catalog file, the form
    STEP_CATALOG_FILE and `python -m sim --steps` read."""
    catalog = catalog or with_warehouse_step()
    path.write_text(json.dumps(catalog.model_dump(mode="json", by_alias=True, exclude_none=True)))
    return path

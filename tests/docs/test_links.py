"""Every path a document cites exists, and the README stays a front door: its two set-up
commands are the Makefile's and the one CI runs."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs import links

README = links.ROOT / "README.md"


def test_every_link_and_path_in_the_documents_exists():
    broken = links.broken_references()
    assert broken == [], "\n".join(str(b) for b in broken)


def test_the_check_sees_each_kind_of_broken_reference(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("")
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Two words\n")
    (tmp_path / "README.md").write_text(
        "\n".join(
            [
                "# Front",
                "[fine](docs/guide.md#two-words) and `tests/test_a.py` and tests/test_a.py",
                "[gone](docs/missing.md)",
                "[bad anchor](docs/guide.md#three-words)",
                "[no heading here](#nowhere)",
                "`tests/test_b.py`",
                "see tests/test_c.py for it",
                "the design is in DESIGN.md and notes/local-emulators.md",
                "`missing_module.py`",
                "(/work/notes/report.md)",
                "<!-- DESIGN.md inside a comment is not a citation -->",
                "```",
                "python tests/test_d.py   # a command quoting a path",
                "transition rows (DESIGN.md section 3):",
                "```",
                "`https://example.com/x.md` `/api/console` `orders-<appId>` `service/operation`",
            ]
        )
    )
    found = {(b.line, b.target) for b in links.broken_references(tmp_path)}
    assert found == {
        (3, "docs/missing.md"),
        (4, "docs/guide.md#three-words"),
        (5, "#nowhere"),
        (6, "tests/test_b.py"),
        (7, "tests/test_c.py"),
        (8, "DESIGN.md"),
        (8, "notes/local-emulators.md"),
        (9, "missing_module.py"),
        (10, "/work/notes/report.md"),
        (13, "tests/test_d.py"),
    }


def test_the_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_readme_set_up_commands_are_the_makefile_targets_ci_runs():
    readme = README.read_text(encoding="utf-8")
    block = re.search(r"## Set-up: two commands\n(.*?)\n## ", readme, re.DOTALL)
    assert block, "README.md has no 'Set-up: two commands' section"
    commands = re.findall(r"^(make \w+)", block.group(1), re.MULTILINE)
    assert commands == ["make demo", "make test"]
    makefile = (links.ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), target
    ci = (links.ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert [line for line in ci.splitlines() if line.startswith("make ")] == ["make test"]

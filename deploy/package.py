"""The files `azd deploy` / `func azure functionapp publish` upload: the
repository root less what .funcignore excludes (gitignore syntax, read with
pathspec, the library git-style ignore files are usually matched with).

`python -m deploy.package DEST` copies them to DEST, which is how the
worker-pins test builds the app directory the Python worker sees in Azure."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pathspec

ROOT = Path(__file__).resolve().parents[1]
FUNCIGNORE = ROOT / ".funcignore"
# Never part of a package, whatever .funcignore says: the worktree's own
# symlinks and the remote build's output.
ALWAYS_OUT = (".git", ".venv", "node_modules", ".python_packages")


def ignore_spec(root: Path = ROOT) -> pathspec.PathSpec:
    return pathspec.GitIgnoreSpec.from_lines((root / ".funcignore").read_text().splitlines())


def shipped_files(root: Path = ROOT) -> Iterator[Path]:
    """Paths (relative to root) of the files that go into the package."""
    spec = ignore_spec(root)
    stack = [root]
    while stack:
        here = stack.pop()
        for entry in sorted(here.iterdir()):
            rel = entry.relative_to(root)
            if rel.parts[0] in ALWAYS_OUT:
                continue
            if entry.is_dir() and not entry.is_symlink():
                if not spec.match_file(f"{rel.as_posix()}/"):
                    stack.append(entry)
            elif entry.is_file() and not spec.match_file(rel.as_posix()):
                yield rel


def copy_package(dest: Path, root: Path = ROOT) -> list[Path]:
    files = list(shipped_files(root))
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    return files


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m deploy.package DEST")
    copied = copy_package(Path(sys.argv[1]))
    print(f"{len(copied)} files copied to {sys.argv[1]}")

"""What a document claims exists: every relative link (and its #anchor), and every
repository path it names, in backticks or in plain text, in README.md and docs/**/*.md.

A path is a claim when it starts with one of the repository's top-level entries
(`tests/...`, `docs/...`, `devstack/...`), or names a Markdown file anywhere
(`notes/x.md`, `DESIGN.md`), or is a bare file name in backticks (`ports.py`: some file of
that name exists). Text inside HTML comments is not read; fenced code blocks are read
for top-level paths only (they quote commands and program output, not documents)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Never part of a clone: made by installs, tools and running stacks.
IGNORED = {
    ".git",
    ".venv",
    "node_modules",
    ".devstack",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    ".python_packages",
    "build",
}

#: Files a running stack, a tool or the reader writes; the documents name them without
#: their folder. Each is explained where it is cited.
RUNTIME_FILES = {
    "local.settings.json",  # written by `make up` (or copied from local.settings.template.json)
    "stack.json",  # a running stack's state file, under .devstack/<name>/
    "data.json",  # the Cosmos server's data file, in a stack's run directory
    "spans.jsonl",  # OTEL_TRACES_FILE, wherever the reader points it
    "metrics.jsonl",  # OTEL_METRICS_FILE
    "orders.json",  # a reader's own file for `cli post --file`
    "queue-keys.json",  # a stack's internal-queue keys, generated into its run directory
    "function.json",  # the v1 programming model's file, quoted in the Python worker's errors
}

FILE_SUFFIXES = (
    ".py",
    ".md",
    ".json",
    ".jsonl",
    ".bicep",
    ".toml",
    ".txt",
    ".yml",
    ".yaml",
    ".png",
    ".js",
    ".mjs",
    ".sh",
)


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Broken:
    document: str
    line: int
    target: str
    why: str

    def __str__(self) -> str:
        return f"{self.document}:{self.line}: {self.target} ({self.why})"


def _tree(root: Path) -> tuple[set[str], set[str]]:
    """The top-level entries and every file's base name, outside IGNORED."""
    top = {p.name for p in root.iterdir() if p.name not in IGNORED}
    names: set[str] = set()
    for _folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in IGNORED and not d.endswith(".egg-info")]
        names.update(files)
    return top, names


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        m = None if in_fence else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


_FENCE = re.compile(r"^\s*```")
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_CODE = re.compile(r"(`+)(.+?)\1")
_PATHLIKE = re.compile(r"^(?:\.{1,2}/|/)?[\w.*-]+(?:/[\w.*-]*)*$")
# A path in running text: at least one slash, or a Markdown file name.
_PLAIN = re.compile(r"(?<![\w/.`<-])((?:\.{1,2}/|/)?[\w-][\w.*-]*(?:/[\w.*-]+)+/?|[\w.-]+\.md)\b/?")


def _lines(text: str) -> list[tuple[int, str, bool]]:
    """(line number, text, inside a fenced block), with HTML comments blanked out."""
    text = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    out = []
    fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fence = not fence
            continue
        out.append((n, line, fence))
    return out


def _clean(token: str) -> str:
    token = token.strip().strip("\"'()[],;")
    token = re.sub(r"::.*$", "", token)  # tests/x.py::test_name
    token = re.sub(r":\d+(?:-\d+)?$", "", token)  # file.py:12
    return token.rstrip(".:,;")


class Checker:
    def __init__(self, root: Path = ROOT) -> None:
        self.root = root
        self.top, self.names = _tree(root)
        self._anchors: dict[Path, set[str]] = {}

    def _exists(self, candidate: Path) -> bool:
        if any(ch in str(candidate) for ch in "*?["):
            try:
                rel = candidate.relative_to(self.root)
            except ValueError:
                return False
            return any(self.root.glob(str(rel)))
        return candidate.exists()

    def _path_exists(self, doc: Path, token: str) -> bool:
        if token.startswith("/"):
            return False  # a machine path: never part of the repository
        return self._exists(self.root / token) or self._exists(doc.parent / token)

    def _is_claim(self, token: str, *, code: bool, fenced: bool) -> bool:
        if not token or not _PATHLIKE.match(token) or token.startswith("//"):
            return False
        parts = [p for p in token.split("/") if p not in ("", ".")]
        if not parts:
            return False
        if parts[0] == ".." or (token.endswith(".md") and not fenced):
            return True
        if "/" in token.strip("/") or token.endswith("/"):
            if token.startswith("/"):
                return False  # URL paths (/api/console), webhooks: not files
            return parts[0] in self.top
        if fenced:
            return False
        if token.endswith(".md"):
            return True
        return code and token.endswith(FILE_SUFFIXES)

    def _check_token(self, doc: Path, token: str, *, code: bool, fenced: bool) -> str | None:
        token = _clean(token)
        if not self._is_claim(token, code=code, fenced=fenced):
            return None
        if "/" not in token.strip("/"):
            name = token.strip("/")
            if name in RUNTIME_FILES or name in self.names or self._path_exists(doc, name):
                return None
            if (self.root / name).is_dir():
                return None
            return "no file of that name in the repository"
        if self._path_exists(doc, token.rstrip("/")):
            return None
        return "no such path"

    def _check_link(self, doc: Path, target: str) -> str | None:
        if re.match(r"^[a-zA-Z][\w+.-]*:", target):
            return None  # https:, mailto:
        path_part, _, fragment = target.partition("#")
        dest = doc if not path_part else (doc.parent / path_part)
        if path_part.startswith("/") or not dest.exists():
            return "no such file"
        if fragment and dest.suffix == ".md":
            if dest not in self._anchors:
                self._anchors[dest] = anchors(dest)
            if fragment not in self._anchors[dest]:
                return f"no heading #{fragment}"
        return None

    def check(self, doc: Path) -> list[Broken]:
        name = str(doc.relative_to(self.root))
        broken: list[Broken] = []
        for n, line, fenced in _lines(doc.read_text(encoding="utf-8")):
            if fenced:
                for token in line.split():
                    why = self._check_token(doc, token, code=True, fenced=True)
                    if why:
                        broken.append(Broken(name, n, _clean(token), why))
                continue
            targets = [m.group(1) for m in _LINK.finditer(line)]
            ref = _REFDEF.match(line)
            if ref:
                targets.append(ref.group(1))
            for target in targets:
                why = self._check_link(doc, target)
                if why:
                    broken.append(Broken(name, n, target, why))
            prose = _LINK.sub(" ", line)
            for m in _CODE.finditer(prose):
                for token in m.group(2).split():
                    why = self._check_token(doc, token, code=True, fenced=False)
                    if why:
                        broken.append(Broken(name, n, _clean(token), why))
            prose = _CODE.sub(" ", prose)
            for m in _PLAIN.finditer(prose):
                why = self._check_token(doc, m.group(1), code=False, fenced=False)
                if why:
                    broken.append(Broken(name, n, _clean(m.group(1)), why))
        return broken


def broken_references(root: Path = ROOT) -> list[Broken]:
    checker = Checker(root)
    return [b for doc in documents(root) for b in checker.check(doc)]


if __name__ == "__main__":
    for b in broken_references():
        print(b)

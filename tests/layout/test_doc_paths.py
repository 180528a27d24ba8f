"""Every module path the markdown names exists: ``a.b.c`` (a module, or a name defined at the top
of one) and ``a/b/c.py``, in every markdown file of the repository (README.md, PROTOCOL.md,
docs/, bench/, ...: whatever there is), so a page cannot point to a module that moved. The
same for the comments and docstrings of the code.

A history (HISTORY.md, CHANGELOG.md) is exempt: it names what existed at its time.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# not the project's own pages: tools' folders (and hidden ones), third-party data with its README
SKIPPED_DIRS = {"venv", "node_modules", "site", "build", "dist", "__pycache__"}
SKIPPED_TREES = {ROOT / "tests" / "vectors" / "conformance"}
HISTORIES = {"HISTORY.md", "CHANGELOG.md"}
# (file, path): a history kept inside a reference page until it moves to its own HISTORY.md
# a dotted word ending so is a file of a node's home (node.key, node.json), not a module
FILE_SUFFIXES = {"key", "json", "jsonl", "log", "toml", "sock", "acl", "md", "py", "txt", "tmp"}


@cache
def packages() -> list[str]:
    """The repository's top-level folders that hold Python code: the roots a path starts at."""
    return sorted(d.name for d in ROOT.iterdir() if d.is_dir() and any(d.glob("*.py")))


@cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    roots = "|".join(map(re.escape, packages()))
    # a dotted word followed by "(" is code (``node.store.x(...)``: a variable), not a path
    dotted = re.compile(rf"(?<![\w./<-])((?:{roots})(?:\.[A-Za-z_]\w*)++)(?![\w/(-])")
    slashed = re.compile(rf"(?<![\w./-])((?:{roots})/[\w./*<>-]*\.py)\b")
    return dotted, slashed


def markdown_files() -> Iterator[Path]:
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder)
        dirs[:] = [
            d
            for d in dirs
            if d not in SKIPPED_DIRS
            and not d.startswith(".")
            and not d.endswith(".egg-info")
            and here / d not in SKIPPED_TREES
        ]
        for name in files:
            if name.endswith(".md") and name not in HISTORIES:
                yield here / name


@cache
def _top_names(module: Path) -> frozenset[str]:
    """Names a module defines at its top (functions, classes, assignments, imports, and the
    strings of ``__all__`` for a package that exports lazily)."""
    names: set[str] = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                names.update(
                    c.value
                    for c in ast.walk(node.value)  # type: ignore[arg-type]
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                )
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def dotted_exists(path: str, root: Path = ROOT) -> bool:
    """``a.b.c``: packages and a module, then at most a name defined at the module's top."""
    parts = path.split(".")
    if parts[-1] in FILE_SUFFIXES:
        return True
    here = root / parts[0]
    for i, part in enumerate(parts[1:], start=1):
        if (here / part).is_dir():
            here = here / part
            continue
        module = here / f"{part}.py"
        if module.is_file():
            return i + 1 == len(parts) or parts[i + 1] in _top_names(module)
        init = here / "__init__.py"
        return init.is_file() and part in _top_names(init)
    return True


def slashed_exists(path: str, root: Path = ROOT) -> bool:
    """``a/b/c.py``; a ``<placeholder>`` or ``*`` must match at least one file."""
    pattern = re.sub(r"<[^>]*>", "*", path)
    if "*" in pattern:
        return any(root.glob(pattern))
    return (root / pattern).is_file()


def stale_paths(text: str, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, path) of each module path in ``text`` that names nothing under ``root``."""
    dotted, slashed = _patterns()
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        found += [(number, m[1]) for m in dotted.finditer(line) if not dotted_exists(m[1], root)]
        found += [(number, m[1]) for m in slashed.finditer(line) if not slashed_exists(m[1], root)]
    return found


def test_every_module_path_in_the_markdown_exists():
    pages = sorted(markdown_files())
    assert ROOT / "README.md" in pages
    assert ROOT / "PROTOCOL.md" in pages
    stale = [
        f"{page.relative_to(ROOT)}:{line}: {path}"
        for page in pages
        for line, path in stale_paths(page.read_text(encoding="utf-8"))
    ]
    assert not stale, "module paths that name nothing:\n" + "\n".join(stale)


def code_prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each comment and docstring of a module's ``source``."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                for offset, line in enumerate(doc.splitlines()):
                    yield node.body[0].lineno + offset, line


def test_every_module_path_in_the_code_comments_exists():
    stale = []
    for package in packages():
        for module in sorted((ROOT / package).rglob("*.py")):
            if any(part.startswith(".") for part in module.relative_to(ROOT).parts):
                continue
            for line, text in code_prose(module.read_text(encoding="utf-8")):
                stale += [f"{module.relative_to(ROOT)}:{line}: {p}" for _, p in stale_paths(text)]
    assert not stale, "module paths that name nothing:\n" + "\n".join(stale)


def test_the_check_finds_a_stale_path_and_passes_a_real_one():
    text = (
        "raises `node.messages.Rejected` (see `node/runners/workers.py`)\n"
        "raises `node.errors.Rejected`; `python -m tests.vectors.make`; `node/runners/*.py`\n"
        "`bus.open_client`, `bus/core/attempts.py: after_attempt`, `node.key`, "
        "`tests/vectors/secp256k1-<domain>.json`, `bench/results/x.py`\n"
        "`bus.core.keys.no_such_name`, `node/<nothing>/x.py`, ``node.store.hget(...)``\n"
    )
    assert stale_paths(text) == [
        (1, "node.messages.Rejected"),
        (1, "node/runners/workers.py"),
        (3, "bench/results/x.py"),
        (4, "bus.core.keys.no_such_name"),
        (4, "node/<nothing>/x.py"),
    ]

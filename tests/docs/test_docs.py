"""The documentation as a newcomer meets it: README a short front door, the pages it leads to
short where they must be, every relative link and anchor resolving, every module path the docs
name present, no code citing the benchmark logbook by a round's number, and the site building
strictly (mkdocs, when installed: CI installs the ``docs`` extra)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"(?ms)^ {0,3}(```|~~~).*?^ {0,3}\1")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"(?m)^#{1,6} +(.+?) *#*$")
EXPLICIT_ID = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']|\{#([\w-]+)\}""")
CODE_PATH = re.compile(r"`((?:crypto|bus|node|tests|deploy|examples|bench|docs)/[\w./-]*)`")
MODULE = re.compile(r"python3? -m ((?:crypto|bus|node|tests)(?:\.\w+)+)")
ORDINAL = (
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    r"thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth"
)
ROUND = re.compile(rf"\b(?:{ORDINAL}|\d+(?:st|nd|rd|th)) round\b", re.IGNORECASE)
HISTORY_CITE = re.compile(r"bench/HISTORY\.md#([\w-]+)")
PAGE_CITE = re.compile(r"\b(docs/[\w/.-]+\.md)(?:#([\w-]+))?")
README_CITE = re.compile(r"README:? \"([^\"\n]+)\"")
SOURCE_SUFFIXES = {".py", ".lua", ".sh", ".js", ".mjs", ".toml", ".yaml", ".service"}


def documents(root: Path = ROOT) -> list[Path]:
    """Every markdown file whose links must resolve."""
    found = [root / "README.md", root / "PROTOCOL.md"]
    found += sorted((root / "docs").rglob("*.md")) + sorted((root / "bench").glob("*.md"))
    return [p for p in found if p.is_file()]


def prose(text: str) -> str:
    """The text without its fenced code blocks (a link there is an example, not a link)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading: its text without markup,
    lowercased, punctuation dropped, spaces and hyphens run together into one hyphen."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    """The anchors a markdown file offers: its headings' (a repeated one gets _1, _2, ...) and
    the explicit ids written into it."""
    text = prose(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for heading in HEADING.findall(text):
        base = slug(heading)
        name, n = base, 0
        while name in found:
            n += 1
            name = f"{base}_{n}"
        found.add(name)
    found |= {a or b for a, b in EXPLICIT_ID.findall(text)}
    return found


def link_faults(doc: Path, root: Path = ROOT) -> list[str]:
    """Every relative link of ``doc`` that names no file, or an anchor its target lacks."""
    faults = []
    for target in LINK.findall(prose(doc.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http(s), mailto: not this repository's
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        where = f"{doc.relative_to(root)}: {target}"
        if not dest.exists():
            faults.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            faults.append(f"{where}: no such anchor")
    return faults


def path_faults(doc: Path, root: Path = ROOT) -> list[str]:
    """Every module path (`bus/core/keys.py`, `python -m node.host.signer`) ``doc`` names that
    is not in the repository."""
    text = doc.read_text(encoding="utf-8")
    name = doc.relative_to(root) if doc.is_relative_to(root) else doc.name
    faults = [
        f"{name}: `{named}`"
        for named in CODE_PATH.findall(text)
        if not (root / named.rstrip("/.")).exists()
    ]
    for module in MODULE.findall(text):
        if importlib.util.find_spec(module) is None:
            faults.append(f"{name}: python -m {module}")
    return faults


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines"


@pytest.mark.parametrize("name", ["docs/performance.md", "bench/README.md"])
def test_the_performance_pages_are_short(name: str) -> None:
    lines = (ROOT / name).read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"{name} has {lines} lines"


def test_every_relative_link_resolves() -> None:
    docs = documents()
    assert {"README.md", "PROTOCOL.md", "docs/index.md", "bench/HISTORY.md"} <= {
        str(p.relative_to(ROOT)) for p in docs
    }
    assert [fault for doc in docs for fault in link_faults(doc)] == []


def test_the_link_check_sees_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "page.md").write_text(
        '# A page\n\n## Modes: `[node] isolation`\n\n<a id="kept"></a>\n', encoding="utf-8"
    )
    doc = tmp_path / "index.md"
    doc.write_text(
        "# Index\n\n## Here\n\n[ok](sub/page.md#modes-node-isolation) [ok](sub/page.md#kept)"
        " [ok](#here) [web](https://example.org/x#y)\n[gone](sub/gone.md)"
        " [bad](sub/page.md#modes) [self](#there)\n```\n[example](not/a/link.md)\n```\n",
        encoding="utf-8",
    )
    assert link_faults(doc, tmp_path) == [
        "index.md: sub/gone.md: no such file",
        "index.md: sub/page.md#modes: no such anchor",
        "index.md: #there: no such anchor",
    ]


def test_every_module_path_the_docs_name_exists() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert [fault for doc in docs for fault in path_faults(doc)] == []


def test_the_path_check_sees_a_module_that_is_not_there(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(
        "`bus/core/keys.py`, `node/worker/`, `bus/core/nokeys.py`, `lua/<name>.lua`;\n"
        "`python -m node.host.signer` and `python -m node.host.nosigner`\n",
        encoding="utf-8",
    )
    faults = path_faults(doc, ROOT)
    assert [f.split(": ", 1)[1] for f in faults] == [
        "`bus/core/nokeys.py`",
        "python -m node.host.nosigner",
    ]


def sources(root: Path = ROOT) -> list[Path]:
    """The code, scripts and deploy files that may cite the docs (this file aside: it names
    what it looks for)."""
    found = [root / "conftest.py", root / "deploy" / "Dockerfile"]
    for top in ("bench", "bus", "crypto", "node", "tests", "deploy", "examples"):
        found += [p for p in sorted((root / top).rglob("*")) if p.suffix in SOURCE_SUFFIXES]
    me = Path(__file__).resolve()
    return [p for p in found if p.is_file() and p.resolve() != me]


def citation_faults(path: Path, root: Path = ROOT) -> list[str]:
    """A docs page, or an anchor of one, that a source file cites and that is not there, and a
    README section it names by its title that README does not have."""
    text = path.read_text(encoding="utf-8", errors="replace")
    name = path.relative_to(root)
    faults = []
    for page, anchor in PAGE_CITE.findall(text):
        if not (root / page).is_file():
            faults.append(f"{name}: {page}")
        elif anchor and anchor not in anchors(root / page):
            faults.append(f"{name}: {page}#{anchor}")
    readme = {slug(h) for h in HEADING.findall(prose((root / "README.md").read_text()))}
    faults += [f"{name}: README {t!r}" for t in README_CITE.findall(text) if slug(t) not in readme]
    return faults


def test_code_cites_docs_pages_and_sections_that_exist() -> None:
    assert [fault for path in sources() for fault in citation_faults(path)] == []


def test_the_citation_check_sees_a_moved_section(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    code = tmp_path / "code.py"
    code.write_text(
        '# README "Run the tests"; docs/use/runners.md#external-runners; docs/use/jobs.md\n'
        '# README "Web console"; docs/use/runner.md; docs/use/runners.md#external-runner\n',
        encoding="utf-8",
    )
    assert citation_faults(code, tmp_path) == [
        "code.py: docs/use/runner.md",
        "code.py: docs/use/runners.md#external-runner",
        "code.py: README 'Web console'",
    ]


def test_code_cites_the_benchmark_logbook_by_anchor_never_by_round() -> None:
    history = anchors(ROOT / "bench" / "HISTORY.md")
    by_round, dangling = [], []
    for path in sources():
        text = path.read_text(encoding="utf-8", errors="replace")
        by_round += [f"{path.relative_to(ROOT)}: {m}" for m in ROUND.findall(text)]
        cited = HISTORY_CITE.findall(text)
        dangling += [f"{path.relative_to(ROOT)}: #{a}" for a in cited if a not in history]
    assert by_round == []
    assert dangling == []
    assert ROUND.search("(bench/README.md, nineteenth round)")
    assert ROUND.search('bench/README.md "Eleventh round"')


needs_mkdocs = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs and mkdocs-material not installed (pip install -e '.[docs]'); CI builds the "
    "site strictly all the same (.ci/run)",
)


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@needs_mkdocs
def test_the_site_builds_strict(tmp_path: Path) -> None:
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "protocol" / "index.html").is_file()
    assert (tmp_path / "site" / "performance-history" / "index.html").is_file()


@needs_mkdocs
def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    """The strict build is only as strict as its validation settings: an anchor that names no
    heading must fail it, as a missing page does."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copy(ROOT / "PROTOCOL.md", copy / "PROTOCOL.md")
    (copy / "bench").mkdir()
    shutil.copy(ROOT / "bench" / "HISTORY.md", copy / "bench" / "HISTORY.md")
    page = copy / "docs" / "operate" / "upgrades.md"
    text = page.read_text(encoding="utf-8")
    broken = text.replace("sandbox.md#only-admitted-jobs-run", "sandbox.md#only-admitted-job", 1)
    assert broken != text
    page.write_text(broken, encoding="utf-8")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert "only-admitted-job" in done.stderr

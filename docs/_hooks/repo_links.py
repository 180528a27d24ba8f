"""mkdocs hook: the docs pages link to repository files by their relative paths, so that they
read the same on a forge as in the site. Two of those files are pages of the site as well
(PROTOCOL.md, bench/HISTORY.md, which stay where they are); a link to one of them becomes a link
to its page, and a link to any other file of the repository (code, examples) becomes its text,
since the site does not carry it. Everything else is left to mkdocs' own strict validation."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

# repository path -> the page of the site that shows it
INCLUDED = {"PROTOCOL.md": "protocol.md", "bench/HISTORY.md": "performance-history.md"}
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
_FENCE = re.compile(r"(?ms)^```.*?^```")


def _root(config: Any) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def _docs_prefix(config: Any) -> str:
    return Path(config["docs_dir"]).resolve().relative_to(_root(config)).as_posix()


def on_files(files: Files, config: Any) -> Files:
    root = _root(config)
    for repo_path, src_uri in INCLUDED.items():
        text = (root / repo_path).read_text(encoding="utf-8")
        files.append(File.generated(config, src_uri, content=text))
    return files


def _rewrite(match: re.Match[str], here: str, prefix: str) -> str:
    bang, text, target = match.groups()
    path, _, anchor = target.partition("#")
    if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path):
        return match.group(0)  # an anchor on this page, or an absolute URL
    repo = posixpath.normpath(posixpath.join(posixpath.dirname(here), path))
    page_dir = posixpath.dirname(_site_path(here, prefix))
    if repo.startswith(prefix + "/"):
        new = posixpath.relpath(repo[len(prefix) + 1 :], page_dir or ".")
    elif repo in INCLUDED:
        new = posixpath.relpath(INCLUDED[repo], page_dir or ".")
    else:
        return match.group(0) if bang else f"`{text.strip('`')}`"
    return f"{bang}[{text}]({new}{'#' + anchor if anchor else ''})"


def _site_path(repo_path: str, prefix: str) -> str:
    for repo, src_uri in INCLUDED.items():
        if repo == repo_path:
            return src_uri
    return repo_path[len(prefix) + 1 :]


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    prefix = _docs_prefix(config)
    src = page.file.src_uri
    here = next((r for r, s in INCLUDED.items() if s == src), f"{prefix}/{src}")
    out, last = [], 0
    # links inside code blocks are text, not links
    for block in _FENCE.finditer(markdown):
        out.append(_LINK.sub(lambda m: _rewrite(m, here, prefix), markdown[last : block.start()]))
        out.append(block.group(0))
        last = block.end()
    out.append(_LINK.sub(lambda m: _rewrite(m, here, prefix), markdown[last:]))
    return "".join(out)

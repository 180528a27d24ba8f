"""PROTOCOL.md against the code: its version, domains, field tables (signed or not, defaults,
required) and every refusal reason it names, so the document cannot drift from what nodes do."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bus.core import handshake
from bus.core.models import Message, RunnerJob
from bus.core.reasons import Reason
from bus.errors import ModelError
from crypto.signing import DOMAIN_PREFIX

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "PROTOCOL.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
REASONS = (ROOT / "docs" / "guarantees" / "refusals.md").read_text(encoding="utf-8")
RUNNERS = (ROOT / "docs" / "use" / "runners.md").read_text(encoding="utf-8")
REQUIRED_MESSAGE = {
    "id": "3",
    "caller_id": "7",
    "context_id": "1",
    "message_type": "job",
    "created_at": "1767225600",
    "origin": "a" * 64,
    "destination": "b" * 64,
}
REQUIRED_JOB = {"id": "4", "caller_id": "7", "context_id": "1", "script": "x", "script_type": "sh"}


def _section(heading: str) -> str:
    start = DOC.index(f"\n{heading}\n")
    end = DOC.find("\n#", start + len(heading) + 2)
    return DOC[start : end if end >= 0 else None]


def _rows(heading: str) -> list[tuple[list[str], list[str]]]:
    """(field names of the first cell, the other cells) of each field row of a section's table."""
    rows = []
    for line in _section(heading).splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows.append((re.findall(r"`([^`]+)`", cells[0]), cells[1:]))
    return rows


def _default(cell: str) -> object:
    token = re.search(r"`([^`]*)`", cell)
    assert token is not None, cell
    try:
        return json.loads(token.group(1))
    except ValueError:
        return token.group(1)


def _value(obj: object, name: str) -> object:
    value = getattr(obj, name)
    return value.value if hasattr(value, "value") else value


def test_version_and_signing_prefix_are_the_code_s() -> None:
    assert DOC.startswith(f"# The hero-bus protocol, version {handshake.PROTOCOL_VERSION}\n")
    assert f'"v": {handshake.PROTOCOL_VERSION},' in DOC
    assert f'"{DOMAIN_PREFIX}" + <domain> + "\\n"' in DOC


def test_the_domain_table_names_every_vector() -> None:
    domains = {names[0] for names, _ in _rows("### 3.3 Domains")}
    files = {
        p.stem.removeprefix("ed25519-") for p in (ROOT / "tests" / "vectors").glob("ed25519-*.json")
    }
    assert domains == files


def test_message_table_matches_the_model() -> None:
    rows = _rows("### 4.1 Message: `message:<caller_id>:<id>` (context DB)")
    assert [n for names, _ in rows for n in names] == list(Message.FIELDS)
    signed = [names[0] for names, cells in rows if cells[2].startswith("yes")]
    assert signed == [*Message.SIGNED[:9], "job", *Message.SIGNED[9:]]
    parsed = Message.from_hash(REQUIRED_MESSAGE)
    for names, cells in rows:
        if cells[1] == "required":
            with pytest.raises(ModelError):
                Message.from_hash({k: v for k, v in REQUIRED_MESSAGE.items() if k != names[0]})
        else:
            assert _value(parsed, names[0]) == _default(cells[1]), names


def test_job_table_matches_the_model() -> None:
    rows = _rows(
        "### 4.2 Job: an entry of a message's `job` list, and `job:<caller_id>:<id>` (context DB)"
    )
    names = [n for ns, _ in rows for n in ns]
    optional = (*RunnerJob.TARGETING, *RunnerJob.RETRY_POLICY)
    assert set(RunnerJob.FIELDS) | set(optional) == set(names)
    assert [ns[0] for ns, c in rows if c[2] == "yes"] == list(RunnerJob.SIGNED)
    only_set = [ns[0] for ns, c in rows if c[2].startswith("**only when non-empty")]
    assert only_set == list(optional)
    parsed = RunnerJob.from_hash(REQUIRED_JOB)
    for ns, cells in rows:
        if cells[1] == "required":
            with pytest.raises(ModelError):
                RunnerJob.from_hash({k: v for k, v in REQUIRED_JOB.items() if k != ns[0]})
        else:
            for name in ns:
                assert _value(parsed, name) == _default(cells[1]), name


def test_every_reason_the_document_names_is_a_reason_of_the_code() -> None:
    named = re.findall(r"\[`([a-z_]+)`\]\(docs/guarantees/refusals\.md#refusal-reasons\)", DOC)
    assert len(set(named)) >= 25
    assert not set(named) - {str(r) for r in Reason}
    # and the table they link to is the generated one (tests/bus/test_reasons.py keeps it equal)
    assert REASONS.startswith("# Refusal reasons\n")
    assert "<!-- reasons:begin -->" in REASONS


def test_the_document_keeps_no_list_of_its_own_of_the_reasons() -> None:
    assert "| `malformed` |" not in DOC


def test_the_readme_points_to_the_protocol() -> None:
    assert "](PROTOCOL.md)" in README
    assert "[External runners](docs/use/runners.md#external-runners)" in DOC
    assert "\n## External runners\n" in RUNNERS

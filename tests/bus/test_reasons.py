"""Refusal reasons: one StrEnum, listed in docs/guarantees/refusals.md from its own output."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from bus.core.reasons import Reason, markdown_table

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guarantees" / "refusals.md"


def test_readme_lists_every_reason_from_the_enum() -> None:
    text = PAGE.read_text(encoding="utf-8")
    match = re.search(r"<!-- reasons:begin -->\n(.*?)<!-- reasons:end -->", text, re.DOTALL)
    assert match is not None, "the refusals page has no reasons table"
    assert match.group(1) == markdown_table()


def test_the_module_prints_the_table() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bus.core.reasons"], capture_output=True, text=True, check=True
    ).stdout
    assert out == markdown_table()
    assert all(f"| `{reason}` |" in out for reason in Reason)


def test_every_reason_is_documented_and_compares_as_its_token() -> None:
    assert all(reason.doc for reason in Reason)
    assert Reason("too_many_deliveries") is Reason.TOO_MANY_DELIVERIES
    assert Reason.REPLAY == "replay"
    assert f"{Reason.PEER_REFUSED}_oversize" == "peer_refused_oversize"

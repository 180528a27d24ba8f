"""Issue 44: nothing in the tests asserts on timing. Hypothesis would, by default: an example
slower than its 200 ms deadline fails the test, which a loaded machine (CI's, two pytest
workers beside node processes) turns into a failure that says nothing about the code."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import settings

ROOT = Path(__file__).resolve().parents[2]


def test_property_tests_have_no_deadline() -> None:
    assert settings.default.deadline is None  # conftest.py's profile, loaded for every test


def test_no_settings_brings_a_deadline_back() -> None:
    """A ``settings(deadline=...)`` of a test file would override the profile for its tests;
    only ``deadline=None`` is allowed."""
    found = []
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.keyword) and node.arg == "deadline":
                if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                    found.append(f"{path.relative_to(ROOT)}:{node.value.lineno}")
    assert found == []

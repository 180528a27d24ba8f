"""Quoting hostile content: what a log line, a dlq entry or a refusal may carry of it."""

from __future__ import annotations


def printable(value: str | bytes, limit: int = 200) -> str:
    """``value`` as text that always encodes (bytes that are not UTF-8 and lone surrogates
    written as backslash escapes), cut to ``limit`` characters: what a log line or a dlq
    entry may quote of hostile content."""
    if isinstance(value, bytes):
        text = value.decode("utf-8", "backslashreplace")
    else:
        text = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars)"

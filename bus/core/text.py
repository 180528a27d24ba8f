"""Quoting hostile content: what a log line, a dlq entry or a refusal may carry of it."""

from __future__ import annotations

import json

from bus.core.ids import now


def printable(value: str | bytes, limit: int = 200) -> str:
    """``value`` as text that always encodes (bytes that are not UTF-8 and lone surrogates
    written as backslash escapes), cut to ``limit`` characters: what a log line or a dlq
    entry may quote of hostile content."""
    if isinstance(value, bytes):
        text = value.decode("utf-8", "backslashreplace")
    else:
        text = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars)"


def dlq_entry(key: str | bytes, reason: str, detail: str, queue: str) -> str:
    """A dead letter as JSON that always serialises (ASCII, surrogates escaped) and stays
    bounded whatever the refused content held: what the node's store and a runner process
    push on ``dlq``."""
    fields = {
        "key": printable(key, 1000),
        "reason": printable(reason),
        "detail": printable(detail, 2000),
    }
    return json.dumps(fields | {"at": now(), "queue": printable(queue, 1000)})

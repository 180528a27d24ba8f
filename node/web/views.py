"""How the console shows jobs, flows, messages and dead letters: plain functions from what
Valkey holds to what the page draws (no I/O; hostile content degrades to empty fields)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from bus.core.flows import FlowState

OUTPUT_CHARS: Final = 400  # the tail of a job's stdout/stderr that the page shows
JOB_FIELDS: Final = [
    "status",
    "script_type",
    "created_at",
    "updated_at",
    "result",
    "reason",
    "message_key",
    "attempt",
]
_DEAD_LETTER_FIELDS: Final = ("key", "reason", "detail", "at", "queue")
MESSAGE_FIELDS: Final = ["status", "destination", "origin", "message_type", "created_at", "reason"]

NameOf = Callable[[str], str]  # a node id -> the name the page shows


def flow_view(ctx: int, state: FlowState, name_of: NameOf) -> dict[str, Any]:
    """A flow and its jobs (where each runs, its status) for the page's DAG."""
    return {
        "id": str(state.id),
        "context": ctx,
        "name": state.name,
        "status": str(state.status),
        "reason": state.reason,
        "jobs": [
            {
                "id": j.id,
                "key": j.job_key,
                "node": name_of(j.node),
                "depends": list(j.depends),
                "status": str(j.status),
                "reason": j.reason,
                "stdout": j.stdout[-OUTPUT_CHARS:],
            }
            for j in state.jobs
        ],
    }


def message_view(
    ctx: int, key: str, row: dict[str, str], place: str, here: str, name_of: NameOf
) -> dict[str, Any]:
    """A message and where it is on its way: ``place`` is "queued" (in a peer's outbox),
    "sent" (awaiting the peer's ack) or ""; ``here`` is this node's id."""
    destination = row.get("destination", "") or here
    status = row.get("status", "")
    if place == "queued":
        delivery = f"in the outbox for {name_of(destination)}"
    elif place == "sent":
        delivery = f"sent to {name_of(destination)}, not acknowledged yet"
    else:
        texts = _LOCAL if destination == here else _DELIVERY
        delivery = texts.get(status, status)
    return {
        "key": key,
        "context": ctx,
        "status": status,
        "type": row.get("message_type", ""),
        "to": name_of(destination),
        "delivery": delivery,
        "reason": row.get("reason", ""),
        "created_at": _int(row.get("created_at")),
    }


_DELIVERY = {
    "dispatched": "waiting to be routed",
    "acknowledged": "stored and queued by the destination",
    "processed": "processed, result back",
    "error": "refused or failed",
}
_LOCAL = {
    "dispatched": "waiting to be routed",
    "acknowledged": "accepted here",
    "processed": "processed here",
    "error": "refused or failed",
}


def dead_letter_view(raw: str) -> dict[str, Any]:
    """A dlq entry as the page lists it; one that is not a JSON object, as unreadable."""
    try:
        entry = json.loads(raw)
    except ValueError:
        entry = None
    if not isinstance(entry, dict):
        entry = {"key": raw[:200], "reason": "unreadable"}
    return {k: str(entry.get(k, "")) for k in _DEAD_LETTER_FIELDS}


def job_view(ctx: int, key: str, row: dict[str, str]) -> dict[str, Any]:
    """A job as the page lists it: status, type, duration (s, once final) and output tails."""
    try:
        result = json.loads(row.get("result") or "{}")
    except ValueError:
        result = {}
    if not isinstance(result, dict):
        result = {}
    created, updated = _int(row.get("created_at")), _int(row.get("updated_at"))
    status = row.get("status", "")
    final = status in ("finished", "error")
    return {
        "key": key,
        "context": ctx,
        "status": status,
        "type": row.get("script_type", ""),
        "created_at": created,
        "duration_s": max(updated - created, 0) if final and created and updated else None,
        "attempt": _int(row.get("attempt")),
        "reason": row.get("reason", ""),
        "stdout": str(result.get("stdout", ""))[-OUTPUT_CHARS:],
        "stderr": str(result.get("stderr", ""))[-OUTPUT_CHARS:],
        "exit_code": str(result.get("exit_code", "")),
        "message": row.get("message_key", ""),
    }


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0

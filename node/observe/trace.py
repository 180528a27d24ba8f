"""One job's or one flow's life across the nodes it touched, assembled from the nodes' own
records (``hero-node job trace``). Pure, no I/O: the command gathers the records (its own
node's from its store, the peers' over their links: bus/core/traces.py) and this module
reads them.

A *record* is what bus/core/traces.py tells of a key: ``{"fields": {...}}`` for a message or a
flow (a flow's also ``"dag"``), and for a job also ``"attempts"``. Records are grouped by the node
that holds them: the same job has a hash on its origin (its copy, updated by the result) and on
the node that ran it (with its attempts).

Each hop says where (node), when (``at``, Unix seconds, ms precision where the node recorded
ms), how long (``duration_s``: the attempt's run, or the time since the job's previous hop),
which attempt, and its outcome. Retries are attempts, one hop each, never folded into one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Record = Mapping[str, Any]
Records = Mapping[str, Mapping[str, Record]]  # node id -> key -> record


@dataclass
class Hop:
    node: str
    at: float
    what: str
    outcome: str = ""
    attempt: int | None = None
    duration_s: float | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "at": self.at, "what": self.what}
        out["outcome"] = self.outcome
        out["attempt"] = self.attempt
        out["duration_s"] = None if self.duration_s is None else round(self.duration_s, 3)
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass
class JobTrace:
    key: str
    node: str = ""  # where it runs (or ran)
    status: str = ""
    reason: str = ""
    flow_job: str = ""
    depends: list[str] = field(default_factory=list)
    attempts: int = 0
    hops: list[Hop] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "flow_job": self.flow_job or None,
            "depends": self.depends,
            "node": self.node,
            "status": self.status,
            "reason": self.reason,
            "attempts": self.attempts,
            "hops": [h.to_dict() for h in self.hops],
        }


def _num(value: object) -> float | None:
    """A recorded number (a peer's records are text it chose): None unless finite and
    plausible, so that no record can make a time unprintable."""
    try:
        n = float(str(value))
    except ValueError:
        return None
    return n if math.isfinite(n) and 0 <= n < 1e14 else None


def _ms(value: object) -> float | None:
    n = _num(value)
    return None if n is None else n / 1000


def _message_hops(node: str, fields: Mapping[str, str]) -> list[Hop]:
    """A message's hops on ``node``: sent from its origin, received at its destination."""
    hops = []
    kind = fields.get("message_type", "job")
    origin = fields.get("origin", "")
    if node == origin and (t := _num(fields.get("created_at"))) is not None:
        hops.append(Hop(node, t, f"{kind} message submitted"))
    if (t := _num(fields.get("acked_at"))) is not None and node == origin:
        to = fields.get("destination", "")
        hops.append(Hop(node, t, "acknowledged by destination", detail=to))
    if (t := _num(fields.get("received_at"))) is not None:
        hops.append(Hop(node, t, "received", detail=fields.get("received_from", "")))
    status = fields.get("status", "")
    if status == "error":
        at = _num(fields.get("updated_at")) or 0.0
        hops.append(Hop(node, at, "message failed", "error", detail=fields.get("reason", "")))
    return hops


def _attempt_hops(node: str, record: Record) -> list[Hop]:
    """Each attempt of a job on the node that ran it; a job run once has no attempts list,
    its one attempt is read from the job hash."""
    fields = record.get("fields", {})
    entries = list(record.get("attempts", []))
    if not entries and fields.get("attempt"):
        started = _ms(fields.get("stats_started_ms")) or _num(fields.get("updated_at"))
        final = fields.get("status") in ("finished", "error")
        entries = [
            {
                "attempt": fields.get("attempt"),
                "status": fields.get("status", ""),
                "reason": fields.get("reason", ""),
                "started_at": started,
                "ended_at": _num(fields.get("updated_at")) if final else None,
            }
        ]
    hops = []
    for e in entries:
        start, end = _num(e.get("started_at")), _num(e.get("ended_at"))
        if start is None:
            continue
        attempt = int(_num(e.get("attempt")) or 0) or None
        dur = None if end is None else max(end - start, 0.0)
        hops.append(
            Hop(
                node,
                start,
                "attempt",
                str(e.get("status", "")),
                attempt,
                dur,
                str(e.get("reason", "")),
            )
        )
    return hops


def job_trace(key: str, records: Records) -> JobTrace:
    """One job's hops, from every node's records of it and of its message."""
    trace = JobTrace(key)
    held = {n: r[key] for n, r in records.items() if key in r}
    origins = (r.get("fields", {}).get("origin", "") for r in held.values())
    origin = next((o for o in origins if o), "")
    ran = next((n for n, r in held.items() if r.get("fields", {}).get("attempt")), "")
    for node, record in held.items():
        fields = record.get("fields", {})
        trace.node = trace.node or fields.get("node", "")
        if node == (ran or node) and fields.get("status"):
            trace.status, trace.reason = fields["status"], fields.get("reason", "")
        message_key = fields.get("message_key", "")
        message = records[node].get(message_key, {}).get("fields") if message_key else None
        if message:
            trace.hops.extend(_message_hops(node, message))
        if node == ran:
            if (t := _ms(fields.get("stats_queued_ms"))) is not None:
                trace.hops.append(Hop(node, t, "queued"))
            attempts = _attempt_hops(node, record)
            trace.attempts = len(attempts)
            trace.hops.extend(attempts)
        elif node == origin and ran and fields.get("status") in ("finished", "error"):
            at = _num(fields.get("updated_at")) or 0.0
            trace.hops.append(Hop(node, at, "result received", fields["status"]))
    trace.node = trace.node or ran
    if not ran and not trace.status and held:
        first = next(iter(held.values())).get("fields", {})
        trace.status, trace.reason = first.get("status", ""), first.get("reason", "")
    trace.hops.sort(key=_order)
    _durations(trace.hops)
    return trace


# where hops recorded in the same second go: in the order a job lives them (many records are
# whole seconds, so a result and the attempt that made it often share one)
_STEPS = {  # the longer names first: "result received" is not "received"
    "result received": 5, "message failed": 6, "submitted": 0, "acknowledged by destination": 1,
    "received": 2, "queued": 3, "attempt": 4,
}  # fmt: skip


def _order(hop: Hop) -> tuple[float, int, int]:
    step = next((n for s, n in _STEPS.items() if hop.what.endswith(s)), len(_STEPS))
    return hop.at, step, hop.attempt or 0


def _durations(hops: list[Hop]) -> None:
    """A hop without a measured duration took the time since the hop before it."""
    for before, hop in zip(hops, hops[1:], strict=False):
        if hop.duration_s is None:
            hop.duration_s = max(hop.at - before.at, 0.0)


def flow_trace(
    flow_fields: Mapping[str, str], dag: list[dict[str, Any]], caller: int, records: Records
) -> dict[str, Any]:
    """A flow as its DAG: each job on its node, with its hops and attempts."""
    jobs = []
    for spec in dag:
        job = job_trace(f"job:{caller}:{spec['job_id']}", records)
        job.flow_job, job.depends = spec["id"], spec["depends"]
        job.node = job.node or spec["node"]
        if not job.status:
            job.status = "not released"  # a job whose prerequisites never finished
        jobs.append(job.to_dict())
    return {
        "id": int(flow_fields.get("id", "0") or 0),
        "name": flow_fields.get("name", ""),
        "status": flow_fields.get("status", ""),
        "reason": flow_fields.get("reason", ""),
        "origin": flow_fields.get("origin", ""),
        "created_at": _num(flow_fields.get("created_at")),
        "updated_at": _num(flow_fields.get("updated_at")),
        "jobs": jobs,
    }

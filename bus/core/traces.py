"""A node asking a peer for its part of a job's or a flow's life: the request and the answer,
their bounds and their checks. Pure, no I/O.

An :class:`Ask` is written by an actor (``hero-node job trace``) at its own node, signed by the
actor under domain ``trace-ask`` over every field but its signatures, and carried by that node
to the peer in an ``ask`` frame. The peer answers with one ``tell`` frame: the records it holds
for the named keys, reduced to what a timeline needs (:data:`JOB_FIELDS`, :data:`MESSAGE_FIELDS`,
:data:`FLOW_FIELDS`, attempts), or a refusal with a reason. Never a script, an environment value
or an output: a reader of a context may follow its jobs, and a trace is shown to people and
pasted into tickets.

Why a signed actor and not just the link: the link proves which *node* asks, not on whose
behalf. The answering node checks the actor against its own registry (its key, and that it
is a reader, executor or admin of the context there), as it would check a message. An ask
changes nothing, so it needs freshness (a bounded age) but no replay marker: replayed, it
can only reveal again the same records to the same node, over the link it was bound to.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bus.core.asks import AskRefused, SignedAsk, checked_object, route_problem
from bus.core.reasons import Reason
from bus.core.verify import Freshness

DOMAIN_ASK = "trace-ask"
MAX_KEYS = 32  # keys one ask may name: a flow's jobs are asked for in chunks of this
MAX_RECORDS = 2 * MAX_KEYS  # records one tell holds: each job's message comes with it
MAX_ATTEMPTS = 32  # attempts told per job (the newest ones; ``attempts_total`` says how many)
MAX_VALUE_CHARS = 512  # a told field longer than this is cut (a reason with a long detail)
MAX_TELL_BYTES = 256 * 1024  # an answer bigger than this is refused as oversize, not cut
MAX_ASK_BYTES = 8 * 1024  # an ask frame's ``ask`` object, encoded

# what a timeline reads of each record, and nothing else
JOB_FIELDS = (
    "id", "caller_id", "context_id", "script_type", "status", "reason", "created_at",
    "updated_at", "message_key", "flow_id", "flow_job", "node", "origin", "attempt",
    "retries", "runner_id", "stats_queued_ms", "stats_started_ms",
)  # fmt: skip
MESSAGE_FIELDS = (
    "id", "caller_id", "context_id", "message_type", "status", "reason", "created_at",
    "updated_at", "origin", "destination", "received_at", "received_from", "acked_at",
    "processed_at",
)  # fmt: skip
FLOW_FIELDS = (
    "id", "caller_id", "context_id", "name", "status", "reason", "origin", "created_at",
    "updated_at", "jobs",
)  # fmt: skip
ATTEMPT_FIELDS = ("attempt", "runner", "status", "reason", "started_at", "ended_at")

_KEY = re.compile(r"(job|message):\d{1,20}:\d{1,20}|flow:\d{1,20}")


def is_traceable(key: str) -> bool:
    """Whether ``key`` names what a trace follows: ``job:<caller>:<id>``, ``message:<caller>:<id>``
    or ``flow:<id>``."""
    return _KEY.fullmatch(key) is not None


@dataclass(frozen=True)
class Ask(SignedAsk):
    """What an actor asks a peer (``target``) through its node (``node``)."""

    DOMAIN = DOMAIN_ASK

    id: int
    caller_id: int
    context_id: int
    node: str  # the asking node: the answering node checks its link comes from there
    target: str  # the answering node
    keys: tuple[str, ...]
    created_at: int
    nonce: str
    signatures: tuple[Mapping[str, str], ...] = field(default=(), compare=False)


def parse_ask(obj: object) -> Ask:
    """An :class:`Ask` from its wire object; AskRefused(malformed) naming what is wrong."""
    ints = ("id", "caller_id", "context_id", "created_at")
    checked = checked_object(obj, "ask", ints)
    names = checked.get("keys")
    if not isinstance(names, list) or not 0 < len(names) <= MAX_KEYS:
        raise AskRefused(Reason.MALFORMED, f"ask must name 1 to {MAX_KEYS} keys")
    bad = [k for k in names if not isinstance(k, str) or not is_traceable(k)]
    if bad:
        raise AskRefused(Reason.MALFORMED, f"not a job, message or flow key: {str(bad[0])[:80]!r}")
    return Ask(
        id=checked["id"],
        caller_id=checked["caller_id"],
        context_id=checked["context_id"],
        node=checked["node"],
        target=checked["target"],
        keys=tuple(names),
        created_at=checked["created_at"],
        nonce=checked["nonce"],
        signatures=tuple(checked["signatures"]),
    )


def ask_problem(
    ask: Ask, *, link_peer: str, own_id: str, now: int, freshness: Freshness
) -> AskRefused | None:
    """What the link and the clock refuse in an ask (None if nothing): it comes from the node
    it names, is for this node, and is fresh. The actor is checked by :func:`actor_problem`."""
    return route_problem(ask, link_peer=link_peer, own_id=own_id, now=now, freshness=freshness)


def actor_problem(
    ask: Ask, pubkey: str | None, algorithm: str, readers: Sequence[int] | None
) -> AskRefused | None:
    """What the answering node's registry refuses (None if nothing): ``pubkey`` is the actor's
    registered key (None: unknown actor), ``readers`` every actor who may read the context
    there (its readers, executors and admins; None: no such context)."""
    if readers is None:
        return AskRefused(
            Reason.UNKNOWN_CONTEXT, f"context {ask.context_id} does not exist on this node"
        )
    if pubkey is None:
        return AskRefused(Reason.UNKNOWN_SIGNER, f"actor {ask.caller_id} is not registered here")
    refused = ask.signature_problem(pubkey, algorithm)
    if refused is not None:
        return refused
    if ask.caller_id not in readers:
        return AskRefused(
            Reason.PERMISSION_DENIED,
            f"actor {ask.caller_id} may not read context {ask.context_id} here",
        )
    return None


# -- the answer ------------------------------------------------------------------------------


def _cut(value: str) -> str:
    return value if len(value) <= MAX_VALUE_CHARS else value[: MAX_VALUE_CHARS - 1] + "…"


def told_fields(record: Mapping[str, str], names: Sequence[str]) -> dict[str, str]:
    """The fields ``names`` of a stored hash, cut to :data:`MAX_VALUE_CHARS`."""
    return {n: _cut(str(record[n])) for n in names if n in record}


def told_attempts(entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The newest :data:`MAX_ATTEMPTS` attempt entries, reduced to :data:`ATTEMPT_FIELDS`."""
    return [
        {n: _cut(v) if isinstance(v, str) else v for n, v in e.items() if n in ATTEMPT_FIELDS}
        for e in entries[-MAX_ATTEMPTS:]
    ]


@dataclass(frozen=True)
class Tell:
    """A node's answer to an ask: its records by key (absent keys are not told), or a
    refusal (``reason`` non-empty)."""

    ask: int
    node: str
    records: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    reason: str = ""
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ask": self.ask, "node": self.node}
        if self.reason:
            return out | {"reason": self.reason, "detail": _cut(self.detail)}
        return out | {"records": {k: dict(v) for k, v in self.records.items()}}


def parse_tell(obj: object) -> Tell:
    """A :class:`Tell` from its wire object; AskRefused(malformed) if it is not one."""
    if not isinstance(obj, dict):
        raise AskRefused(Reason.MALFORMED, "tell is not an object")
    ask, node = obj.get("ask"), obj.get("node")
    if not isinstance(ask, int) or isinstance(ask, bool) or not isinstance(node, str):
        raise AskRefused(Reason.MALFORMED, "tell needs an integer 'ask' and a 'node'")
    reason, detail = obj.get("reason", ""), obj.get("detail", "")
    records = obj.get("records", {})
    if not isinstance(reason, str) or not isinstance(detail, str):
        raise AskRefused(Reason.MALFORMED, "tell's reason and detail must be strings")
    if not isinstance(records, dict) or len(records) > MAX_RECORDS:
        raise AskRefused(Reason.MALFORMED, f"tell's records: an object of up to {MAX_RECORDS}")
    for key, record in records.items():
        problem = _record_problem(record)
        if problem:
            raise AskRefused(Reason.MALFORMED, f"tell's record of {str(key)[:80]!r}: {problem}")
    return Tell(ask, node, records, reason, detail)


_SCALAR = (str, int, float, type(None))


def _record_problem(record: object) -> str:
    """Why a told record is not one a timeline can read ("" if it is): a peer is an
    authenticated node, not a trusted one."""
    if not isinstance(record, dict) or set(record) - {"fields", "attempts", "dag"}:
        return "not an object of fields, attempts and dag"
    fields = record.get("fields", {})
    if not isinstance(fields, dict) or not all(isinstance(v, str) for v in fields.values()):
        return "fields must map names to strings"
    attempts, dag = record.get("attempts", []), record.get("dag", [])
    if not isinstance(attempts, list) or len(attempts) > MAX_ATTEMPTS:
        return f"attempts must be a list of up to {MAX_ATTEMPTS}"
    if not all(
        isinstance(a, dict) and all(isinstance(v, _SCALAR) for v in a.values()) for a in attempts
    ):
        return "an attempt must map names to numbers or strings"
    if not isinstance(dag, list) or len(dag) > 4 * MAX_KEYS:
        return "dag must be a list"
    for job in dag:
        if not (
            isinstance(job, dict)
            and isinstance(job.get("id"), str)
            and isinstance(job.get("job_id"), int)
            and isinstance(job.get("node"), str)
            and isinstance(job.get("depends"), list)
            and all(isinstance(d, str) for d in job["depends"])
        ):
            return "a dag job needs id, job_id, node and depends"
    return ""


# -- reading the records a tell holds ----------------------------------------------------------


def flow_dag(flow_fields: Mapping[str, str]) -> list[dict[str, Any]]:
    """A flow's jobs from its signed document: id, RunnerJob id, node, depends (never a
    script or an env value). [] if the document cannot be read."""
    try:
        doc = json.loads(flow_fields.get("doc", ""))
        jobs = doc["jobs"]
        return [
            {
                "id": str(j["id"]),
                "job_id": int(j["job_id"]),
                "node": str(j.get("node", "")),
                "depends": [str(d) for d in j.get("depends", j.get("dependends", []))],
            }
            for j in jobs
        ]
    except (ValueError, KeyError, TypeError):
        return []


def message_job_keys(message_fields: Mapping[str, str]) -> list[str]:
    """The keys of the jobs a message carries ([] if its ``job`` field cannot be read)."""
    try:
        jobs = json.loads(message_fields.get("job", "[]"))
        return [f"job:{int(j['caller_id'])}:{int(j['id'])}" for j in jobs]
    except (ValueError, KeyError, TypeError):
        return []

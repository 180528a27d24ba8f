"""Atomic steps of the routing of messages (``routing_*.lua``): delivery over a link, acks,
materialising jobs, results at the origin, message deadlines and stops.

Each async function runs on DB ``ctx`` of a :class:`~bus.store.Store`; the two functions that
take ``tx`` queue their script in a transaction of :meth:`~bus.store.Store.transaction`, to
run atomically with the other writes queued there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bus import keys
from bus.atomic import script, source
from bus.models import Message

if TYPE_CHECKING:
    from bus.store import Store

__all__ = [
    "JobWrite",
    "ResultAccept",
    "ResultWrite",
    "accept_results",
    "apply_result",
    "deliver",
    "mark_acked",
    "materialise_batch",
    "pop_due",
    "stop_job",
    "write_own_job",
]


def _flat(fields: dict[str, str]) -> list[str]:
    return [x for kv in fields.items() for x in kv]


async def deliver(store: Store, ctx: int, messages: list[tuple[str, dict[str, str]]]) -> list[bool]:
    """Store each (message key, fields) and queue it on ``msg_in`` unless the key exists
    (pipelined, each atomic); per message, True if it was stored, False if already here."""
    deliver_one = script("routing_deliver")
    calls = [(deliver_one, [key, keys.MSG_IN], _flat(fields)) for key, fields in messages]
    return [bool(stored) for stored in await store.scripts(ctx, calls)]


async def mark_acked(
    store: Store, ctx: int, message_keys: list[str], *, now: int, peer: str
) -> list[bool]:
    """Mark each message acknowledged by ``peer``, if it was sent to that peer (pipelined);
    per message, whether it was."""
    ack = script("routing_ack")
    calls = [(ack, [key], [str(now), peer]) for key in message_keys]
    return [bool(done) for done in await store.scripts(ctx, calls)]


@dataclass(frozen=True)
class JobWrite:
    """One job hash to write, and the queue to put its key on ("" for none)."""

    key: str
    queue: str
    fields: dict[str, str]


async def materialise_batch(
    store: Store,
    ctx: int,
    inflight: str,
    batch: list[tuple[Message, list[JobWrite]]],
    *,
    now: int,
    window_s: int,
    depth_of: list[str],
) -> tuple[list[int], int, list[str]]:
    """Write each message's jobs unless the message (key or nonce) was accepted before or one
    of its job keys is another message's, in one atomic script. Returns one code per message
    (0 written; 1 replay of its key, 2 of its nonce, 3 a job key held by another message:
    nothing written for it), the depth of the deepest queue of ``depth_of`` afterwards, and
    per message the job key refused and its holder ("" if none)."""
    payload = [
        {
            "key": message.key,
            "seen": keys.seen(message.key),
            "nonce": keys.nonce(message.caller_id, message.nonce) if message.nonce else "",
            "jobs": [{"key": j.key, "queue": j.queue, "fields": _flat(j.fields)} for j in jobs],
        }
        for message, jobs in batch
    ]
    args = [json.dumps(payload), str(now), str(window_s)]
    materialise = script("routing_materialise")
    codes, depth, owners = await store.script(ctx, materialise, [inflight, *depth_of], args)
    return [int(c) for c in codes], int(depth), [str(o) for o in owners]


def write_own_job(tx: Any, job_key: str, message_key: str, fields: dict[str, str]) -> None:
    """Queue in ``tx`` the write of job hash ``job_key`` of message ``message_key`` (``fields``
    must name it as message_key), unless that key holds another message's job."""
    tx.eval(source("routing_write_own_job"), [job_key], [message_key, *_flat(fields)])


@dataclass(frozen=True)
class ResultWrite:
    """What a result changes at its origin (``routing_apply_result_fn.lua``)."""

    job_key: str
    request: str  # the request message's key
    status: str  # the job's final status
    result: str  # JSON
    reason: str
    stamp: int
    request_status: str
    reply: str  # JSON, pushed on the request's reply list
    reply_ttl_s: int

    def script_keys(self) -> list[str]:
        return [self.job_key, self.request, keys.reply(self.request), keys.FLOW_EVENTS]

    def script_args(self) -> list[str]:
        return [
            self.status,
            self.result,
            self.reason,
            str(self.stamp),
            self.request_status,
            self.reply,
            str(self.reply_ttl_s),
        ]


def apply_result(tx: Any, write: ResultWrite) -> None:
    """Queue in ``tx`` what a result changes at its origin."""
    tx.eval(source("routing_apply_result"), write.script_keys(), write.script_args())


@dataclass(frozen=True)
class ResultAccept:
    """A verified result message to accept: its key, nonce marker ("" if none), signer."""

    message_key: str
    nonce_key: str
    origin: str
    write: ResultWrite


async def accept_results(
    store: Store,
    ctx: int,
    inflight: str,
    results: list[ResultAccept],
    *,
    window_s: int,
    node_id: str,
) -> list[tuple[str, str]]:
    """Accept each result in order, each atomically with its checks (pipelined): per result
    ("ok", "") or (reason, detail) with nothing written; see routing_accept_result.lua."""
    accept = script("routing_accept_result")
    calls = [
        (
            accept,
            [r.message_key, keys.seen(r.message_key), r.nonce_key, inflight]
            + r.write.script_keys(),
            [*r.write.script_args(), str(window_s), r.message_key, r.origin, node_id],
        )
        for r in results
    ]
    return [(str(reason), str(detail)) for reason, detail in await store.scripts(ctx, calls)]


async def pop_due(store: Store, ctx: int, now_ms: int) -> tuple[int, list[str]]:
    """Take every message deadline due by ``now_ms`` off ``deadlines``: the next due time
    (Unix ms, -1 if none is left) and the due members (``ack|<key>``, ``result|<key>``)."""
    after, due = await store.script(ctx, script("routing_pop_due"), [keys.DEADLINES], [str(now_ms)])
    return int(after), [str(m) for m in due]


async def stop_job(
    store: Store, ctx: int, job_key: str, script_type: str, *, reason: str, now: int
) -> str:
    """Stop job ``job_key``: a queued one leaves its queue and ends in error (``reason``), a
    started one is announced on its type's stop list. The status it had ("" if none)."""
    names = [job_key, keys.queue(script_type), keys.DELAYED, keys.stop_queue(script_type)]
    before = await store.script(ctx, script("routing_stop"), names, [reason, str(now), job_key])
    return str(before)

"""Atomic steps of the routing of messages (``routing_*.lua``): delivery over a link, acks,
the origin's copies of jobs sent to a peer, results at the origin, message deadlines and
stops. Materialising a job message on this node's run queues is a step of the intake queues
(:mod:`bus.store.atomic.queues`).

Each async function runs on DB ``ctx`` of a :class:`~bus.store.connection.Store`; the two
functions that take ``tx`` queue their script in a transaction of
:meth:`~bus.store.connection.Store.transaction`, to run atomically with the other writes queued
there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bus.core import keys
from bus.core.models import Message, MessageStatus, flat_fields, json_arg
from bus.store.atomic import script, source
from bus.store.atomic.queues import JobWrite

if TYPE_CHECKING:
    from bus.store.connection import Store

__all__ = [
    "ResultAccept",
    "ResultWrite",
    "Routed",
    "StopAccept",
    "accept_results",
    "accept_stop",
    "apply_result",
    "deadline_members",
    "deliver",
    "fail_request",
    "held",
    "hold",
    "mark_acked",
    "pop_due",
    "push_outboxes",
    "queue_outgoing",
    "release",
    "reply_targets",
    "route",
    "stop_job",
    "withdraw",
    "write_copies",
    "write_own_job",
]


async def deliver(
    store: Store,
    ctx: int,
    messages: list[tuple[str, dict[str, str]]],
    *,
    durable_since: int | None = None,
) -> list[bool]:
    """Store each (message key, fields) and queue it on ``msg_in`` unless the key exists, in
    one atomic script; per message, True if it was stored, False if already here.

    ``durable_since`` (:attr:`Store.epoch` before the promise's first write): return only once
    these messages, stored now or before, and every write before them are durable
    (:meth:`Store.scripts_durable`: one ``WAITAOF`` on the connection that stored them)."""
    if not messages:
        return []
    args: list[str] = []
    for _, fields in messages:
        args += [str(2 * len(fields)), *flat_fields(fields)]
    calls = [(script("routing_deliver"), [keys.MSG_IN, *(key for key, _ in messages)], args)]
    if durable_since is None:
        [found] = await store.scripts(ctx, calls)
    else:
        [found] = await store.scripts_durable(ctx, calls, durable_since, _stored_any)
    return [bool(stored) for stored in found]


def _stored_any(results: list[Any]) -> bool:
    """Whether the delivery script stored a message: then the ``WAITAOF`` on its connection
    covers every redelivered one too. The script is atomic, so each message it found stored
    was written before its own writes; one that stored nothing needs the barrier's write."""
    [found] = results
    return any(bool(stored) for stored in found)


async def mark_acked(
    store: Store, ctx: int, message_keys: list[str], *, now: int, peer: str
) -> list[bool]:
    """Mark each message acknowledged by ``peer``, if it was sent to that peer (one script
    call); per message, whether it was."""
    if not message_keys:
        return []
    found = await store.script(ctx, script("routing_ack"), message_keys, [str(now), peer])
    return [bool(done) for done in found]


async def hold(
    store: Store, ctx: int, inflight: str, message_key: str, peer: str, deadline: int
) -> bool:
    """Move job message ``message_key`` from the consumer's ``inflight`` list to ``msg_held``
    (atomic), under ``peer`` (whose ack it waits for) and its ack ``deadline`` (Unix s);
    whether it was in flight."""
    member = keys.held_member(peer, message_key)
    found = await store.script(
        ctx,
        script("routing_hold"),
        [inflight, keys.MSG_HELD],
        [message_key, member, str(deadline)],
    )
    return bool(found)


async def held(store: Store, ctx: int) -> list[tuple[str, str, int]]:
    """What ``msg_held`` holds: (peer, message key, ack deadline in Unix s), soonest first."""
    scored = await store.read(ctx, lambda r: r.zrange(keys.MSG_HELD, 0, -1, withscores=True))
    out = []
    for member, score in scored:
        peer, _, message_key = str(member).partition("|")
        out.append((peer, message_key, int(score)))
    return out


async def release(store: Store, ctx: int, entries: list[tuple[str, str]], boot: str) -> int:
    """Queue held (peer, message key) ``entries`` on ``msg_in`` again (pipelined, each atomic),
    recording ``boot`` as the boot that acknowledged them ("" for none); how many were."""
    release_one = script("routing_release")
    calls = [
        (release_one, [keys.MSG_HELD, keys.MSG_IN, key], [keys.held_member(peer, key), boot])
        for peer, key in entries
    ]
    return sum(bool(done) for done in await store.scripts(ctx, calls))


def write_own_job(
    tx: Any,  # noqa: ANN401
    job_key: str,
    message_key: str,
    fields: dict[str, str],
    *,
    count: bool = False,
) -> Any:  # noqa: ANN401
    """Queue in ``tx`` the write of job hash ``job_key`` of message ``message_key`` (``fields``
    must name it as message_key), unless that key holds another message's job; ``count``: its
    job statistics are returned (``{written, [field, increment, ...]}``), not written."""
    args = [message_key, "1" if count else "", *flat_fields(fields)]
    return tx.eval(source("routing_write_own_job"), [job_key], args)


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
    reply_to: str = ""  # the request's signed reply_to (its client's inbox), "" if none

    def script_keys(self) -> list[str]:
        reply_list = keys.reply_list(self.request, self.reply_to)
        return [self.job_key, self.request, reply_list, keys.FLOW_EVENTS]

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
    """A verified result message to accept: its key, nonce marker (a field of the replay
    hash, "" if none), signer."""

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
    counted: list[str] | None = None,
) -> list[tuple[str, str]]:
    """Accept each result in order, each with its checks, in one atomic script
    (routing_accept_results.lua): per result ("ok", "") or (reason, detail) with nothing of it
    written. ``counted``: as :func:`~bus.store.atomic.queues.materialise_batch`'s."""
    if not results:
        return []
    batch = [
        {
            "key": r.message_key,
            "seen": keys.seen(r.message_key),
            "nonce": r.nonce_key,
            "origin": r.origin,
            "keys": r.write.script_keys(),
            "args": r.write.script_args(),
        }
        for r in results
    ]
    args = [json_arg(batch), str(window_s), node_id, "1" if counted is not None else ""]
    verdicts, figures = await store.script(
        ctx, script("routing_accept_results"), [keys.REPLAY, inflight], args
    )
    if counted is not None:
        counted += [str(f) for f in figures]
    return [(str(reason), str(detail)) for reason, detail in verdicts]


async def reply_targets(store: Store, ctx: int, requests: list[str]) -> list[str]:
    """The ``reply_to`` of each request message at its origin ("" if it has none, or is no
    hash), in one round trip: where the answers its results carry are pushed."""
    if not requests:
        return []
    found = await store.script(ctx, script("routing_reply_targets"), requests, [])
    return [v.decode() if isinstance(v, bytes) else str(v) for v in found]


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


async def queue_outgoing(store: Store, ctx: int, message: Message) -> None:
    """Store ``message`` and queue it on ``msg_out``, in one transaction, so the supervisor
    never pops a key whose hash is missing. Raises StoreError."""
    async with store.transaction(ctx) as tx:
        tx.hset(message.key, message.to_hash())
        tx.lpush(keys.MSG_OUT, [message.key])


@dataclass(frozen=True)
class StopAccept:
    """An accepted stop message: its key, its replay markers' TTL and its nonce marker (a field
    of the replay hash, "" for a message without a nonce)."""

    key: str
    window_s: int
    nonce_key: str


async def accept_stop(store: Store, ctx: int, inflight: str, stop: StopAccept) -> None:
    """Mark the stop message processed, set its replay markers (TTL ``window_s``) and take it
    off ``inflight``, in one transaction: a crash leaves it either unaccepted (popped again)
    or fully accepted (never replayed). Raises StoreError."""
    async with store.transaction(ctx) as tx:
        tx.hset(stop.key, {"status": MessageStatus.PROCESSED.value})
        markers = {keys.seen(stop.key): "1"}
        if stop.nonce_key:
            markers[stop.nonce_key] = stop.key
        tx.hsetex(keys.REPLAY, markers, ex=stop.window_s)
        tx.lrem(inflight, 1, stop.key)


def deadline_members(
    message_key: str, ack_ms: int, result_ms: int
) -> dict[str | bytes, int | float]:
    """The members of ``deadlines`` that arm a job message's ack and result deadlines (Unix
    ms), with their scores."""
    return {f"ack|{message_key}": ack_ms, f"result|{message_key}": result_ms}


async def write_copies(store: Store, ctx: int, message_key: str, copies: list[JobWrite]) -> None:
    """Write the origin's copies of message ``message_key``'s jobs (see write_own_job), in one
    transaction. Raises StoreError."""
    async with store.transaction(ctx) as tx:
        for copy in copies:
            write_own_job(tx, copy.key, message_key, copy.fields)


@dataclass(frozen=True)
class Routed:
    """A checked message leaving ``msg_out``: ``local`` when this node is its destination;
    for a job message to a peer, the origin's job copies and its deadlines (ack, result; ms)."""

    key: str
    local: bool
    copies: list[JobWrite]
    deadlines: tuple[int, int] | None


async def push_outboxes(store: Store, by_peer: dict[str, list[str]]) -> None:
    """Push each peer's outbox entries onto its durable outbox, in one transaction on the
    actors DB (one LPUSH, atomic by itself, for a single peer: a coredis transaction costs
    ~200 us more CPU than one command here). Raises StoreError."""
    if len(by_peer) == 1:
        [(peer, entries)] = by_peer.items()
        await store.lpush(keys.ACTORS_DB, keys.outbox(peer), *entries)
        return
    async with store.transaction(keys.ACTORS_DB) as tx:
        for peer, entries in by_peer.items():
            tx.lpush(keys.outbox(peer), entries)


async def route(
    store: Store, ctx: int, inflight: str, routed: list[Routed], counted: list[str] | None = None
) -> None:
    """Queue each local message on ``msg_in``; write each job message's origin copies and arm
    its deadlines; ack every one off ``inflight``: one script (``routing_route.lua``), so a
    message is never acked without what routing it wrote. ``counted``: as
    :func:`~bus.store.atomic.queues.materialise_batch`'s. Raises StoreError."""
    batch = [
        {
            "key": r.key,
            "to_msg_in": "1" if r.local else "",
            "copies": [{"key": c.key, "fields": flat_fields(c.fields)} for c in r.copies],
            "deadlines": [] if r.deadlines is None else _zadd_args(r.key, r.deadlines),
        }
        for r in routed
    ]
    args = [json_arg(batch), "1" if counted is not None else ""]
    figures = await store.script(
        ctx, script("routing_route"), [keys.MSG_IN, inflight, keys.DEADLINES], args
    )
    if counted is not None:
        counted += [str(f) for f in figures]


def _zadd_args(message_key: str, times: tuple[int, int]) -> list[str]:
    """A ZADD's score and member pairs for the deadlines of ``message_key``."""
    members = deadline_members(message_key, *times)
    return [x for m, ms in members.items() for x in (str(ms), str(m))]


async def fail_request(
    store: Store, ctx: int, key: str, writes: list[ResultWrite], reason: str
) -> None:
    """Apply each of ``writes`` (a job's error result at its origin) and set request ``key``
    to error with ``reason``, in one transaction. Raises StoreError."""
    async with store.transaction(ctx) as tx:
        for write in writes:
            apply_result(tx, write)
        tx.hset(key, {"status": MessageStatus.ERROR.value, "reason": reason})


async def withdraw(store: Store, peer: str, entry: str) -> int:
    """Take ``entry`` out of ``peer``'s outbox and its in-flight list in one transaction (the
    pump moves an entry atomically from one to the other, so it is in neither afterwards);
    returns how many in-flight copies it removed. Raises StoreError."""
    async with store.transaction(keys.ACTORS_DB) as tx:
        tx.lrem(keys.outbox(peer), 0, entry)
        sent = tx.lrem(keys.outbox_inflight(peer), 0, entry)
    return int(await sent)

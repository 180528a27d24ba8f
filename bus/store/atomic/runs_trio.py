"""The runner transitions of :mod:`bus.store.atomic.runs` on the node's trio store, as named
operations: the attempts the node ends itself (a slot's recovery, node/runners/recovery.py), the
leases it renews and reaps and the answers it gives for external runners (node/runners/
external.py), and what it reads of the runners. A runner process runs the same calls on its
blocking connection (bus/store/atomic/runs_sync.py).

The results service of external runners answers each final job once (``runs_answered.lua``):
only the attempt it read, with the status it read.
"""

from __future__ import annotations

from dataclasses import dataclass

from bus.core import keys
from bus.core.ids import now
from bus.core.models import Message, flat_fields, json_arg
from bus.store.atomic import script
from bus.store.atomic.runs import Ending, finish_call, finish_local_call, retry_call
from bus.store.connection import Store

__all__ = [
    "Answered",
    "LAPSED_PER_CALL",
    "answer_local",
    "answer_remote",
    "answered_retry",
    "attempt_state",
    "finish",
    "finish_local",
    "lapsed",
    "move_due",
    "reap",
    "renew",
    "retry_later",
    "running_jobs",
]


async def renew(
    store: Store, ctx: int, job_key: str, token: str, ttl_ms: int, attempt: int
) -> bool:
    """Keep (or re-take) the lease of ``attempt``; False if that attempt was superseded."""
    key_list = [keys.RUNNING, job_key]
    args = [token, str(ttl_ms), str(attempt)]
    return bool(await store.script(ctx, script("runs_renew"), key_list, args))


async def finish(
    store: Store,
    ctx: int,
    ending: Ending,
    *,
    answer: Message,
) -> bool:
    """Record the final state and queue the signed answer (False if ``ending.attempt`` is not
    the job's current one: superseded, or already ended). The script counts the attempt in
    the job statistics (a runner process counts its own: :func:`finish_call`)."""
    name, key_list, args = finish_call(ending, answer.key, answer.to_hash())
    return bool(await store.script(ctx, script(name), key_list, args))


async def finish_local(
    store: Store,
    ctx: int,
    ending: Ending,
    *,
    request_key: str,
    reply_ttl_s: int,
    reply_to: str = "",
) -> bool:
    """Finish a job submitted on this node in one step, with no result message in between
    (:func:`finish_local_call`). False if ``ending.attempt`` is not current."""
    name, key_list, args = finish_local_call(
        ending, request_key=request_key, reply_ttl_s=reply_ttl_s, reply_to=reply_to
    )
    return bool(await store.script(ctx, script(name), key_list, args))


async def retry_later(
    store: Store,
    ctx: int,
    job_key: str,
    attempt: int,
    inflight: str,
    *,
    queue: str,
    cause: str,
    entry: str,
    due_ms: int,
) -> bool:
    """Record the failed attempt (its reason: ``cause``) and schedule the next one; False if
    ``attempt`` is not current."""
    ending = Ending(job_key, attempt, inflight, "retry", {}, cause, entry)
    name, key_list, args = retry_call(ending, queue=queue, due_ms=due_ms)
    return bool(await store.script(ctx, script(name), key_list, args))


async def move_due(store: Store, ctx: int, now_ms: int) -> int:
    """Queue every retry that is due; return when the next one is due (ms), or -1."""
    args = [str(now_ms), str(now())]
    key_list = [keys.DELAYED, keys.DLQ, keys.DLQ_EVENTS]
    return int(await store.script(ctx, script("runs_move_due"), key_list, args))


# -- the results service of external runners (node/runners/external.py) ------------------------


@dataclass(frozen=True)
class Answered:
    """The final state of an external runner's attempt as the results service read it: it is
    answered only if the job still holds it (``runs_answered.lua``)."""

    job_key: str
    status: str
    attempt: str  # as read ('' if the job has none)
    entry: str  # the attempt's record (bus/core/attempts.py attempt_entry)

    def key_list(self) -> list[str]:
        return [self.job_key, keys.RESULTS_INFLIGHT, keys.attempts(self.job_key)]

    def arg_list(self) -> list[str]:
        return [str(now()), self.status, self.entry, self.attempt]


async def answered_retry(
    store: Store, ctx: int, read: Answered, *, cause: str, due_ms: int, queue: str
) -> bool:
    """Send the attempt ``read`` back through the delayed zset (due at ``due_ms``, then pushed
    on ``queue``), ``cause`` the failed attempt's reason; False if it was answered or changed
    meanwhile. Raises StoreError."""
    args = [*read.arg_list(), cause, str(due_ms), f"{queue}|{read.job_key}"]
    key_list = [*read.key_list(), keys.DELAYED]
    return bool(await store.script(ctx, script("runs_answered_retry"), key_list, args))


async def answer_local(
    store: Store,
    ctx: int,
    read: Answered,
    *,
    result: dict[str, str],
    request_key: str,
    reply: str,
    reply_ttl_s: int,
    reply_to: str = "",
) -> bool:
    """Answer the attempt ``read`` of a request made on this node (request status, the
    client's reply on ``keys.reply_list(request_key, reply_to)``); False if it was answered
    or changed meanwhile. Raises StoreError."""
    reply_list = keys.reply_list(request_key, reply_to)
    key_list = [*read.key_list(), request_key, reply_list, keys.FLOW_EVENTS]
    args = [*read.arg_list(), json_arg(result), reply, str(reply_ttl_s)]
    return bool(await store.script(ctx, script("runs_answer_local"), key_list, args))


async def answer_remote(
    store: Store, ctx: int, read: Answered, *, result: dict[str, str], answer: Message
) -> bool:
    """Answer the attempt ``read`` with the signed result message ``answer`` (queued on
    msg_out); False if it was answered or changed meanwhile. Raises StoreError."""
    key_list = [*read.key_list(), answer.key, keys.MSG_OUT]
    args = [*read.arg_list(), json_arg(result), *flat_fields(answer.to_hash())]
    return bool(await store.script(ctx, script("runs_answer_remote"), key_list, args))


async def reap(store: Store, ctx: int, job_key: str, attempt: str, reason: str) -> bool:
    """End ``attempt`` of ``job_key`` (error ``reason``, handed to the results service) if its
    lease is still lapsed and the job still started with it; False if not. Raises StoreError."""
    key_list = [job_key, keys.RUNNING, keys.RESULTS]
    args = [attempt, str(now()), reason, keys.runner_inflight("")]
    return bool(await store.script(ctx, script("runs_reap"), key_list, args))


# -- reads of the runners ------------------------------------------------------------------------


async def running_jobs(store: Store, ctx: int) -> list[str]:
    """The started jobs of context ``ctx`` (the ``running`` zset), sorted. Raises StoreError."""
    return sorted(await store.call(ctx, lambda r: r.zrange(keys.RUNNING, 0, -1)))


LAPSED_PER_CALL = 500  # lapsed leases a reaper reads per script call


async def lapsed(store: Store, ctx: int) -> tuple[list[str], float]:
    """The started jobs of context ``ctx`` whose lease lapsed (up to :data:`LAPSED_PER_CALL`),
    and the seconds until the earliest live lease lapses (-1: none), by Valkey's clock
    (runs_lapsed). Raises StoreError."""
    found = await store.script(ctx, script("runs_lapsed"), [keys.RUNNING], [str(LAPSED_PER_CALL)])
    wait_ms = int(found[0])
    return [str(job) for job in found[1:]], (wait_ms / 1000 if wait_ms >= 0 else -1.0)


async def attempt_state(store: Store, ctx: int, job_key: str) -> tuple[str | None, str | None]:
    """The job's ``status`` and ``attempt`` fields (None where absent). Raises StoreError."""
    status, attempt = await store.call(ctx, lambda r: r.hmget(job_key, ["status", "attempt"]))
    return status, attempt

"""Materialising job messages: replay check, job hashes, queue entries, message status, replay
markers and the in-flight ack of a whole batch, in one Lua call (atomic, one round trip).

Before this, a batch cost a pipelined EXISTS of every replay marker, then a MULTI/EXEC with six
commands per message: each command built and parsed by the Redis client (~20 us of CPU each
under trio), and the check and the writes were two steps. Here the batch travels as one JSON
argument and the server does the rest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from coredis.commands.script import Script

from bus import keys
from bus.envelope import ResultBody
from bus.ids import now as now_s
from bus.models import JobStatus, Message, RunnerJob
from bus.reasons import Reason
from bus.store import Store
from node.routing.messages import Rejected, queue_result, reject
from node.runners.queues import target_queue
from node.state import NodeState

# KEYS: inflight, then the type queues whose depth to report ; ARGV: batch (JSON) now window_s
# batch: [{key, seen, nonce ("" if none), jobs: [{key, queue ("" = none), fields: [k, v...]}]}]
# Returns {codes, depth, owners}: one code per message (0 materialised, 1 replay of the message
# key, 2 replay of the nonce, 3 a job key held by another message), the deepest of the reported
# queues afterwards, and per message "<job key> <its holder>" for code 3 ("" otherwise). A job
# hash that exists is written only by the message it names as message_key: a message naming
# another message's job (a replayed or reused job id) is refused whole, nothing of it written.
_MATERIALISE = Script(
    script="""
local function taken(m)
  for _, j in ipairs(m.jobs) do
    local kind = redis.call('TYPE', j.key).ok
    if kind ~= 'none' then
      local holder = kind == 'hash' and redis.call('HGET', j.key, 'message_key') or false
      if holder ~= m.key then return j.key .. ' ' .. (holder or ('a ' .. kind)) end
    end
  end
  return ''
end
local batch = cjson.decode(ARGV[1])
local out, owners = {}, {}
for i, m in ipairs(batch) do
  local code, owner = 0, ''
  if redis.call('EXISTS', m.seen) == 1 then
    code = 1
  elseif m.nonce ~= '' and redis.call('EXISTS', m.nonce) == 1 then
    code = 2
  else
    owner = taken(m)
    if owner ~= '' then code = 3 end
  end
  if code == 0 then
    for _, j in ipairs(m.jobs) do
      redis.call('HSET', j.key, unpack(j.fields))
      if j.queue ~= '' then redis.call('LPUSH', j.queue, j.key) end
    end
    redis.call('HSET', m.key, 'status', 'acknowledged', 'updated_at', ARGV[2])
    redis.call('SET', m.seen, '1', 'EX', ARGV[3])
    if m.nonce ~= '' then redis.call('SET', m.nonce, m.key, 'EX', ARGV[3]) end
    redis.call('LREM', KEYS[1], 1, m.key)
  end
  out[i] = code
  owners[i] = owner
end
local depth = 0
for i = 2, #KEYS do depth = math.max(depth, redis.call('LLEN', KEYS[i])) end
return {out, depth, owners}
"""
)

# KEYS: job ; ARGV: message key, then the job's fields and values. The same rule outside the
# batch script (the origin's copies): a job key held by another message is left as it is.
_WRITE_OWN_JOB = """
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'none' and (kind ~= 'hash' or redis.call('HGET', KEYS[1], 'message_key') ~= ARGV[1])
then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
"""


def write_own_job(tx: Any, job_key: str, message_key: str, fields: dict[str, str]) -> None:  # noqa: ANN401
    """Queue in ``tx`` the write of job hash ``job_key`` of message ``message_key`` (``fields``
    must name it as message_key), unless that key holds another message's job."""
    tx.eval(_WRITE_OWN_JOB, [job_key], [message_key, *(x for kv in fields.items() for x in kv)])


REPLAY_WHAT = {1: "message key", 2: "nonce"}
log = logging.getLogger(__name__)


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
    of its job keys is another message's. Returns one code per message (0 written; else see
    :func:`refusal`: nothing written for it), the depth of the deepest queue of ``depth_of``
    afterwards, and per message the job key refused and its holder ("" if none)."""
    payload = [
        {
            "key": message.key,
            "seen": keys.seen(message.key),
            "nonce": keys.nonce(message.caller_id, message.nonce) if message.nonce else "",
            "jobs": [
                {
                    "key": j.key,
                    "queue": j.queue,
                    "fields": [x for kv in j.fields.items() for x in kv],
                }
                for j in jobs
            ],
        }
        for message, jobs in batch
    ]
    args = [json.dumps(payload), str(now), str(window_s)]
    codes, depth, owners = await store.script(ctx, _MATERIALISE, [inflight, *depth_of], args)
    return [int(c) for c in codes], int(depth), [str(o) for o in owners]


def refusal(message: Message, code: int, owner: str) -> Rejected:
    """Why the materialise script refused ``message`` (``code`` > 0)."""
    if code in REPLAY_WHAT:
        return Rejected(Reason.REPLAY, f"{REPLAY_WHAT[code]} of {message.key} was already accepted")
    job_key, _, holder = owner.partition(" ")
    return Rejected(Reason.JOB_EXISTS, f"{job_key} exists already, held by {holder}")


async def materialise_fresh(
    node: NodeState,
    ctx: int,
    messages: list[Message],
    script_types: Collection[str],
    inflight: str,
    service: str,
) -> None:
    """Materialise a batch of authorised job messages in one atomic step (materialise_batch);
    a replay (its key or nonce accepted before, or earlier in this batch) or a message naming
    a job key of another message is refused and dead-lettered."""
    refused = await materialise_many(node, ctx, messages, script_types, inflight)
    for message, exc in refused:
        queue = keys.MSG_IN if service == "consumer" else keys.MSG_OUT
        await reject(node, ctx, message.key, exc, message, service, queue=queue)
        await node.store.ack(ctx, inflight, message.key)


def _writes(
    messages: list[Message], script_types: Collection[str], stamp: int
) -> tuple[list[tuple[Message, list[JobWrite]]], list[tuple[Message, RunnerJob]]]:
    """Each message's job hashes and queue entries, and its jobs of no known script type."""
    unknown: list[tuple[Message, RunnerJob]] = []
    batch: list[tuple[Message, list[JobWrite]]] = []
    for message in messages:
        writes = []
        for job in message.job:
            fields = job.to_hash() | {
                "status": JobStatus.DISPATCHED.value,
                "created_at": str(stamp),
                "updated_at": str(stamp),
                "message_key": message.key,
                "origin": message.origin,
            }
            queue = ""
            if job.script_type in script_types:
                queue = target_queue(job)  # node/runners/queues.py
            else:
                fields |= {"status": JobStatus.ERROR.value, "reason": Reason.UNKNOWN_SCRIPT_TYPE}
                unknown.append((message, job))
            writes.append(JobWrite(job.key, queue, fields))
        batch.append((message, writes))
    return batch, unknown


async def materialise_many(
    node: NodeState,
    ctx: int,
    messages: list[Message],
    script_types: Collection[str],
    inflight: str,
) -> list[tuple[Message, Rejected]]:
    """Write the jobs of checked messages, their queue entries, the message status, the replay
    markers and the ack, in one Lua call; returns the refused messages (replays, and those
    naming another message's job) with why, for which nothing was written."""
    stamp = now_s()
    batch, unknown = _writes(messages, script_types, stamp)
    types = sorted({job.script_type for m in messages for job in m.job} & set(script_types))
    codes, node.queue_depth[ctx], owners = await materialise_batch(
        node.store,
        ctx,
        inflight,
        batch,
        now=stamp,
        window_s=node.freshness.window_s,
        depth_of=[keys.queue(t) for t in types],
    )
    refused = [(m, refusal(m, c, o)) for m, c, o in zip(messages, codes, owners, strict=True) if c]
    for (_, writes), code in zip(batch, codes, strict=True):
        for w in writes:  # idle slots wait on the plain type queue only
            if not code and w.queue and w.queue != keys.queue(w.fields["script_type"]):
                node.wake_idle_slots(ctx, w.fields["script_type"])
    node.count(
        "materialised", sum(len(m.job) for m, c in zip(messages, codes, strict=True) if not c)
    )
    await _unknown_types(node, unknown, {m.key for m, _ in refused}, script_types)
    return refused


async def _unknown_types(
    node: NodeState,
    unknown: list[tuple[Message, RunnerJob]],
    refused: set[str],
    script_types: Collection[str],
) -> None:
    """Answer each materialised job of a type no runner here serves (it was written in
    error): its origin learns why."""
    for message, job in unknown:
        if message.key in refused:
            continue
        detail = (
            f"{Reason.UNKNOWN_SCRIPT_TYPE}: no runner for {job.script_type!r} on this node "
            f"(known: {', '.join(sorted(script_types))})"
        )
        log.warning("job %s: %s", job.key, detail)
        await queue_result(
            node, message, ResultBody(message.key, job.key, JobStatus.ERROR, {}, detail)
        )

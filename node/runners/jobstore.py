"""Atomic job-attempt transitions in Valkey (Lua), fenced by the attempt number.

Starting a job increments its ``attempt`` field: that number is the attempt's fencing token.
Every transition that ends an attempt (finish, retry, requeue, malformed, reap) names the
attempt it ends and happens only while the job is still ``started`` with that attempt, so the
result of a superseded attempt (the job was presumed lost and started again, or ended) is
refused, while a result that arrives after a stall, its lease expired but nobody else having
started the job, is accepted: an expired lease alone proves nothing about the process.

The runner also holds ``lease:<job>`` (its token, a TTL it renews): that is liveness, which the
reapers read to find attempts whose process may be gone; it is never the fence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from coredis.commands.script import Script

from bus import keys
from bus.ids import now
from bus.models import Message
from bus.reasons import Reason
from bus.store import Store

# Why the queue entry ``v`` names nothing a runner can start (a reason token), or false; a
# final job's entry is a harmless duplicate (false too: the caller sees its status). Checked
# before any write, so that one hostile entry never aborts a script half-way.
UNRUNNABLE_LUA = """
local function unrunnable(v)
  local t = redis.call('TYPE', v)['ok']
  if t == 'none' then return 'missing_hash' end
  if t ~= 'hash' then return 'wrong_type' end
  if string.find(v, '[\\128-\\255]') then return 'malformed_job' end
  local st = redis.call('HGET', v, 'status')
  if not st then return 'malformed_job' end
  if st == 'finished' or st == 'error' then return false end
  local n = redis.call('HGET', v, 'attempt')
  if n and not string.match(n, '^%d%d?%d?%d?%d?%d?%d?%d?%d?$') then return 'malformed_job' end
  return false
end
"""

_START = Script(
    script=UNRUNNABLE_LUA
    + """
local bad = unrunnable(KEYS[1])
if bad then return bad end
local st = redis.call('HGET', KEYS[1], 'status')
if st == 'finished' or st == 'error' then return {} end
redis.call('HINCRBY', KEYS[1], 'attempt', 1)
redis.call('HSET', KEYS[1], 'status', 'started', 'runner', ARGV[1], 'updated_at', ARGV[3],
           'runner_id', ARGV[4])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[3], KEYS[1])
return redis.call('HGETALL', KEYS[1])
"""
)

# Take the next queued job and start it, in the same round trip as finishing the last one.
# KEYS: inflight running, then the slot's lists in consume order
# ARGV: token_base ttl_ms now lease_prefix runner_id
# Returns {} (nothing queued), {key} (a final job's duplicate entry, dropped), {key, reason}
# (an entry no runner can start: dropped, for the caller to dead-letter) or {key, fields...}.
_TAKE_NEXT = Script(
    script=UNRUNNABLE_LUA
    + """
local nxt = false
for i = 3, #KEYS do
  nxt = redis.call('LMOVE', KEYS[i], KEYS[1], 'RIGHT', 'LEFT')
  if nxt then break end
end
if not nxt then return {} end
local bad = unrunnable(nxt)
if bad then
  redis.call('LREM', KEYS[1], 1, nxt)
  return {nxt, bad}
end
local st = redis.call('HGET', nxt, 'status')
if st == 'finished' or st == 'error' then
  redis.call('LREM', KEYS[1], 1, nxt)
  return {nxt}
end
local tok = ARGV[1] .. ':' .. nxt
redis.call('HINCRBY', nxt, 'attempt', 1)
redis.call('HSET', nxt, 'status', 'started', 'runner', tok, 'updated_at', ARGV[3],
           'runner_id', ARGV[5])
redis.call('SET', ARGV[4] .. nxt, tok, 'PX', ARGV[2])
redis.call('SADD', KEYS[2], nxt)
local out = redis.call('HGETALL', nxt)
table.insert(out, 1, nxt)
return out
"""
)

# Keep the lease of a live attempt, re-taking it if it lapsed (a stall longer than its TTL):
# only while the job is still started with that attempt (0: the attempt was superseded).
# KEYS: lease job ; ARGV: token ttl_ms attempt
_RENEW = Script(
    script="""
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
local cur = redis.call('HMGET', KEYS[2], 'status', 'attempt')
if cur[1] ~= 'started' or cur[2] ~= ARGV[3] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
)

# The fence shared by every transition that ends an attempt (ARGV[1]: the attempt it ends).
_HOLDS = """
local cur = redis.call('HMGET', KEYS[1], 'status', 'attempt')
if cur[1] ~= 'started' or cur[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], KEYS[1])
redis.call('LREM', KEYS[4], 1, KEYS[1])
"""

# KEYS: job lease running inflight attempts answer msg_out
# ARGV: attempt status result reason now attempt_entry answer-fields...
_FINISH = Script(
    script=_HOLDS
    + """
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'result', ARGV[3], 'reason', ARGV[4],
           'updated_at', ARGV[5])
redis.call('RPUSH', KEYS[5], ARGV[6])
redis.call('HSET', KEYS[6], unpack(ARGV, 7))
redis.call('LPUSH', KEYS[7], KEYS[6])
return 1
"""
)

# The origin is this node: no result message, the origin's copy is the job itself.
# Answering a request made on this node, shared by the node's runners and the external-runner
# results service: the request's status, the waiting client's reply, the flow engine's wake-up.
ANSWER_HERE_LUA = """
local function answer_here(job, request, reply_list, flow_events, status, now, reply, ttl)
  local done = 'error'
  if status == 'finished' then done = 'processed' end
  redis.call('HSET', request, 'status', done, 'updated_at', now, 'processed_at', now)
  redis.call('LPUSH', reply_list, reply)
  redis.call('EXPIRE', reply_list, ttl)
  local flow = redis.call('HGET', job, 'flow_id')
  if flow and flow ~= '' then redis.call('LPUSH', flow_events, flow) end
end
"""

# KEYS: job lease running inflight attempts request reply flow_events
# ARGV: attempt status result reason now attempt_entry reply reply_ttl
_FINISH_LOCAL = Script(
    script=ANSWER_HERE_LUA
    + _HOLDS
    + """
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'result', ARGV[3], 'reason', ARGV[4],
           'updated_at', ARGV[5])
redis.call('RPUSH', KEYS[5], ARGV[6])
answer_here(KEYS[1], KEYS[6], KEYS[7], KEYS[8], ARGV[2], ARGV[5], ARGV[7], ARGV[8])
return 1
"""
)

# KEYS: job lease running inflight attempts delayed
# ARGV: attempt reason now attempt_entry due_ms member
_RETRY = Script(
    script=_HOLDS
    + """
redis.call('HSET', KEYS[1], 'status', 'dispatched', 'reason', ARGV[2], 'updated_at', ARGV[3])
redis.call('RPUSH', KEYS[5], ARGV[4])
redis.call('ZADD', KEYS[6], ARGV[5], ARGV[6])
return 1
"""
)

# KEYS: job lease running inflight ; ARGV: attempt reason now
_MALFORMED = Script(
    script=_HOLDS
    + """
redis.call('HSET', KEYS[1], 'status', 'error', 'reason', ARGV[2], 'updated_at', ARGV[3])
return 1
"""
)

# The attempt number goes back (an interrupted attempt does not count): safe for the fence,
# as only the holder of the current attempt gets here, and it has stopped its process.
# KEYS: job lease running inflight queue ; ARGV: attempt now
_REQUEUE = Script(
    script=_HOLDS
    + """
redis.call('HINCRBY', KEYS[1], 'attempt', -1)
redis.call('HSET', KEYS[1], 'status', 'dispatched', 'updated_at', ARGV[2])
redis.call('RPUSH', KEYS[5], KEYS[1])
return 1
"""
)

# KEYS: delayed dlq ; ARGV: now_ms now_s. Moves every due entry to its queue; returns the next
# due time. A member that is no "<queue>|<job key>", or names a key that holds no list, goes to
# the dlq (its bytes escaped, so the entry is JSON text) instead of failing the whole move.
_MOVE_DUE = Script(
    script="""
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, member in ipairs(due) do
  local sep = string.find(member, '|', 1, true)
  redis.call('ZREM', KEYS[1], member)
  local pushed = sep and redis.pcall('LPUSH', string.sub(member, 1, sep - 1),
                                     string.sub(member, sep + 1))
  if (not pushed) or (type(pushed) == 'table' and pushed.err) then
    local shown = string.gsub(string.sub(member, 1, 1000), '[^\\32-\\126]', function(c)
      return string.format('\\\\x%02x', string.byte(c)) end)
    redis.call('LPUSH', KEYS[2], cjson.encode({key = shown, reason = 'malformed_entry',
      detail = 'a delayed retry must be <queue>|<job key> naming a list', at = tonumber(ARGV[2]),
      queue = ''}))
  end
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #nxt == 0 then return -1 end
return tonumber(nxt[2])
"""
)


def attempt_entry(attempt: int, runner: str, status: str, reason: str, started_at: int) -> str:
    return json.dumps(
        {
            "attempt": attempt,
            "runner": runner,
            "status": status,
            "reason": reason,
            "started_at": started_at,
            "ended_at": now(),
        }
    )


def _attempt_keys(job_key: str, inflight: str) -> list[str]:
    return [job_key, keys.lease(job_key), keys.RUNNING, inflight, keys.attempts(job_key)]


async def start(
    store: Store, ctx: int, job_key: str, token: str, ttl_ms: int, runner_id: str = ""
) -> dict[str, str] | str:
    """Take the lease and mark the job started; the job's fields (``attempt`` counts this
    attempt), {} if the job is final, or why the entry names nothing to start (a reason token:
    UNRUNNABLE_LUA). ``runner_id`` names the in-flight list (``inflight:runner:<runner_id>``)
    a reaper removes the job from."""
    args = [token, str(ttl_ms), str(now()), runner_id]
    flat = await store.script(ctx, _START, [job_key, keys.lease(job_key), keys.RUNNING], args)
    if isinstance(flat, str | bytes):
        return flat.decode() if isinstance(flat, bytes) else flat
    if isinstance(flat, dict):  # RESP3 may already give a map
        return {str(k): str(v) for k, v in flat.items()}
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


async def renew(
    store: Store, ctx: int, job_key: str, token: str, ttl_ms: int, attempt: int
) -> bool:
    """Keep (or re-take) the lease of ``attempt``; False if that attempt was superseded."""
    key_list = [keys.lease(job_key), job_key]
    return bool(await store.script(ctx, _RENEW, key_list, [token, str(ttl_ms), str(attempt)]))


async def finish(
    store: Store,
    ctx: int,
    job_key: str,
    attempt: int,
    inflight: str,
    *,
    status: str,
    result: dict[str, str],
    reason: str,
    entry: str,
    answer: Message,
    take_next: NextJob | None = None,
) -> tuple[bool, Started | None]:
    """Record the final state and queue the signed answer (False if ``attempt`` is not the
    job's current one: superseded, or already ended); with
    ``take_next``, also start the next queued job in the same round trip."""
    fields = [x for kv in answer.to_hash().items() for x in kv]
    args = [str(attempt), status, json.dumps(result), reason, str(now()), entry, *fields]
    key_list = [*_attempt_keys(job_key, inflight), answer.key, keys.MSG_OUT]
    return await _with_next(store, ctx, (_FINISH, key_list, args), inflight, take_next)


async def finish_local(
    store: Store,
    ctx: int,
    job_key: str,
    attempt: int,
    inflight: str,
    *,
    status: str,
    result: dict[str, str],
    reason: str,
    entry: str,
    request_key: str,
    reply_ttl_s: int,
    take_next: NextJob | None = None,
) -> tuple[bool, Started | None]:
    """Finish a job submitted on this node: final state, request status and the client's reply
    in one step, with no result message in between. False if ``attempt`` is not current."""
    reply = json.dumps({"job_key": job_key, "status": status, "result": result, "reason": reason})
    args = [str(attempt), status, json.dumps(result), reason, str(now()), entry, reply]
    args.append(str(reply_ttl_s))
    key_list = [
        *_attempt_keys(job_key, inflight),
        request_key,
        keys.reply(request_key),
        keys.FLOW_EVENTS,
    ]
    return await _with_next(store, ctx, (_FINISH_LOCAL, key_list, args), inflight, take_next)


@dataclass
class NextJob:
    """Where a runner takes its next job from (its lists, in consume order), and how it names
    its lease. ``found_empty`` is set when the take found every list empty."""

    lists: tuple[str, ...]
    token_base: str
    ttl_ms: int
    runner_id: str = ""
    found_empty: bool = False


Started = tuple[str, dict[str, str]]  # a started job: its key and its fields


def _then(first: Script[str], second: Script[str]) -> Script[str]:
    """One script that runs ``first`` then ``second``, each with its own KEYS and ARGV
    (ARGV[1], ARGV[2]: how many keys and args belong to ``first``); returns both results."""
    combined = _COMBINED.get((first.sha, second.sha))
    if combined is None:
        one, two = (_text(s.script) for s in (first, second))
        combined = Script(
            script=f"""
local function first(KEYS, ARGV)
{one}
end
local function second(KEYS, ARGV)
{two}
end
local nk, na = tonumber(ARGV[1]), tonumber(ARGV[2])
local r1 = first({{unpack(KEYS, 1, nk)}}, {{unpack(ARGV, 3, 2 + na)}})
local r2 = second({{unpack(KEYS, nk + 1)}}, {{unpack(ARGV, 3 + na)}})
return {{r1, r2}}
"""
        )
        _COMBINED[(first.sha, second.sha)] = combined
    return combined


_COMBINED: dict[tuple[str, str], Script[str]] = {}


def _text(source: str | bytes) -> str:
    return source.decode() if isinstance(source, bytes) else source


async def _with_next(
    store: Store,
    ctx: int,
    finish_call: tuple[Script[str], list[str], list[str]],
    inflight: str,
    take_next: NextJob | None,
) -> tuple[bool, Started | None]:
    if take_next is None:
        return bool(await store.script(ctx, *finish_call)), None
    nxt_keys = [inflight, keys.RUNNING, *take_next.lists]
    nxt_args = [take_next.token_base, str(take_next.ttl_ms), str(now()), keys.lease("")]
    nxt_args.append(take_next.runner_id)
    script, f_keys, f_args = finish_call
    done, nxt = await store.script(
        ctx,
        _then(script, _TAKE_NEXT),
        [*f_keys, *nxt_keys],
        [str(len(f_keys)), str(len(f_args)), *f_args, *nxt_args],
    )
    if len(nxt) == 2:  # an entry no runner can start: taken off already, recorded here
        detail = unrunnable_detail(str(nxt[1]))
        await store.refuse_entry(ctx, inflight, nxt[0], str(nxt[1]), detail, queue="")
    if len(nxt) < 3:  # nothing queued (or a duplicate entry, dropped)
        take_next.found_empty = not nxt
        return bool(done), None
    flat = [str(x) for x in nxt[1:]]
    return bool(done), (str(nxt[0]), dict(zip(flat[::2], flat[1::2], strict=True)))


def unrunnable_detail(reason: str) -> str:
    """What an UNRUNNABLE_LUA reason token means, for the dead letter."""
    return {
        Reason.MISSING_HASH: "the queue entry names no job hash",
        Reason.WRONG_TYPE: "the queue entry names a key that holds no hash",
    }.get(
        Reason(reason),
        "no status, an attempt that is not a small integer, or a key that is not ASCII",
    )


async def retry_later(
    store: Store,
    ctx: int,
    job_key: str,
    attempt: int,
    inflight: str,
    *,
    queue: str,
    reason: str,
    entry: str,
    due_ms: int,
) -> bool:
    """Record the failed attempt and schedule the next one; False if ``attempt`` is not current."""
    args = [str(attempt), reason, str(now()), entry, str(due_ms), f"{queue}|{job_key}"]
    key_list = [*_attempt_keys(job_key, inflight), keys.DELAYED]
    return bool(await store.script(ctx, _RETRY, key_list, args))


async def finish_malformed(
    store: Store, ctx: int, job_key: str, attempt: int, inflight: str, detail: str
) -> bool:
    """End a job whose hash cannot be run (it was dead-lettered): error, lease released."""
    key_list = [job_key, keys.lease(job_key), keys.RUNNING, inflight]
    args = [str(attempt), f"{Reason.MALFORMED_JOB}: {detail}", str(now())]
    return bool(await store.script(ctx, _MALFORMED, key_list, args))


async def requeue(
    store: Store, ctx: int, job_key: str, attempt: int, inflight: str, queue: str
) -> bool:
    """Give an interrupted attempt back (shutdown): not counted, queued at the consuming end."""
    key_list = [job_key, keys.lease(job_key), keys.RUNNING, inflight, queue]
    return bool(await store.script(ctx, _REQUEUE, key_list, [str(attempt), str(now())]))


async def move_due(store: Store, ctx: int, now_ms: int) -> int:
    """Queue every retry that is due; return when the next one is due (ms), or -1."""
    args = [str(now_ms), str(now())]
    return int(await store.script(ctx, _MOVE_DUE, [keys.DELAYED, keys.DLQ], args))

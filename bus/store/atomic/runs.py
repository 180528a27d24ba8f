"""Atomic job-attempt transitions of the runners (scripts ``lua/runs_*.lua``), fenced by the
attempt number.

Starting a job increments its ``attempt`` field: that number is the attempt's fencing token.
Every transition that ends an attempt (finish, retry, requeue, malformed, reap) names the
attempt it ends and happens only while the job is still ``started`` with that attempt
(``runs_fence.lua``), so the result of a superseded attempt (the job was presumed lost and
started again, or ended) is refused, while a result that arrives after a stall, its lease
expired but nobody else having started the job, is accepted: an expired lease alone proves
nothing about the process.

The runner also holds a lease, its job's score in the ``running`` zset (when it lapses, by
Valkey's clock; the token is the job's ``runner`` field), which it renews: that is liveness,
which the reapers read to find attempts whose process may be gone; it is never the fence.

This module holds what both sides share: each transition's script, KEYS and ARGV (``*_call``,
:class:`NextJob`, :class:`Ending`) and how its reply reads (:func:`begun`, :func:`moved_start`),
the one plan that two executors run: the node's trio store (bus/store/atomic/runs_trio.py) and a
runner process's blocking connection (bus/store/atomic/runs_sync.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import msgspec

from bus.core import keys
from bus.core.attempts import Plan, Retry
from bus.core.envelope import reply_text
from bus.core.ids import now
from bus.core.models import flat_fields, json_arg
from bus.core.reasons import Reason
from bus.store.atomic import source, sources
from bus.store.atomic.type_breakers import BreakerOpen, open_wait

__all__ = [
    "ENDS",
    "Begun",
    "Call",
    "NextJob",
    "Started",
    "begun",
    "ends_then_source",
    "ending_of",
    "ends_then_take",
    "finish_call",
    "finish_local_call",
    "fields_of",
    "moved_start",
    "requeue_call",
    "retry_call",
    "start_call",
    "then_source",
    "then_take_next",
    "unrunnable_detail",
]


@dataclass
class NextJob:
    """Where a runner takes its next job from (its lists, in consume order), and how it names
    its lease. ``found_empty`` is set when the take found every list empty, and ``held`` to
    the in-flight list's length it read then (a blocking pop next needs it). With
    ``script_type``, that type's circuit breaker (bus/store/atomic/type_breakers.py) is consulted:
    ``breaker_wait_ms`` is then set when it let no job start (for that long). With
    ``counts_starts``, the scripts count no start: the caller counts them in its own sums
    (a runner process: bus/core/stats.py, ``StatsBatch.started``)."""

    lists: tuple[str, ...]
    token_base: str
    ttl_ms: int
    runner_id: str = ""
    found_empty: bool = False
    held: int | None = None
    script_type: str = ""
    breaker_wait_ms: int = 0
    count: int = 1  # up to this many of what is queued now (a batch: runs_take_next.lua)
    counts_starts: bool = False

    def args(self) -> list[str]:
        """ARGV of runs_take_next.lua."""
        return [
            self.token_base,
            str(self.ttl_ms),
            str(now()),
            self.runner_id,
            self.script_type,
            str(self.count),
            "1" if self.counts_starts else "",
        ]

    def moved_args(self, held: int) -> list[str]:
        """ARGV of runs_start_moved.lua (reply: :func:`moved_start`), ``held`` the list's length."""
        args = [str(held), self.token_base, str(self.ttl_ms), str(now()), self.runner_id]
        return [*args, self.script_type, "1" if self.counts_starts else ""]

    def read(self, reply: list[Any]) -> tuple[list[Started], list[tuple[str, str]]]:
        """runs_take_next's reply: the jobs it started, and the entries (key, reason token) no
        runner can start, taken off already, to dead-letter; what else it found is noted here."""
        if len(reply) == 2 and (wait_ms := open_wait(reply[1])) is not None:  # nothing taken
            self.breaker_wait_ms = wait_ms
            return [], []
        if len(reply) == 1 and isinstance(reply[0], int):  # nothing queued
            self.found_empty, self.held = True, reply[0]
            return [], []
        entries = reply[1:] if reply and reply[0] == "*" else [reply]
        started: list[Started] = []
        refused: list[tuple[str, str]] = []
        for entry in entries:
            if len(entry) == 2:  # an entry no runner can start
                refused.append((str(entry[0]), str(entry[1])))
            elif len(entry) >= 3:
                started.append((str(entry[0]), fields_of(entry[1:])))
        return started, refused


Started = tuple[str, dict[str, str]]  # a started job: its key and its fields
Call = tuple[str, list[str], list[str]]  # a script's name, KEYS and ARGV

# how a start went (runs_start's, or one of runs_start_moved's, runs_take_next's): the job's
# fields after it ({}: final), a reason token (:func:`unrunnable_detail`), or the breaker's refusal
Begun = dict[str, str] | str | BreakerOpen


def fields_of(flat: list[Any] | dict[Any, Any]) -> dict[str, str]:
    """A hash as a script returns it (a flat list), or as HGETALL does (a map in RESP3)."""
    if isinstance(flat, dict):
        return {str(k): str(v) for k, v in flat.items()}
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


def start_call(
    job_key: str, token: str, ttl_ms: int, runner_id: str, script_type: str, counted: bool
) -> Call:
    """The script, KEYS and ARGV that start one job (runs_start; its reply: :func:`begun`)."""
    args = [token, str(ttl_ms), str(now()), runner_id, script_type, "1" if counted else ""]
    return "runs_start", [job_key, keys.RUNNING], args


def begun(reply: Any) -> Begun:  # noqa: ANN401 - a script's reply
    """How a start went, from its reply (runs_start's, or a start's in runs_start_moved's)."""
    if isinstance(reply, str):
        return reply if (wait_ms := open_wait(reply)) is None else BreakerOpen(wait_ms)
    return fields_of(reply)


def moved_start(reply: Any) -> tuple[str | None, Begun | None]:  # noqa: ANN401
    """runs_start_moved's reply (:meth:`NextJob.moved_args`): the entry it started (or refused)
    and how; (None, None) if it moved nothing or did not run (a server that lost the script)."""
    if isinstance(reply, list) and reply:
        return str(reply[0]), begun(reply[1])
    return None, None


def unrunnable_detail(reason: str) -> str:
    """What a reason token of ``runs_unrunnable.lua`` means, for the dead letter."""
    return {
        Reason.MISSING_HASH: "the queue entry names no job hash",
        Reason.WRONG_TYPE: "the queue entry names a key that holds no hash",
    }.get(
        Reason(reason),
        "no status, an attempt that is not a small integer, or a key that is not ASCII",
    )


def _attempt_keys(job_key: str, inflight: str) -> list[str]:
    return [job_key, keys.RUNNING, inflight, keys.attempts(job_key)]


class Ending(msgspec.Struct, frozen=True):
    """How attempt ``attempt`` of ``job_key`` ended, as finish and finish_local record it
    (``inflight``: the runner's in-flight list, which the job leaves)."""

    job_key: str
    attempt: int
    inflight: str
    status: str
    result: dict[str, str]
    reason: str
    entry: str

    def args(self) -> list[str]:
        """ARGV[1..6] of runs_finish.lua and runs_finish_local.lua."""
        result = json_arg(self.result)
        return [str(self.attempt), self.status, result, self.reason, str(now()), self.entry]


def ending_of(plan: Plan, job_key: str, attempt: int, inflight: str) -> Ending:
    """The plan that ends an attempt (bus/core/attempts.py ``plan_ending``) as the ending
    scripts take it: a retry's reason is its cause, its status ``retry``."""
    if isinstance(plan, Retry):
        return Ending(job_key, attempt, inflight, "retry", {}, plan.cause, plan.entry)
    body = plan.body
    return Ending(
        job_key, attempt, inflight, body.status.value, body.result, body.reason, plan.entry
    )


def finish_call(
    ending: Ending, answer_key: str, answer_hash: dict[str, str], stats: str = ""
) -> tuple[str, list[str], list[str]]:
    """The script, KEYS and ARGV of :func:`bus.store.atomic.runs_trio.finish`. ``stats``: ''
    the script counts the attempt in the job statistics; else the sums a runner process counted
    itself (bus/core/stats.py: ``StatsBatch.encode``), applied instead."""
    key_list = [*_attempt_keys(ending.job_key, ending.inflight), answer_key, keys.MSG_OUT]
    return "runs_finish", key_list, [*ending.args(), stats, *flat_fields(answer_hash)]


def finish_local_call(
    ending: Ending, *, request_key: str, reply_ttl_s: int, reply_to: str = "", stats: str = ""
) -> tuple[str, list[str], list[str]]:
    """The script, KEYS and ARGV of finishing a job submitted on this node: final state,
    request status and the client's reply (on the list ``keys.reply_list`` picks for
    ``reply_to``). One builder for the node's store and the runner processes' sync client
    (bus/store/atomic/runs_sync.py), so both answer alike. ``stats`` as :func:`finish_call`'s."""
    reply = reply_text(request_key, ending.job_key, ending.status, ending.result, ending.reason)
    key_list = [
        *_attempt_keys(ending.job_key, ending.inflight),
        request_key,
        keys.reply_list(request_key, reply_to),
        keys.FLOW_EVENTS,
    ]
    return "runs_finish_local", key_list, [*ending.args(), reply, str(reply_ttl_s), stats]


# the fragments an end and the take that follows it share in one script: one TIME and one read
# of a type's breaker serve both (the take's stamp and gate, the end's breaker event)
# (and what a batch's ends write once for all of them: the in-flight list's entries,
# runs_inflight; the answers' pushes per list, runs_pushes; the leases, runs_leases, which a
# take's starts also write once)
_SHARED = ("stats_jobs", "type_breaker", "runs_inflight", "runs_pushes", "runs_leases")


def then_source(first: str, second: str) -> str:
    """One script that runs the script ``first`` (an end) then ``second`` (runs_take_next),
    each with its own KEYS and ARGV: ARGV[1], ARGV[2] say how many keys and args belong to
    ``first``; ARGV[3] is a runner process's statistics sums (stats_apply; '' none), applied
    only if ``first`` did its work (non-zero) and ``second`` started no job: the runner keeps
    its sums while it has work, and hands them over with the answer that leaves it idle.
    Returns both results. Only the runner processes end an attempt and take the next one at
    once (bus/store/atomic/runs_sync.py); the node ends the attempts it recovers alone."""
    return f"""
{sources(_SHARED)}
local function first(KEYS, ARGV)
{source(first, _SHARED)}
end
local function second(KEYS, ARGV)
{source(second, _SHARED)}
end
{_TOOK}
local nk, na = tonumber(ARGV[1]), tonumber(ARGV[2])
local r1 = first({{unpack(KEYS, 1, nk)}}, {{unpack(ARGV, 4, 3 + na)}})
local r2 = second({{unpack(KEYS, nk + 1)}}, {{unpack(ARGV, 4 + na)}})
if ARGV[3] ~= '' and r1 ~= 0 and not took(r2) then stats_apply(ARGV[3]) end
return {{r1, r2}}
"""


# whether runs_take_next's reply started a job (one: {key, fields...}; a batch: {'*', ...})
_TOOK = """
local function took(r)
  if r[1] ~= '*' then return #r >= 3 end
  for i = 2, #r do
    if #r[i] >= 3 then return true end
  end
  return false
end
"""

# the scripts that end an attempt, which a batch's end (ends_then_source) runs by name
ENDS = ("runs_finish_local", "runs_finish", "runs_retry", "runs_requeue")


@cache
def ends_then_source() -> str:
    """One script that ends several attempts (each by one of :data:`ENDS`, with its own KEYS
    and ARGV) and then, if KEYS are left for it, takes the next jobs (runs_take_next). ARGV[1]
    is how many ends; ARGV[2] a runner process's statistics sums applied if an end did its
    work, ARGV[3] those applied only if, besides, no next job was started ('': none); then
    per end its script's name, how many keys and how many args are its; then the ends' args
    and the take's. Returns {{{{end results...}}, take result}} ({{}} without a take). The ends'
    in-flight entries leave the list at once, their leases the running zset at once, and their
    answers are pushed once per reply list (runs_inflight, runs_leases, runs_pushes)."""
    ends = "\n".join(
        f"ends['{name}'] = function(KEYS, ARGV)\n{source(name, _SHARED)}\nend" for name in ENDS
    )
    return f"""
{sources(_SHARED)}
local ends = {{}}
{ends}
local function second(KEYS, ARGV)
{source("runs_take_next", _SHARED)}
end
{_TOOK}
local n = tonumber(ARGV[1])
local k, a, done, any = 1, 4 + 3 * n, {{}}, false
inflight_batch, answers_batch = {{jobs = {{}}}}, {{}}
leases_collect()
for i = 0, n - 1 do
  local name, nk, na = ARGV[4 + 3 * i], tonumber(ARGV[5 + 3 * i]), tonumber(ARGV[6 + 3 * i])
  local r = ends[name]({{unpack(KEYS, k, k + nk - 1)}}, {{unpack(ARGV, a, a + na - 1)}})
  done[#done + 1] = r
  any = any or r ~= 0
  k, a = k + nk, a + na
end
answers_flush()
inflight_flush()
leases_flush()
local r2 = {{}}
if k <= #KEYS then r2 = second({{unpack(KEYS, k)}}, {{unpack(ARGV, a)}}) end
if any and ARGV[2] ~= '' then stats_apply(ARGV[2]) end
if any and ARGV[3] ~= '' and not took(r2) then stats_apply(ARGV[3]) end
return {{done, r2}}
"""


def ends_then_take(
    calls: list[Call], inflight: str, take_next: NextJob | None, stats: tuple[str, str]
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of :func:`ends_then_source`'s script: the ends ``calls`` (each by
    :func:`finish_call`, :func:`finish_local_call` or :func:`retry_call`), then the take
    ``take_next`` (None: none); ``stats``: the sums applied with the ends, and those applied
    only if no next job is started."""
    key_list: list[str] = []
    args = [str(len(calls)), *stats]
    tail: list[str] = []
    for name, c_keys, c_args in calls:
        if name not in ENDS:
            raise ValueError(f"{name} is not an end")
        args += [name, str(len(c_keys)), str(len(c_args))]
        key_list += c_keys
        tail += c_args
    if take_next is not None:
        key_list += [inflight, keys.RUNNING, *take_next.lists]
        tail += take_next.args()
    return key_list, args + tail


def then_take_next(
    end_call: tuple[str, list[str], list[str]],
    inflight: str,
    take_next: NextJob,
    idle_stats: str = "",
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of :func:`then_source`'s script for an end then runs_take_next;
    ``idle_stats``: a runner process's sums, applied only if no next job was started."""
    _, f_keys, f_args = end_call
    key_list = [*f_keys, inflight, keys.RUNNING, *take_next.lists]
    args = [str(len(f_keys)), str(len(f_args)), idle_stats, *f_args, *take_next.args()]
    return key_list, args


def retry_call(
    ending: Ending, *, queue: str, due_ms: int, stats: str = ""
) -> tuple[str, list[str], list[str]]:
    """The script, KEYS and ARGV of :func:`bus.store.atomic.runs_trio.retry_later`:
    ``ending.reason`` is the retry's cause (the failed attempt's reason), the job's
    ``retry_of`` its attempt; ``stats`` as :func:`finish_call`'s."""
    args = [str(ending.attempt), ending.reason, str(now()), ending.entry, str(due_ms)]
    args += [f"{queue}|{ending.job_key}", stats]
    return "runs_retry", [*_attempt_keys(ending.job_key, ending.inflight), keys.DELAYED], args


def requeue_call(job_key: str, attempt: int, inflight: str, queue: str) -> Call:
    """The script, KEYS and ARGV that give an attempt back uncounted (runs_requeue: an
    interrupted one, or one of a batch that never ran), at the consuming end of ``queue``."""
    key_list = [job_key, keys.RUNNING, inflight, queue]
    return "runs_requeue", key_list, [str(attempt), str(now())]

"""The runner transitions of :mod:`bus.store.atomic.runs` for a runner process (no event loop),
as named operations on its blocking connection (bus/store/sync.py: the connection and its error
translation, :class:`~bus.store.sync.SyncStoreError`).

A built-in runner process (node/worker/loop.py) pops, starts, renews and ends its attempts
itself: these operations run the same scripts (``lua/runs_*.lua``, the one layer) as the node's
store does, and name what else the runner asks of Valkey (what a wake-up found moved, what a cut
call left in flight, its live logs); none hands out a generic verb.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from bus.core import keys, queues
from bus.core.ids import now
from bus.core.models import JobStatus, flat_fields
from bus.core.reasons import Reason
from bus.core.stats import RUNNER_FIELD, StatsBatch, totals_of
from bus.core.text import dlq_entry
from bus.store.atomic import source
from bus.store.atomic.runs import (
    Begun,
    Call,
    Ending,
    NextJob,
    Started,
    begun,
    ends_then_source,
    ends_then_take,
    fields_of,
    finish_call,
    finish_local_call,
    moved_start,
    requeue_call,
    retry_call,
    start_call,
    then_source,
    then_take_next,
    unrunnable_detail,
)
from bus.store.atomic.type_breakers import config_value
from bus.store.sentinel import SentinelTarget
from bus.store.sync import SyncStore, SyncStoreError, Unconfirmed, connect, is_utf8

__all__ = ["SyncRuns", "SyncStoreError", "Unconfirmed", "connect"]


# job statistics' sums for an end: (applied with it, applied only if it leaves the runner idle)
Sums = tuple[str, str]


def _entry(value: Any) -> str | bytes:  # noqa: ANN401
    """A popped entry: its text, or its bytes if they are no UTF-8 (read with
    ``surrogateescape``: bus/store/sync.py), as the node's store hands such a value over
    (bus/store/lane.py ``_restored``): no key of a job, refused by its exact value."""
    text = str(value)
    return text if is_utf8(text) else text.encode("utf-8", "surrogateescape")


@dataclass
class SyncRuns:
    """The transitions of one runner process on one context DB."""

    client: redis.Redis  # opened by :func:`connect` (tests set Valkey up through it too)
    # a replicated store's durability (bus/store/sentinel.py durability): see :meth:`confirm`
    durable: SentinelTarget | None = None
    store: SyncStore = field(init=False)

    def __post_init__(self) -> None:
        self.store = SyncStore(self.client, self.durable)

    @classmethod
    def open(cls, url: str, db: int, durable: SentinelTarget | None = None) -> SyncRuns:
        """The transitions on DB ``db`` at ``url`` (:func:`bus.store.sync.connect`)."""
        return cls(connect(url, db), durable)

    def _run(self, name: str, key_list: list[str], args: list[str]) -> Any:  # noqa: ANN401
        return self.store.script(name, _source(name), key_list, args)

    def confirm(self) -> None:
        """The writes of this thread's connection on disk where the store's URL asks
        (:meth:`bus.store.sync.SyncStore.confirm`); :class:`Unconfirmed` if not."""
        self.store.confirm()

    def cut(self) -> int:
        """Shut every connection to a primary the Sentinels replaced
        (:meth:`bus.store.sync.SyncStore.cut`)."""
        return self.store.cut()

    def leave_if_stale(self, exc: BaseException) -> bool:
        """Drop the connections if ``exc`` says their server is no primary now
        (:meth:`bus.store.sync.SyncStore.leave_if_stale`)."""
        return self.store.leave_if_stale(exc)

    def pop_first(self, lists: list[str], inflight: str) -> tuple[str | bytes | None, int]:
        """runs_pop_first: the entry moved from the first non-empty list (bytes: no UTF-8
        text), or None and the length of ``inflight`` (what a blocking pop that follows
        compares with its own)."""
        value = self._run("runs_pop_first", [inflight, *lists], [])
        if isinstance(value, int):
            return None, value
        return _entry(value), 0

    def start(
        self,
        job_key: str,
        token: str,
        ttl_ms: int,
        runner_id: str,
        script_type: str = "",
        *,
        counted: bool = False,
    ) -> Begun:
        """runs_start: the lease taken and the job marked started; the job's fields
        (``attempt`` counts this attempt), {} if the job is final, or why the entry names
        nothing to start (a reason token: :func:`bus.store.atomic.runs.unrunnable_detail`).
        ``runner_id`` names the in-flight list (``inflight:runner:<runner_id>``) a reaper
        removes the job from. With ``script_type``, refused (:class:`BreakerOpen`, nothing
        written) while that type's circuit breaker is open. ``counted``: the caller counts
        the start in its own sums (the script does not)."""
        call = start_call(job_key, token, ttl_ms, runner_id, script_type, counted)
        return begun(self._run(*call))

    def pop_started(
        self, source_list: str, inflight: str, timeout_s: float, held: int, nxt: NextJob
    ) -> tuple[str | bytes | None, Begun | None]:
        """BLMOVE of the oldest entry of ``source_list`` onto ``inflight`` (up to
        ``timeout_s``), with runs_start_moved pipelined behind it on the same connection: Valkey
        runs a blocked client's next command as soon as its pop returns, so the entry is
        started (as :meth:`start`, named as ``nxt`` names a take's) in the same round trip.
        ``held``: the length of ``inflight`` before. (None, None) on timeout; (entry, None) if
        the script did not start it (a server that lost the script: the caller starts it); the
        entry as bytes if it is no UTF-8 text.
        Interrupted (a signal, the runner's wake-up) before its replies were read, the
        connection is dropped: redis-py's Sentinel connections do not disconnect then, and the
        next command would read this pop's reply as its own. The start may have run: the job's
        hash says (status 'started', its ``runner`` the token)."""
        name = "runs_start_moved"
        moved, started = self.store.block_then_script(
            ("BLMOVE", source_list, inflight, "RIGHT", "LEFT", timeout_s),
            name,
            _source(name),
            [inflight, keys.RUNNING],
            nxt.moved_args(held),
        )
        entry, how = moved_start(started)
        if entry is not None and entry != moved:
            # another writer of ``inflight`` (there should be none) pushed what the script
            # started: given back, so that no job stays started by a slot that does not run it
            if isinstance(how, dict) and how:
                self.requeue(entry, int(how["attempt"]), inflight, queues.queue_of(how))
            how = None
        return (None, None) if moved is None else (_entry(moved), how)

    def give_back(self, inflight: str, job_key: str, queue: str) -> None:
        """A popped entry that may not start yet back at the consuming end of ``queue`` (the
        next taken), off ``inflight``, in one transaction."""
        self.store.transaction([("LREM", inflight, 1, job_key), ("RPUSH", queue, job_key)])

    def set_breaker(self, script_type: str, threshold: int, open_ms: int, probes: int) -> None:
        """The settings of ``script_type``'s circuit breaker (threshold 0: none), which the
        scripts that start and end its attempts read (bus/store/atomic/type_breakers.py)."""
        value = config_value(threshold, open_ms, probes)
        self.store.command("HSET", keys.TYPE_BREAKERS, f"{script_type}|cfg", value)

    def renew(self, job_key: str, token: str, ttl_ms: int, attempt: int) -> bool:
        """runs_renew: False if ``attempt`` was superseded."""
        args = [token, str(ttl_ms), str(attempt)]
        return bool(self._run("runs_renew", [keys.RUNNING, job_key], args))

    def finish(
        self,
        ending: Ending,
        answer_hash: dict[str, str],
        answer_key: str,
        nxt: NextJob | None,
        stats: Sums = ("", ""),
    ) -> tuple[bool, list[Started]]:
        """runs_finish (a signed answer for a remote origin), then maybe runs_take_next.
        ``stats``: the job statistics' sums to apply with this end, and those to apply only if
        no next job is started (:func:`bus.store.atomic.runs.then_source`); ('', ''): the
        script counts the attempt itself."""
        call = finish_call(ending, answer_key, answer_hash, stats[0])
        return self._with_next(call, ending, nxt, stats[1])

    def finish_local(
        self,
        ending: Ending,
        request_key: str,
        reply_ttl_s: int,
        nxt: NextJob | None,
        reply_to: str = "",
        stats: Sums = ("", ""),
    ) -> tuple[bool, list[Started]]:
        """runs_finish_local (the client's reply: :func:`bus.store.atomic.runs.finish_local_call`),
        then maybe runs_take_next; ``stats`` as :meth:`finish`'s."""
        call = finish_local_call(
            ending,
            request_key=request_key,
            reply_ttl_s=reply_ttl_s,
            reply_to=reply_to,
            stats=stats[0],
        )
        return self._with_next(call, ending, nxt, stats[1])

    def _with_next(
        self,
        call: tuple[str, list[str], list[str]],
        ending: Ending,
        nxt: NextJob | None,
        idle_stats: str,
    ) -> tuple[bool, list[Started]]:
        name, f_keys, f_args = call
        if nxt is None:
            return bool(self._run(name, f_keys, f_args)), []
        key_list, args = then_take_next(call, ending.inflight, nxt, idle_stats)
        done, taken = self._run(f"{name}+runs_take_next", key_list, args)
        return bool(done), self._taken(taken, ending.inflight, nxt)

    def end_all(
        self, calls: list[Call], inflight: str, nxt: NextJob | None, stats: Sums = ("", "")
    ) -> tuple[list[bool], list[Started]]:
        """Several ends (each a :func:`~bus.store.atomic.runs.finish_call`,
        :func:`~bus.store.atomic.runs.finish_local_call` or
        :func:`~bus.store.atomic.runs.retry_call`) and the take of the next jobs (``nxt``;
        None: none) in one script call (:func:`bus.store.atomic.runs.ends_then_source`):
        whether each end was recorded (False: its attempt was superseded), and the jobs
        started. ``stats``: the sums applied with the ends, and those applied only if no next
        job is started."""
        key_list, args = ends_then_take(calls, inflight, nxt, stats)
        done, taken = self._run("runs_ends+runs_take_next", key_list, args)
        oks = [bool(r) for r in done]
        return oks, [] if nxt is None else self._taken(taken, inflight, nxt)

    def _taken(self, taken: list[Any], inflight: str, nxt: NextJob) -> list[Started]:
        """The jobs a take (runs_take_next) started (:meth:`NextJob.read`); an entry it found
        that no runner can start, taken off already, is refused here (dead-lettered)."""
        started, refused = nxt.read(taken)
        for key, reason in refused:
            self.refuse(inflight, key, reason, "")
        return started

    def retry_later(self, ending: Ending, *, queue: str, due_ms: int, stats: str = "") -> bool:
        """runs_retry: the failed attempt recorded (``ending.reason`` the retry's cause), the
        next one due at ``due_ms``; ``stats`` the job statistics' sums to apply with it ('':
        the script counts the attempt)."""
        call = retry_call(ending, queue=queue, due_ms=due_ms, stats=stats)
        return bool(self._run(*call))

    def requeue(self, job_key: str, attempt: int, inflight: str, queue: str) -> bool:
        """runs_requeue: an interrupted attempt given back, not counted."""
        return bool(self._run(*requeue_call(job_key, attempt, inflight, queue)))

    def finish_malformed(
        self,
        job_key: str,
        attempt: int,
        inflight: str,
        detail: str,
        reason: str = Reason.MALFORMED_JOB,
    ) -> bool:
        """runs_malformed: a job whose hash cannot (or may not) be run ends in error with
        ``reason`` (the caller dead-letters it)."""
        key_list = [job_key, keys.RUNNING, inflight]
        args = [str(attempt), f"{reason}: {detail}", str(now())]
        return bool(self._run("runs_malformed", key_list, args))

    def refuse(self, inflight: str, value: str | bytes, reason: str, queue: str) -> None:
        """Dead-letter one popped entry (``reason`` a token of runs_unrunnable, or
        ``not_utf8``) and take it off ``inflight``, in one transaction."""
        detail = (
            "the entry is not UTF-8 text"
            if reason == Reason.NOT_UTF8
            else unrunnable_detail(reason)
        )
        self.dead_letter(value, reason, detail, queue, inflight=inflight)

    def dead_letter(
        self, key: str | bytes, reason: str, detail: str, queue: str, *, inflight: str = ""
    ) -> None:
        """One dlq entry as the node's store writes it (and the entry off ``inflight``, by
        its exact bytes: the client sends str values as strict UTF-8)."""
        raw = key if isinstance(key, bytes) else key.encode("utf-8", "surrogateescape")
        entry = dlq_entry(raw, reason, detail, queue)
        # the dlq watcher's copy too (node/observe/dlq.py), as the store does; the entry off
        # ``inflight`` by its exact bytes (str values are sent as strict UTF-8)
        writes: list[tuple[str | bytes | int, ...]] = [
            ("LPUSH", keys.DLQ, entry),
            ("LPUSH", keys.DLQ_EVENTS, entry),
        ]
        if inflight:
            writes.append(("LREM", inflight, 1, raw))
        self.store.transaction(writes)

    def slot_totals(self, slot_id: str) -> StatsBatch:
        """The job statistics the runner processes of slot ``slot_id`` handed over so far
        (bus/core/stats.py: StatsBatch.handover)."""
        return totals_of(self.store.command("HGET", keys.STATS_JOBS, RUNNER_FIELD + slot_id))

    def add_stats(self, stats: StatsBatch, slot_id: str | None = None) -> None:
        """Apply job statistics counted here (a runner going idle or leaving): ``stats`` as
        the slot's totals, one HSET; without ``slot_id`` as increments, in one transaction."""
        if slot_id is not None:
            totals = orjson.dumps(stats.figures()).decode()
            self.store.command("HSET", keys.STATS_JOBS, RUNNER_FIELD + slot_id, totals)
            return
        writes: list[tuple[str | int | float, ...]] = [
            ("HINCRBY", keys.STATS_JOBS, name, n) for name, n in stats.counts.items()
        ]
        writes += [("HINCRBYFLOAT", keys.STATS_JOBS, k, v) for k, v in stats.sums.items()]
        self.store.transaction(writes)

    def held(self, inflight: str) -> int:
        """How many entries the slot's in-flight list holds (what a blocking pop compares its
        own with)."""
        return int(self.store.command("LLEN", inflight))

    def moved_before_wake(
        self, inflight: str, held: int, token_base: str
    ) -> tuple[str | bytes, Begun | None] | None:
        """After a blocking pop a signal interrupted (:meth:`pop_started`): the entry the
        server moved onto ``inflight`` just before (bytes: no UTF-8 text), if the list grew
        past ``held``, and its job's fields if the start pipelined behind the pop ran (its
        status 'started', its ``runner`` this slot's token: ``<token_base>:<entry>``); None if
        nothing was moved."""
        head = self.store.command("LRANGE", inflight, 0, 0)
        if not head or self.held(inflight) <= held:
            return None
        moved = str(head[0])
        fields = fields_of(self.store.command("HGETALL", moved))
        ours = fields.get("status") == JobStatus.STARTED.value
        ours = ours and fields.get("runner") == f"{token_base}:{moved}"
        return _entry(moved), fields if ours else None

    def queue_of(self, job_key: str) -> str:
        """The list a job was queued on (its targeting fields: bus/core/queues.py)."""
        names = ("script_type", "group", "instance", "priority")
        values = self.store.command("HMGET", job_key, *names)
        return queues.queue_of({n: str(v or "") for n, v in zip(names, values, strict=True)})

    def message_fields(self, message_key: str) -> dict[str, str]:
        """The hash of the message that carried a job (to answer it)."""
        return fields_of(self.store.command("HGETALL", message_key))

    def in_flight(self, inflight: str) -> list[tuple[str, dict[str, str]]]:
        """Every entry of the slot's in-flight list, with what deciding its fate reads of its
        job: status, attempt, runner and the targeting fields ("" where absent)."""
        names = ("status", "attempt", "runner", "script_type", "group", "instance", "priority")
        found = []
        for key in self.store.command("LRANGE", inflight, 0, -1):
            values = self.store.command("HMGET", key, *names)
            found.append((str(key), {n: str(v or "") for n, v in zip(names, values, strict=True)}))
        return found

    def ack(self, inflight: str, value: str) -> None:
        """An entry done with (a duplicate of a final job, an end recorded) off ``inflight``."""
        self.store.command("LREM", inflight, 1, value)

    def log_chunk(self, job_key: str, fields: dict[str, str], most: int) -> None:
        """One entry of a job's live log stream (``logs:<job>``), the stream capped at about
        ``most`` entries."""
        flat = flat_fields(fields)
        self.store.command("XADD", keys.logs(job_key), "MAXLEN", "~", most, "*", *flat)

    def log_end(self, job_key: str, status: str, most: int, ttl_s: int) -> None:
        """The end marker of a job's live log stream, which then expires after ``ttl_s``."""
        stream = keys.logs(job_key)
        self.store.transaction(
            [("XADD", stream, "MAXLEN", "~", most, "*", "end", status), ("EXPIRE", stream, ttl_s)]
        )


@functools.cache
def _source(name: str) -> str:
    """The text of script ``name``, or of ``<first>+runs_take_next`` (runs.then_source), or
    of ``runs_ends+runs_take_next`` (runs.ends_then_source): built once per name, not per
    call (a lone job's end built its 33 kB again, ~2 us)."""
    if name == "runs_ends+runs_take_next":
        return ends_then_source()
    first, _, then = name.partition("+")
    return then_source(first, then) if then else source(name)

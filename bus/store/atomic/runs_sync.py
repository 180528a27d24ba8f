"""The runner transitions of :mod:`bus.store.atomic.runs` for a synchronous client (redis-py).

A built-in runner process (node/worker/loop.py) pops, starts, renews and ends its attempts
itself, with no event loop: these functions run the same scripts (``lua/runs_*.lua``, the one
layer) through a blocking ``redis.Redis`` opened with ``decode_responses=True`` and
``encoding_errors="surrogateescape"`` (:func:`connect`), so that an entry that is not UTF-8
survives the round trip byte for byte and can be refused by its exact value.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import hiredis
import orjson
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

from bus.core import keys, queues
from bus.core.ids import now
from bus.core.reasons import Reason
from bus.store.atomic import source
from bus.store.atomic.runs import (
    Ending,
    NextJob,
    Started,
    finish_call,
    finish_local_call,
    retry_call,
    then_source,
    then_take_next,
    unrunnable_detail,
)
from bus.store.atomic.stats import RUNNER_FIELD, StatsBatch, totals_of
from bus.store.atomic.type_breakers import BreakerOpen, config_value, open_wait
from bus.store.promise import ReplicasWanted
from bus.store.sentinel import SentinelTarget, is_sentinel_url, parse_sentinel_url

__all__ = ["Begun", "SyncRuns", "SyncStoreError", "Unconfirmed", "connect", "is_utf8"]

# What a call of this module raises when Valkey fails (the runner's node/ side names no client
# library: the node recovers a slot whose process exits on it).
SyncStoreError = redis.RedisError


class Unconfirmed(SyncStoreError):
    """WAITAOF did not confirm this process's writes where the store's URL asks: a failover
    now could lose them."""


def connect(url: str, db: int) -> redis.Redis:
    """A blocking client of DB ``db`` at ``url`` (a ``redis://``/``rediss://``/``unix://``
    URL as the node's store takes it; a DB in the URL is replaced by ``db``). A
    ``redis+sentinel://`` URL (bus/store/sentinel.py): each new connection goes to the server
    the Sentinels name primary, so after a failover the process follows on its next command."""
    if is_sentinel_url(url):
        return _primary(url, db)
    parts = urlsplit(url)
    if parts.scheme != "unix":  # a unix:/// URL is left whole: urlunsplit drops its "//"
        url = urlunsplit(parts._replace(path=""))
    # No socket timeout: a blocking pop waits longer than redis-py's default of 5 s, and a
    # stalled Valkey is waited for (as the node's store does), not given up on mid-script. No
    # retries: a script resent after a lost reply could run twice (a second start, a second
    # pop); what fails is handled by the caller (the runner's end retries; a failed pop ends
    # the process, which the node recovers and restarts).
    client: redis.Redis = redis.Redis.from_url(
        url,
        db=db,
        decode_responses=True,
        encoding_errors="surrogateescape",
        health_check_interval=0,
        socket_timeout=None,
        socket_connect_timeout=10,
        retry=Retry(NoBackoff(), 0),
    )
    return client


class _Sockets:
    """The open sockets of one client's connections, for :meth:`SyncRuns.cut`. A re-entrant
    lock: a signal handler that cuts runs in the main thread, possibly while that thread
    registers a socket."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.open: dict[int, socket.socket] = {}

    def add(self, sock: socket.socket) -> None:
        with self.lock:
            self.open = {k: s for k, s in self.open.items() if s.fileno() != -1}
            self.open[id(sock)] = sock

    def shut_all(self) -> int:
        with self.lock:
            found = list(self.open.values())
        for sock in found:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # closed meanwhile, or never connected
                pass
        return len(found)


class _PrimaryConnection(SentinelManagedConnection):
    """A connection to the Sentinels' primary whose socket can be shut from another frame of
    the same process (:meth:`SyncRuns.cut`): a read blocked on a primary that stalled
    (SIGSTOP) or was cut off then fails at once instead of waiting for that server to come
    back, as redis-py offers no other way to interrupt it."""

    def __init__(self, **kwargs: Any) -> None:  # noqa: ANN401 - redis-py's connection kwargs
        self.sockets: _Sockets = kwargs.pop("sockets")
        super().__init__(**kwargs)

    def _connect(self) -> socket.socket:
        sock: socket.socket = super()._connect()
        self.sockets.add(sock)
        return sock


def _primary(url: str, db: int) -> redis.Redis:
    target = parse_sentinel_url(url)
    auth = {"username": target.username, "password": target.password}
    sentinels = Sentinel(
        list(target.sentinels), sentinel_kwargs={**auth, "socket_connect_timeout": 10}
    )
    # the same settings as a plain client, for the same reasons (see above)
    client: redis.Redis = sentinels.master_for(
        target.service,
        db=db,
        decode_responses=True,
        encoding_errors="surrogateescape",
        health_check_interval=0,
        socket_timeout=None,
        socket_connect_timeout=10,
        retry=Retry(NoBackoff(), 0),
        connection_class=_PrimaryConnection,
        sockets=_Sockets(),
        **auth,
    )
    return client


def is_utf8(value: str) -> bool:
    """Whether a decoded entry was valid UTF-8 (else it holds surrogate escapes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# job statistics' sums for an end: (applied with it, applied only if it leaves the runner idle)
Sums = tuple[str, str]


def _pairs(flat: list[Any]) -> dict[str, str]:
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


# how a start went (runs_start): the job's fields after it ({}: the job is final), a reason
# token (the entry names nothing to start), or the type's breaker refused it
Begun = dict[str, str] | str | BreakerOpen


def _begun(reply: Any) -> Begun:  # noqa: ANN401
    if isinstance(reply, str):
        wait_ms = open_wait(reply)
        return reply if wait_ms is None else BreakerOpen(wait_ms)
    return _pairs(reply)


@dataclass
class SyncRuns:
    """The transitions of one runner process on one context DB."""

    client: redis.Redis
    # a replicated store's durability (bus/store/sentinel.py durability): see :meth:`confirm`
    durable: SentinelTarget | None = None
    clock: Callable[[], float] = time.monotonic  # the age of the replica count (confirm)

    def __post_init__(self) -> None:
        target = self.durable
        # how many replicas a confirmation counts: the node's own decision (bus/store/promise.py)
        self._replicas = (
            None
            if target is None
            else ReplicasWanted(target.promise, target.waitaof_replicas, self.clock)
        )
        self._scripts: dict[str, tuple[str, str]] = {}  # name: (source, sha1)
        self._loaded: set[str] = set()  # the sha1s of scripts this process loaded itself
        self._held = threading.local()  # each thread's own connection (see _command)

    def _command(self, *args: str | int | float, writes: bool = False) -> Any:  # noqa: ANN401
        """One command on this thread's connection, taken from the pool once and kept: the
        client's per-command path (pool checkout and release, retry wrapper, event dispatch,
        reply callbacks) cost a runner ~40 us of CPU per command, several commands per job.
        A send or read that got no answer disconnects the connection, and so do :meth:`cut`,
        :meth:`leave_if_stale` and an interrupted blocking pop (they disconnect the pool's
        connections, this one included): its next command connects again, through the
        Sentinels to the current primary. Raw replies: decoded text, ints, lists, None; an
        error reply raises. ``writes``: the command may write (see :meth:`confirm`)."""
        conn = self._connection()
        if writes:
            self._held.wrote_on = conn._sock  # a socket: a reconnected connection has another
        try:
            # packed by hiredis directly: redis-py's packer first converts each argument in a
            # generator (~30 per job end), 9 % of a runner's samples; ours are str and int
            packed = hiredis.pack_command(args)  # type: ignore[arg-type]  # its stub: a 1-tuple
            conn.send_packed_command([packed])
            return conn.read_response()
        except redis.ResponseError:  # an answer: the connection is fine
            raise
        except BaseException:  # no answer, or a part of one: the next command reconnects
            conn.disconnect()  # (a Sentinel-managed connection does not disconnect itself)
            raise

    def _connection(self) -> redis.connection.AbstractConnection:
        """This thread's connection (see :meth:`_command`), connected."""
        conn = getattr(self._held, "conn", None)
        if conn is None:
            conn = self._held.conn = self.client.connection_pool.get_connection()
        elif not conn.is_connected:
            # its own connect, which asks the Sentinels: a send on a disconnected connection
            # would connect again to the server it last knew, maybe a primary no more
            conn.connect()
        return conn

    def _script(self, name: str) -> tuple[str, str]:
        """Script ``name``: its text and its SHA1."""
        known = self._scripts.get(name)
        if known is None:
            text = _source(name)
            known = self._scripts[name] = (text, self.client.register_script(text).sha)
        return known

    def _run(self, name: str, key_list: list[str], args: list[str]) -> Any:  # noqa: ANN401
        text, sha = self._script(name)
        try:
            return self._command("EVALSHA", sha, len(key_list), *key_list, *args, writes=True)
        except redis.exceptions.NoScriptError:  # a restarted or flushed server: load, run once
            self._command("SCRIPT", "LOAD", text)
            return self._command("EVALSHA", sha, len(key_list), *key_list, *args, writes=True)

    def confirm(self) -> None:
        """Return once the writes this thread's connection made so far (the scripts that
        started or ended attempts) are fsynced where the store's URL asks (``WAITAOF`` on that
        connection); :class:`Unconfirmed` if they are not. A runner confirms the start of an
        attempt before it runs the job, and its end before it forgets the outcome: a start a
        failover loses leaves the job queued on the new primary for another slot to run again,
        and a lost end leaves it started by a slot that has moved on. At once on a store that
        is not replicated, or with no script sent since the last confirmation."""
        target, wrote_on = self.durable, getattr(self._held, "wrote_on", None)
        if target is None or wrote_on is None:
            return
        if self._held.conn._sock is not wrote_on:
            # WAITAOF vouches only for its own connection's writes (on a new primary, for
            # none of the old one's): those of a connection lost since are not confirmed
            raise Unconfirmed("not durable: the connection that made the writes was lost")
        wanted = self._replicas_wanted()
        local = replicas = 0
        for wait_ms in target.waits_ms():  # why two: bus/store/durable.py Barrier._confirm
            ask = ("WAITAOF", target.waitaof_local, wanted, wait_ms)
            local, replicas = (int(n) for n in self._command(*ask))
            if target.confirmed(local, replicas, wanted):
                self._held.wrote_on = None
                return
        raise Unconfirmed(f"not durable: {target.shortfall(local, replicas, wanted)}")

    def _replicas_wanted(self) -> int:
        """The replicas' fsyncs a confirmation waits for, the Sentinels asked when the count
        is stale (as the node's Barrier.count_replicas does); Unconfirmed if never known."""
        counted, target = self._replicas, self.durable
        assert counted is not None
        assert target is not None
        if counted.stale():
            manager = getattr(self.client.connection_pool, "sentinel_manager", None)
            for sentinel in getattr(manager, "sentinels", []):
                try:
                    counted.learn(
                        len(sentinel.execute_command("SENTINEL", "REPLICAS", target.service))
                    )
                    break
                except (redis.RedisError, OSError):
                    continue
            why = counted.unknown()
            if why is not None:
                raise Unconfirmed(f"not durable: {why}")
        return counted.wanted

    def cut(self) -> int:
        """Shut every connection of a Sentinel-managed client (the Sentinels named a new
        primary): a command waiting on the old primary fails now with a connection error
        (its outcome unknown, as for any cut connection), and the next command reaches the
        primary the Sentinels name. Safe from a signal handler and from another thread; how
        many sockets were shut (0 for a plain client: its server cannot move)."""
        sockets = self.client.connection_pool.connection_kwargs.get("sockets")
        return sockets.shut_all() if isinstance(sockets, _Sockets) else 0

    def leave_if_stale(self, exc: BaseException) -> bool:
        """Drop every connection when ``exc`` says its server is no primary now (``READONLY``:
        demoted) or one cut off from its replicas (``NOREPLICAS``: an old primary that woke
        up after a failover, until the Sentinels demote it about 10 s later): redis-py keeps
        a connection after an error reply, and the next command would go to the same server
        instead of the one the Sentinels name. Whether it did."""
        # a transaction's refusal comes as "Command # N (...) of pipeline caused error: ..."
        reply = str(exc).rpartition("caused error: ")[2]
        stale = isinstance(exc, redis.ResponseError) and reply.startswith(
            ("READONLY", "NOREPLICAS")
        )
        if stale:
            self.client.connection_pool.disconnect()
        return stale

    def pop_first(self, lists: list[str], inflight: str) -> tuple[str | None, int]:
        """runs_pop_first: the entry moved from the first non-empty list, or None and the
        length of ``inflight`` (what a blocking pop that follows compares with its own)."""
        value = self._run("runs_pop_first", [inflight, *lists], [])
        if isinstance(value, int):
            return None, value
        return str(value), 0

    def start(
        self, job_key: str, token: str, ttl_ms: int, runner_id: str, script_type: str = ""
    ) -> Begun:
        """runs_start: the lease taken and the job marked started; the job's fields
        (``attempt`` counts this attempt), {} if the job is final, or why the entry names
        nothing to start (a reason token: :func:`bus.store.atomic.runs.unrunnable_detail`).
        ``runner_id`` names the in-flight list (``inflight:runner:<runner_id>``) a reaper
        removes the job from. With ``script_type``, refused (:class:`BreakerOpen`, nothing
        written) while that type's circuit breaker is open."""
        args = [token, str(ttl_ms), str(now()), runner_id, script_type]
        return _begun(self._run("runs_start", [job_key, keys.lease(job_key), keys.RUNNING], args))

    def pop_started(
        self, source_list: str, inflight: str, timeout_s: float, held: int, nxt: NextJob
    ) -> tuple[str | None, Begun | None]:
        """BLMOVE of the oldest entry of ``source_list`` onto ``inflight`` (up to
        ``timeout_s``), with runs_start_moved pipelined behind it on the same connection: Valkey
        runs a blocked client's next command as soon as its pop returns, so the entry is
        started (as :meth:`start`, named as ``nxt`` names a take's) in the same round trip.
        ``held``: the length of ``inflight`` before. (None, None) on timeout; (entry, None) if
        the script did not start it (a server that lost the script: the caller starts it).
        Interrupted (a signal, the runner's wake-up) before its replies were read, the
        connection is dropped: redis-py's Sentinel connections do not disconnect then, and the
        next command would read this pop's reply as its own. The start may have run: the job's
        hash says (status 'started', its ``runner`` the token)."""
        text, sha = self._script("runs_start_moved")
        if sha not in self._loaded:  # pipelined, a NOSCRIPT would cost the pop its start
            self._command("SCRIPT", "LOAD", text)
            self._loaded.add(sha)
        args = [str(held), nxt.token_base, str(nxt.ttl_ms), str(now()), keys.lease("")]
        args += [nxt.runner_id, nxt.script_type]
        conn = self._connection()
        self._held.wrote_on = conn._sock  # see confirm
        replies: list[Any] = []
        try:
            conn.send_packed_command(
                conn.pack_commands(
                    [
                        ("BLMOVE", source_list, inflight, "RIGHT", "LEFT", timeout_s),
                        ("EVALSHA", sha, 2, inflight, keys.RUNNING, *args),
                    ]
                )
            )
            for _ in range(2):  # both replies, errors too: the next command reads its own
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as exc:
                    replies.append(exc)
        except BaseException:
            self.client.connection_pool.disconnect()  # the next command connects again
            raise
        moved, started = replies
        if isinstance(started, redis.exceptions.NoScriptError):  # a restarted or new primary
            self._command("SCRIPT", "LOAD", text)  # for the next pop
        if isinstance(moved, redis.ResponseError):
            raise moved
        entry, begun = None, None
        if isinstance(started, list) and started:  # the script started (or refused) its head
            entry, begun = str(started[0]), _begun(started[1])
        if entry is not None and entry != moved:
            # another writer of ``inflight`` (there should be none) pushed what the script
            # started: given back, so that no job stays started by a slot that does not run it
            if isinstance(begun, dict) and begun:
                self.requeue(entry, int(begun["attempt"]), inflight, queues.queue_of(begun))
            begun = None
        return (None, None) if moved is None else (str(moved), begun)

    def give_back(self, inflight: str, job_key: str, queue: str) -> None:
        """A popped entry that may not start yet back at the consuming end of ``queue`` (the
        next taken), off ``inflight``, in one transaction."""
        pipe = self.client.pipeline(transaction=True)
        pipe.lrem(inflight, 1, job_key)
        pipe.rpush(queue, job_key)
        pipe.execute()

    def set_breaker(self, script_type: str, threshold: int, open_ms: int, probes: int) -> None:
        """The settings of ``script_type``'s circuit breaker (threshold 0: none), which the
        scripts that start and end its attempts read (bus/store/atomic/type_breakers.py)."""
        value = config_value(threshold, open_ms, probes)
        self.client.hset(keys.TYPE_BREAKERS, f"{script_type}|cfg", value)

    def renew(self, job_key: str, token: str, ttl_ms: int, attempt: int) -> bool:
        """runs_renew: False if ``attempt`` was superseded."""
        args = [token, str(ttl_ms), str(attempt)]
        return bool(self._run("runs_renew", [keys.lease(job_key), job_key], args))

    def finish(
        self,
        ending: Ending,
        answer_hash: dict[str, str],
        answer_key: str,
        nxt: NextJob | None,
        stats: Sums = ("", ""),
    ) -> tuple[bool, Started | None]:
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
    ) -> tuple[bool, Started | None]:
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
    ) -> tuple[bool, Started | None]:
        name, f_keys, f_args = call
        if nxt is None:
            return bool(self._run(name, f_keys, f_args)), None
        key_list, args = then_take_next(call, ending.inflight, nxt, idle_stats)
        done, taken = self._run(f"{name}+runs_take_next", key_list, args)
        if len(taken) == 2 and (wait_ms := open_wait(taken[1])) is not None:  # nothing taken
            nxt.breaker_wait_ms = wait_ms
            return bool(done), None
        if len(taken) == 2:  # an entry no runner can start: taken off already, recorded here
            self.refuse(ending.inflight, str(taken[0]), str(taken[1]), "")
        if len(taken) == 1 and isinstance(taken[0], int):  # nothing queued
            nxt.found_empty, nxt.held = True, taken[0]
            return bool(done), None
        if len(taken) < 3:
            return bool(done), None
        return bool(done), (str(taken[0]), _pairs(taken[1:]))

    def retry_later(
        self, ending: Ending, *, queue: str, reason: str, due_ms: int, stats: str = ""
    ) -> bool:
        """runs_retry: the failed attempt recorded, the next one due at ``due_ms``; ``stats``
        the job statistics' sums to apply with it ('': the script counts the attempt)."""
        call = retry_call(ending, queue=queue, reason=reason, due_ms=due_ms, stats=stats)
        return bool(self._run(*call))

    def requeue(self, job_key: str, attempt: int, inflight: str, queue: str) -> bool:
        """runs_requeue: an interrupted attempt given back, not counted."""
        key_list = [job_key, keys.lease(job_key), keys.RUNNING, inflight, queue]
        return bool(self._run("runs_requeue", key_list, [str(attempt), str(now())]))

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
        key_list = [job_key, keys.lease(job_key), keys.RUNNING, inflight]
        args = [str(attempt), f"{reason}: {detail}", str(now())]
        return bool(self._run("runs_malformed", key_list, args))

    def refuse(self, inflight: str, value: str, reason: str, queue: str) -> None:
        """Dead-letter one popped entry (``reason`` a token of runs_unrunnable, or
        ``not_utf8``) and take it off ``inflight``, in one transaction."""
        detail = (
            "the entry is not UTF-8 text"
            if reason == Reason.NOT_UTF8
            else unrunnable_detail(reason)
        )
        self.dead_letter(value, reason, detail, queue, inflight=inflight)

    def dead_letter(
        self, key: str, reason: str, detail: str, queue: str, *, inflight: str = ""
    ) -> None:
        """One dlq entry as the node's store writes it (and the entry off ``inflight``, by
        its exact bytes: the client sends str values as strict UTF-8)."""
        from bus.core.text import printable
        from bus.store.connection import (
            _dlq_entry as dlq_entry,  # a refusal: rare, and coredis with it
        )

        raw = key.encode("utf-8", "surrogateescape")
        entry = dlq_entry(printable(raw, 1000), reason, detail, queue)
        pipe = self.client.pipeline(transaction=True)
        pipe.lpush(keys.DLQ, entry)
        # for the dlq watcher (node/observe/dlq.py), as the store does
        pipe.lpush(keys.DLQ_EVENTS, entry)
        if inflight:
            pipe.lrem(inflight, 1, raw)  # type: ignore[arg-type]  # bytes are sent as they are
        pipe.execute()

    def slot_totals(self, slot_id: str) -> StatsBatch:
        """The job statistics the runner processes of slot ``slot_id`` handed over so far
        (bus/store/atomic/stats.py: StatsBatch.handover)."""
        return totals_of(self.client.hget(keys.STATS_JOBS, RUNNER_FIELD + slot_id))

    def add_stats(self, stats: StatsBatch, slot_id: str | None = None) -> None:
        """Apply job statistics counted here (a runner going idle or leaving): ``stats`` as
        the slot's totals, one HSET; without ``slot_id`` as increments, in one transaction."""
        if slot_id is not None:
            totals = orjson.dumps(stats.figures()).decode()
            self._command("HSET", keys.STATS_JOBS, RUNNER_FIELD + slot_id, totals)
            return
        pipe = self.client.pipeline(transaction=True)
        for name, n in stats.counts.items():
            pipe.hincrby(keys.STATS_JOBS, name, n)
        for name, total in stats.sums.items():
            pipe.hincrbyfloat(keys.STATS_JOBS, name, total)
        pipe.execute()

    def list_length(self, name: str) -> int:
        return int(self._command("LLEN", name))

    def list_all(self, name: str) -> list[str]:
        return [str(v) for v in self.client.lrange(name, 0, -1)]

    def list_head(self, name: str) -> str | None:
        """The entry at the head of list ``name`` (the last pushed), or None if it is empty."""
        head = self.client.lrange(name, 0, 0)
        return str(head[0]) if head else None

    def hash_fields(self, key: str, names: tuple[str, ...]) -> dict[str, str]:
        """The fields ``names`` of hash ``key`` ("" for an absent one)."""
        values = self.client.hmget(key, list(names))
        return {n: str(v or "") for n, v in zip(names, values, strict=True)}

    def hash_all(self, key: str) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.client.hgetall(key).items()}

    def ack(self, inflight: str, value: str) -> None:
        self.client.lrem(inflight, 1, value)

    def xadd_capped(self, stream: str, fields: dict[str, str], most: int) -> None:
        self.client.xadd(stream, fields, maxlen=most, approximate=True)  # type: ignore[arg-type]

    def expire(self, key: str, ttl_s: int) -> None:
        self.client.expire(key, ttl_s)


def _source(name: str) -> str:
    """The text of script ``name``, or of ``<first>+runs_take_next`` (runs.then_source)."""
    first, _, then = name.partition("+")
    return then_source(first, then) if then else source(name)

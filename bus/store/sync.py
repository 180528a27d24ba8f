"""The store's blocking connection, for the runner processes (no event loop): the sync twin of
:mod:`bus.store.lane`, with its own error translation.

A runner process (node/worker/) pops, starts, renews and ends its attempts itself through the
named operations of :mod:`bus.store.atomic.runs_sync`, which send their commands here. redis-py
does the connecting (a plain URL, or the primary the Sentinels name) with
``decode_responses=True`` and ``encoding_errors="surrogateescape"``, so that an entry that is
not UTF-8 survives the round trip byte for byte and can be refused by its exact value; each
thread keeps one connection and sends on it directly (:meth:`SyncStore.command`).

What Valkey fails with is translated where it enters, as :class:`bus.store.connection.Store`
does for coredis: every redis-py error (and a socket's) becomes :class:`SyncStoreError`, with
the error reply, if the server answered one, in ``reply``. No redis-py class leaves bus/store.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import hiredis
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

from bus.errors import StoreError
from bus.store.promise import ReplicasWanted, address, counted_out, down_in, elsewhere
from bus.store.sentinel import (
    NUDGE,
    NUDGES_AT_ONCE,
    SentinelTarget,
    is_sentinel_url,
    nudge_gaps,
    parse_sentinel_url,
)

__all__ = ["Arg", "SyncStore", "SyncStoreError", "Unconfirmed", "connect", "is_utf8"]

Arg = str | int | float | bytes  # one argument of a command


class SyncStoreError(StoreError):
    """A blocking call to Valkey failed: no answer (its outcome unknown), or an error reply
    (``reply``: its text, e.g. ``READONLY ...``)."""

    def __init__(self, message: str, reply: str | None = None) -> None:
        super().__init__(message)
        self.reply = reply


class Unconfirmed(SyncStoreError):
    """WAITAOF did not confirm this process's writes where the store's URL asks: a failover
    now could lose them."""


class _Translated:
    """The one translation of redis-py's and sockets' errors (see the module docstring), as
    ``with _translated:``: one instance for every call, not a generator-based context manager
    made per call (a lone job's start and its end each pass through one)."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object
    ) -> None:
        if isinstance(exc, redis.ResponseError):
            # a transaction's refusal comes as "Command # N (...) of pipeline caused error: ..."
            reply = str(exc).rpartition("caused error: ")[2]
            raise SyncStoreError(f"valkey refused: {exc}", reply) from exc
        if isinstance(exc, redis.RedisError | OSError):
            raise SyncStoreError(f"valkey: {exc!r}") from exc


_translated = _Translated()


def connect(url: str, db: int) -> redis.Redis:
    """A blocking client of DB ``db`` at ``url`` (a ``redis://``/``rediss://``/``unix://``
    URL as the node's store takes it; a DB in the URL is replaced by ``db``), for a
    :class:`SyncStore` (and for the setup of tests, which speak to Valkey directly). A
    ``redis+sentinel://`` URL (bus/store/sentinel.py): each new connection goes to the server
    the Sentinels name primary, so after a failover the process follows on its next command."""
    with _translated:
        return _primary(url, db) if is_sentinel_url(url) else _plain(url, db)


# No socket timeout: a blocking pop waits longer than redis-py's default of 5 s, and a stalled
# Valkey is waited for (as the node's store does), not given up on mid-script. No retries: a
# script resent after a lost reply could run twice (a second start, a second pop); what fails
# is handled by the caller (the runner's end is tried again; a failed pop ends the process,
# which the node recovers and restarts).
_SETTINGS: dict[str, Any] = {
    "decode_responses": True,
    "encoding_errors": "surrogateescape",
    "health_check_interval": 0,
    "socket_timeout": None,
    "socket_connect_timeout": 10,
}


def _plain(url: str, db: int) -> redis.Redis:
    parts = urlsplit(url)
    if parts.scheme != "unix":  # a unix:/// URL is left whole: urlunsplit drops its "//"
        url = urlunsplit(parts._replace(path=""))
    client: redis.Redis = redis.Redis.from_url(url, db=db, retry=Retry(NoBackoff(), 0), **_SETTINGS)
    return client


class _Sockets:
    """The open sockets of one client's connections, for :meth:`SyncStore.cut`. A re-entrant
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
    the same process (:meth:`SyncStore.cut`): a read blocked on a primary that stalled
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
    # a stalled Sentinel answers nothing: the next one is asked after socket_timeout
    asking = {**auth, "socket_connect_timeout": 10, "socket_timeout": 2}
    sentinels = Sentinel(list(target.sentinels), sentinel_kwargs=asking)
    # the same settings as a plain client, for the same reasons (see above)
    client: redis.Redis = sentinels.master_for(
        target.service,
        db=db,
        retry=Retry(NoBackoff(), 0),
        connection_class=_PrimaryConnection,
        sockets=_Sockets(),
        **_SETTINGS,
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


class _Nudges:
    """One thread's nudges of its ``WAITAOF``s (bus/store/durable.py says why), each on a
    connection of ``pool`` that has no nudge awaiting its reply, at most
    :data:`NUDGES_AT_ONCE`: a nudge is answered only on the server's next loop after its 1 ms.
    A reply is read once it is there; a nudge that fails is counted, never raised."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self.pool = pool
        self.command = hiredis.pack_command(NUDGE)  # type: ignore[arg-type]
        self.sent = 0  # nudges sent (for tests)
        self.failed = 0  # nudges that failed: nothing else came of them
        self._conns: list[redis.connection.Connection] = []
        self._asked: set[int] = set()  # id() of those whose nudge is not answered yet

    def send(self) -> None:
        try:
            self._send()
        except Exception:  # noqa: BLE001 - a nudge stops nothing; counted, never raised
            self.failed += 1

    def _send(self) -> None:
        free = None
        for conn in list(self._conns):
            try:
                if id(conn) in self._asked and conn.is_connected:
                    if not conn.can_read(0):
                        continue  # its nudge still blocked
                    conn.read_response()  # its nudge's reply, dropped
                self._asked.discard(id(conn))  # answered, or cut (the next send connects)
                free = free or conn
            except (redis.RedisError, OSError):  # a refusal, or a connection lost
                self._drop(conn)
        if free is None and len(self._conns) >= NUDGES_AT_ONCE:
            return
        try:
            if free is None:
                free = self.pool.get_connection()
                self._conns.append(free)
            free.send_packed_command([self.command])
            self._asked.add(id(free))
            self.sent += 1
        except (redis.RedisError, OSError):
            if free is not None:
                self._drop(free)

    def _drop(self, conn: redis.connection.Connection) -> None:
        self.failed += 1
        self._asked.discard(id(conn))
        if conn in self._conns:
            self._conns.remove(conn)
        conn.disconnect()
        self.pool.release(conn)


class SyncStore:
    """One runner process's connection to one context DB: commands, scripts, transactions,
    every error translated (:class:`SyncStoreError`)."""

    def __init__(
        self,
        client: redis.Redis,
        durable: SentinelTarget | None = None,
        clock: Callable[[], float] = time.monotonic,  # the age of the replica count (confirm)
    ) -> None:
        self.client = client
        # a replicated store's durability (bus/store/sentinel.py durability): see confirm
        self.durable = durable
        # how many replicas a confirmation counts: the node's own decision (bus/store/promise.py)
        self._replicas = (
            None
            if durable is None
            else ReplicasWanted(durable.promise, durable.waitaof_replicas, clock)
        )
        self._scripts: dict[str, tuple[str, str]] = {}  # name: (source, sha1)
        self._loaded: set[str] = set()  # the sha1s of scripts this process loaded itself
        self._held = threading.local()  # each thread's own connection (see command)

    def close(self) -> None:
        self.client.close()

    def command(self, *args: Arg, writes: bool = False) -> Any:  # noqa: ANN401
        """One command on this thread's connection, taken from the pool once and kept: the
        client's per-command path (pool checkout and release, retry wrapper, event dispatch,
        reply callbacks) cost a runner ~40 us of CPU per command, several commands per job.
        A send or read that got no answer disconnects the connection, and so do :meth:`cut`,
        :meth:`leave_if_stale` and an interrupted blocking pop (they disconnect the pool's
        connections, this one included): its next command connects again, through the
        Sentinels to the current primary. Raw replies: decoded text, ints, lists, None.
        ``writes``: the command may write (see :meth:`confirm`)."""
        with _translated:
            return self._command(args, writes)

    def _command(self, args: Sequence[Arg], writes: bool, nudges: _Nudges | None = None) -> Any:  # noqa: ANN401
        conn = self._connection()
        if writes:
            self._held.wrote_on = conn._sock  # a socket: a reconnected connection has another
        try:
            # packed by hiredis directly: redis-py's packer first converts each argument in a
            # generator (~30 per job end), 9 % of a runner's samples; ours are str and int
            packed = hiredis.pack_command(tuple(args))  # type: ignore[arg-type]
            conn.send_packed_command([packed])
            if nudges is not None:  # a WAITAOF: nudged while it waits
                for gap in nudge_gaps():
                    if conn.can_read(gap):
                        break
                    nudges.send()
            return conn.read_response()
        except redis.ResponseError:  # an answer: the connection is fine
            raise
        except BaseException:  # no answer, or a part of one: the next command reconnects
            conn.disconnect()  # (a Sentinel-managed connection does not disconnect itself)
            raise

    def _connection(self) -> redis.connection.AbstractConnection:
        """This thread's connection (see :meth:`command`), connected."""
        conn = getattr(self._held, "conn", None)
        if conn is None:
            conn = self._held.conn = self.client.connection_pool.get_connection()
        elif not conn.is_connected:
            # its own connect, which asks the Sentinels: a send on a disconnected connection
            # would connect again to the server it last knew, maybe a primary no more
            conn.connect()
        return conn

    def _nudges(self) -> _Nudges:
        """This thread's nudges (made on first use)."""
        nudges = getattr(self._held, "nudges", None)
        if nudges is None:
            nudges = self._held.nudges = _Nudges(self.client.connection_pool)
        return nudges

    def sha(self, name: str, text: str) -> str:
        """The SHA1 of script ``name`` whose text is ``text`` (computed once)."""
        known = self._scripts.get(name)
        if known is None:
            known = self._scripts[name] = (text, self.client.register_script(text).sha)
        return known[1]

    def script(self, name: str, text: str, key_list: Sequence[str], args: Sequence[Arg]) -> Any:  # noqa: ANN401
        """Script ``name`` (``text``) by EVALSHA, loaded once more if the server lost it (a
        restart, a flush) and run again: it did not run the first time."""
        sha = self.sha(name, text)
        with _translated:
            try:
                return self._command(("EVALSHA", sha, len(key_list), *key_list, *args), True)
            except redis.exceptions.NoScriptError:
                self._command(("SCRIPT", "LOAD", text), False)
                return self._command(("EVALSHA", sha, len(key_list), *key_list, *args), True)

    def transaction(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """``commands`` in one MULTI/EXEC; their replies."""
        with _translated:
            pipe = self.client.pipeline(transaction=True)
            for args in commands:
                pipe.execute_command(*args)
            return list(pipe.execute())

    def block_then_script(
        self,
        block: Sequence[Arg],
        name: str,
        text: str,
        key_list: Sequence[str],
        args: Sequence[Arg],
    ) -> tuple[Any, Any]:
        """A blocking command (a pop) with script ``name`` pipelined behind it on the same
        connection: Valkey runs a blocked client's next command as soon as the first returns,
        so both happen in one round trip. The script's reply is a :class:`SyncStoreError` if
        it failed (it is not raised: the pop's reply matters more); a script the server lost
        is loaded for the next call. Interrupted (a signal) before the replies were read, the
        connection is dropped: redis-py's Sentinel connections do not disconnect then, and
        the next command would read this one's reply as its own."""
        sha = self.sha(name, text)
        with _translated:
            if sha not in self._loaded:  # pipelined, a NOSCRIPT would cost the pop its script
                self._command(("SCRIPT", "LOAD", text), False)
                self._loaded.add(sha)
            conn = self._connection()
            self._held.wrote_on = conn._sock  # see confirm
            replies: list[Any] = []
            try:
                # packed by hiredis, as _command's: redis-py's packer took ~6 us a pop, this ~2
                script = ("EVALSHA", sha, len(key_list), *key_list, *args)
                packed = hiredis.pack_command(tuple(block)) + hiredis.pack_command(script)  # type: ignore[arg-type]
                conn.send_packed_command([packed])
                for _ in range(2):  # both replies, errors too: the next command reads its own
                    try:
                        replies.append(conn.read_response())
                    except redis.ResponseError as exc:
                        replies.append(exc)
            except BaseException:
                self.client.connection_pool.disconnect()  # the next command connects again
                raise
            first, then = replies
            if isinstance(then, redis.exceptions.NoScriptError):  # a restarted or new primary
                self._command(("SCRIPT", "LOAD", text), False)  # for the next call
            if isinstance(first, redis.ResponseError):
                raise first
        if isinstance(then, redis.ResponseError):
            then = SyncStoreError(f"valkey refused: {then}", str(then))
        return first, then

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
        local, replicas = self._waitaof(target, wanted)
        if not target.confirmed(local, replicas, wanted) and self._replicas is not None:
            # a replica that went down since the count (bus/store/durable.py Barrier._confirm)
            self._replicas.changed()
            if self._replicas_wanted() < wanted:
                wanted = self._replicas_wanted()
                local, replicas = self._waitaof(target, wanted)
        if target.confirmed(local, replicas, wanted):
            self._held.wrote_on = None
            return
        if self._replicas is not None:
            self._replicas.changed()
        raise Unconfirmed(f"not durable: {target.shortfall(local, replicas, wanted)}")

    def _waitaof(self, target: SentinelTarget, wanted: int) -> tuple[int, int]:
        local = replicas = 0
        for wait_ms in target.waits_ms():  # why two: bus/store/durable.py Barrier._confirm
            ask = ("WAITAOF", target.waitaof_local, wanted, wait_ms)
            with _translated:
                local, replicas = (int(n) for n in self._command(ask, False, self._nudges()))
            if target.confirmed(local, replicas, wanted):
                break
        return local, replicas

    def _replicas_wanted(self) -> int:
        """The replicas' fsyncs a confirmation waits for, the Sentinels asked when the count
        is stale (as the node's Barrier.count_replicas does); Unconfirmed if never known."""
        counted, target = self._replicas, self.durable
        assert counted is not None
        assert target is not None
        if counted.stale():
            manager = getattr(self.client.connection_pool, "sentinel_manager", None)
            listed, down, named = [], [], set()  # every Sentinel that answers may lead
            for sentinel in getattr(manager, "sentinels", []):
                try:
                    rows = sentinel.execute_command("SENTINEL", "REPLICAS", target.service)
                    primary = sentinel.execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", target.service
                    )
                except (redis.RedisError, OSError):
                    continue
                listed.append(len(rows))
                down.append(down_in(rows))
                named.add(address(primary))
            if listed:  # as bus/store/topology.py known_replicas counts
                settled = set.intersection(*down) and len(named) == 1
                moved = elsewhere(named, self._writes_to())
                if moved is not None:
                    # the writes went to a primary the Sentinels have replaced: one woken
                    # inside their failover still has a replica, which WAITAOF counts, but
                    # that replica's resync from the new primary erases them (and this
                    # thread's ROLE would count the new primary's replica out as down)
                    self.disconnect()  # the next command goes where they point
                    raise Unconfirmed(f"not durable: {moved}")
                counted.learn(max(listed), counted_out(down, self._attached()) if settled else 0)
            else:
                counted.unanswered()
            why = counted.unknown()
            if why is not None:
                raise Unconfirmed(f"not durable: {why}")
        return counted.wanted

    def _writes_to(self) -> str | None:
        """The ip:port of the server this thread's connection writes to (None: not connected
        to one the Sentinels named)."""
        conn = getattr(self._held, "conn", None)
        host, port = getattr(conn, "host", None), getattr(conn, "port", None)
        return None if host is None or port is None else f"{host}:{port}"

    def _attached(self) -> set[str] | None:
        """The replicas attached to the primary this thread writes to (its ``ROLE``); None
        if it does not answer as a primary (bus/store/promise.py counted_out)."""
        try:
            role = self.command("ROLE")
        except (SyncStoreError, redis.RedisError, OSError):
            return None
        text = lambda v: v.decode() if isinstance(v, bytes) else str(v)  # noqa: E731
        if not role or text(role[0]) != "master":
            return None
        return {f"{text(r[0])}:{text(r[1])}" for r in role[2]}

    def cut(self) -> int:
        """Shut every connection of a Sentinel-managed client (the Sentinels named a new
        primary): a command waiting on the old primary fails now with a connection error
        (its outcome unknown, as for any cut connection), and the next command reaches the
        primary the Sentinels name. Safe from a signal handler and from another thread; how
        many sockets were shut (0 for a plain client: its server cannot move)."""
        sockets = self.client.connection_pool.connection_kwargs.get("sockets")
        return sockets.shut_all() if isinstance(sockets, _Sockets) else 0

    def disconnect(self) -> None:
        """Drop every connection: the next command connects again (to the primary the
        Sentinels name now)."""
        self.client.connection_pool.disconnect()

    def leave_if_stale(self, exc: BaseException) -> bool:
        """Drop every connection when ``exc`` says its server is no primary now (``READONLY``:
        demoted) or one cut off from its replicas (``NOREPLICAS``: an old primary that woke
        up after a failover, until the Sentinels demote it about 10 s later): redis-py keeps
        a connection after an error reply, and the next command would go to the same server
        instead of the one the Sentinels name. Whether it did."""
        reply = exc.reply if isinstance(exc, SyncStoreError) else None
        stale = reply is not None and reply.startswith(("READONLY", "NOREPLICAS"))
        if stale:
            self.disconnect()
        return stale

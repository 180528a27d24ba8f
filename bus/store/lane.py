"""The store's hot path on connections of its own: script calls and blocking pops without
coredis' per-call machinery.

coredis sends each command through a writer task and reads each reply through a reader task
(two task switches and two memory streams per call), with cancel scopes and a ``fail_after``
around every pool checkout: 170-530 µs of CPU per call here, against 26-34 µs for the same
request and reply on a bare trio socket (bench/README.md "Eleventh round"). A node makes a
script call for most steps of a message, so :class:`Lane` serves those calls
(:meth:`Store.scripts`, :meth:`Store._block_then`), a client's submission
(:meth:`Store.transact`: :func:`transaction`) and its blocking reply pops on plain connections
it owns: the request is written and its reply read by the calling task itself. Everything else
(single commands, the Sentinels, a failover's retries, TLS) stays with coredis.

What coredis gave for free and a lane must keep:

- the same replies: RESP3 (``HELLO 3``, as coredis speaks) parsed by coredis' own parser, with
  the same decoding (UTF-8 text, the bytes of what is not UTF-8: a hostile entry stays itself)
  and error replies as coredis' exception classes (``NOSCRIPT`` is ``NoScriptError``), so
  the store's one error translation and :func:`bus.store.atomic.evalsha.evalsha_on` see
  nothing new; a lost connection is coredis' ``ConnectionError``;
- ``AUTH`` (the URL's ACL user and password) and ``SELECT`` of the DB, on every connection;
- a connection whose replies were not all read (a cancelled blocking pop, a failed read, a
  reply never awaited) is closed, never reused: the next command would read another's reply;
- an idle connection the server closed (a restart) is noticed before it is used, not after
  a command was sent on it.

Only a plain ``redis://`` or ``unix://`` URL without options gets a lane (:func:`lane_for`).
"""

from __future__ import annotations

import select
from collections.abc import AsyncIterator, Generator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import coredis.exceptions as cx
import trio
from coredis.parser import NOT_ENOUGH_DATA, Parser

from bus.store.atomic.evalsha import read_replies

__all__ = ["Lane", "LaneConnection", "Queued", "lane_for", "transaction"]

_READ_SIZE = 65536
_DEAD = select.POLLIN | select.POLLHUP | select.POLLERR  # on an idle connection: EOF or junk


def pack(args: tuple[Any, ...]) -> bytes:
    """One command in RESP (an array of bulk strings): str as UTF-8, int and float as text.
    Each argument is joined as it is, not formatted into a copy of itself (a script's JSON
    batch can be kilobytes)."""
    out = [b"*%d\r\n" % len(args)]
    append = out.append
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif isinstance(arg, int):
            arg = b"%d" % arg
        elif isinstance(arg, float):
            arg = b"%.15g" % arg  # as coredis writes a float
        append(b"$%d\r\n" % len(arg))
        append(arg)
        append(b"\r\n")
    return b"".join(out)


class _Reply:
    """The pending reply of one request; awaited in the order the requests were made."""

    __slots__ = ("conn", "decode", "seq")

    def __init__(self, conn: LaneConnection, seq: int, decode: bool) -> None:
        self.conn, self.seq, self.decode = conn, seq, decode

    def __await__(self) -> Generator[Any, None, Any]:
        return self.conn.reply(self.seq, self.decode).__await__()


class LaneConnection:
    """One connection, used by one task at a time (:meth:`Lane.acquire`). Requests are
    written when the first of their replies is awaited, together (a pipeline)."""

    def __init__(self, stream: trio.SocketStream, where: str) -> None:
        self.stream = stream
        self.where = where
        self._parser = Parser()
        self._out: list[bytes] = []
        self._asked = 0  # requests made
        self._read = 0  # replies read
        self.broken = False

    def create_request(
        self,
        *args: Any,  # noqa: ANN401 - command name and arguments, as coredis takes them
        decode: bool = True,
        disconnect_on_cancellation: bool = False,  # noqa: ARG002 - a lane always does
    ) -> _Reply:
        """Queue a command (coredis' ``create_request``, as the store uses it); its reply."""
        self._out.append(pack(args))
        self._asked += 1
        return _Reply(self, self._asked, decode)

    async def reply(self, seq: int, decode: bool) -> Any:  # noqa: ANN401 - a parsed reply
        """The reply to request ``seq``: the value, or the error reply raised."""
        if seq != self._read + 1:
            self.broken = True
            raise RuntimeError(f"lane reply {seq} awaited before reply {self._read + 1}")
        try:
            if self._out:
                data, self._out = b"".join(self._out), []
                await self.stream.send_all(data)
            while (
                parsed := self._parser.parse(decode=decode, encoding="utf-8")
            ) is NOT_ENOUGH_DATA:
                chunk = await self.stream.receive_some(_READ_SIZE)
                if not chunk:
                    raise cx.ConnectionError(
                        f"Connection lost while receiving response ({self.where})"
                    )
                self._parser.feed(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.broken = True
            raise cx.ConnectionError(f"Connection lost ({self.where}): {exc}") from exc
        except BaseException:  # cancelled mid-request, a protocol error: nothing is known now
            self.broken = True
            raise
        self._read += 1
        value = parsed[1]  # type: ignore[index]
        if isinstance(value, cx.RedisError):
            raise value
        return value

    @property
    def reusable(self) -> bool:
        return not self.broken and self._read == self._asked

    def idle_and_open(self) -> bool:
        """Whether this idle connection is still open: nothing to read on it (a server that
        closed it, or restarted, left EOF there; a RESP3 push is not expected either)."""
        poller = select.poll()
        poller.register(self.stream.socket.fileno(), _DEAD)
        return not poller.poll(0)

    def close(self) -> None:
        self.broken = True
        self.stream.socket.close()


class Queued:
    """The commands a transaction's ``fill`` queues (:meth:`Store.transact`), in the form the
    store's fills use them on a coredis pipeline: ``hset(key, mapping)``, ``lpush(key,
    values)``."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []

    def hset(self, key: str, mapping: Mapping[str, str]) -> None:
        self.commands.append(("HSET", key, *(x for pair in mapping.items() for x in pair)))

    def lpush(self, key: str, values: Sequence[str]) -> None:
        self.commands.append(("LPUSH", key, *values))


async def transaction(conn: LaneConnection, commands: list[tuple[Any, ...]]) -> list[Any]:
    """``commands`` in one ``MULTI``/``EXEC``, pipelined: their results. A command the server
    refused while queueing aborts the whole (``EXECABORT``: nothing ran); the first error,
    refusal or failure, is raised once every reply is read."""
    pending = [conn.create_request("MULTI")]
    pending += [conn.create_request(*command) for command in commands]
    pending.append(conn.create_request("EXEC"))
    replies = await read_replies(pending)
    for reply in replies:  # a refusal while queueing, or EXECABORT: nothing ran
        if isinstance(reply, cx.RedisError):
            raise reply
    executed = replies[-1]
    for result in executed:  # a command that failed while it ran (the others did run)
        if isinstance(result, cx.RedisError):
            raise result
    return list(executed)


@dataclass(frozen=True)
class _Target:
    path: str  # a unix socket, or "" for TCP
    host: str
    port: int
    username: str | None
    password: str | None

    @property
    def where(self) -> str:
        return self.path or f"{self.host}:{self.port}"


def lane_for(url: str) -> Lane | None:
    """A lane to the server of ``url``, or None where the store keeps coredis for everything:
    a Sentinel URL (its failover follows the primary through coredis), TLS, or options."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "unix") or parts.query or parts.fragment:
        return None
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    if parts.scheme == "unix":
        if not parts.path:
            return None
        return Lane(_Target(parts.path, "", 0, user, password))
    if not parts.hostname:
        return None
    return Lane(_Target("", parts.hostname, parts.port or 6379, user, password))


class Lane:
    """Idle connections per DB, opened as needed and kept while they stay usable."""

    def __init__(self, target: _Target) -> None:
        self.target = target
        self._idle: dict[int, list[LaneConnection]] = {}
        self._closed = False
        self.opened = 0  # connections made (for tests)

    @asynccontextmanager
    async def acquire(self, db: int) -> AsyncIterator[LaneConnection]:
        """A connection to DB ``db`` for the block, alone; kept for the next caller only if
        every reply asked for on it was read."""
        conn = self._idle_one(db) or await self._open(db)
        try:
            yield conn
        finally:
            if conn.reusable and not self._closed:
                self._idle.setdefault(db, []).append(conn)
            else:
                conn.close()

    def _idle_one(self, db: int) -> LaneConnection | None:
        idle = self._idle.get(db)
        while idle:
            conn = idle.pop()
            if conn.idle_and_open():
                return conn
            conn.close()
        return None

    async def _open(self, db: int) -> LaneConnection:
        if self._closed:
            raise RuntimeError("the store is closed")
        target = self.target
        try:
            if target.path:
                stream = await trio.open_unix_socket(target.path)
            else:
                stream = await trio.open_tcp_stream(target.host, target.port)
        except OSError as exc:
            raise cx.ConnectionError(f"Unable to establish a connection to {target.where}") from exc
        conn = LaneConnection(stream, target.where)
        self.opened += 1
        try:
            hello: tuple[Any, ...] = ("HELLO", 3)
            if target.password is not None:
                hello += ("AUTH", target.username or "default", target.password)
            replies = [conn.create_request(*hello), conn.create_request("SELECT", db)]
            for reply in replies:
                await reply
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        """Close the idle connections; those in use are closed when they are given back."""
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()

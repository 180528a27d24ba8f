"""The store's lane (bus/store/lane.py): script calls and blocking pops on raw connections, on a
real Valkey. What coredis gave for free must hold: the same replies and errors, hostile bytes
kept as bytes, AUTH, no reply read by the wrong caller after a cancelled pop, and an idle
connection the server closed noticed before a command is sent on it."""

from __future__ import annotations

import pytest
import redis
import trio
import trio.testing
from coredis.commands.script import Script
from coredis.parser import Parser
from hypothesis import given
from hypothesis import strategies as st

from bus.errors import ContentError, StoreError
from bus.store.connection import Store, open_store
from bus.store.lane import LaneConnection, lane_for, pack

ECHO = Script(
    script="""
local out = redis.call('LRANGE', KEYS[1], 0, -1)
table.insert(out, 42)
table.insert(out, ARGV[1])
return out
"""
)
SEE_TYPE = Script(script="return redis.call('LPUSH', KEYS[1], 'x')")
HOSTILE = [b"plain", "\u00e9t\u00e9 \u2713".encode(), b"\xff\xfe not utf-8", b""]


def _seed(url: str) -> None:
    sync = redis.Redis.from_url(url, db=1)
    sync.rpush("l", *HOSTILE)
    sync.set("s", "a string")
    sync.close()


async def _both(url: str, call: object) -> tuple[object, object]:
    """What ``call(store)`` gives through the lane and through coredis (the lane switched off)."""
    async with open_store(url) as lane_store, open_store(url) as plain:
        assert lane_store.lane is not None
        plain.lane = None
        got = await call(lane_store)  # type: ignore[operator]
        assert lane_store.lane.opened >= 1  # it did go through the lane
        return got, await call(plain)  # type: ignore[operator]


async def test_a_lane_reads_what_coredis_reads(redis_url):
    _seed(redis_url)
    lane, plain = await _both(redis_url, lambda s: s.script(1, ECHO, ["l"], ["\u2713"]))
    assert lane == plain
    # not UTF-8: its bytes, as they are; the rest text, integers as integers
    assert lane[1:] == ["\u00e9t\u00e9 \u2713", b"\xff\xfe not utf-8", "", 42, "\u2713"]


async def test_a_lane_raises_what_coredis_raises(redis_url):
    _seed(redis_url)
    for store_lane in (True, False):
        async with open_store(redis_url) as store:
            if not store_lane:
                store.lane = None
            with pytest.raises(ContentError) as blamed:  # the key holds a string
                await store.script(1, SEE_TYPE, ["s"], [])
            assert blamed.value.reason == "wrong_type", blamed.value
            # a script the server does not know is loaded and run (NOSCRIPT handled)
            await store.call(0, lambda r: r.script_flush())
            assert await store.script(0, ECHO, ["none"], ["a"]) == [42, "a"]


async def test_the_blocking_pops_take_alike_on_the_lane_and_on_coredis(redis_url):
    """pop_read_wait and pop_wait (a BLMOVE with the pop script pipelined behind it on the same
    connection) give the same entries, hashes and registry version either way."""

    async def pops(store: Store) -> tuple[object, ...]:
        await store.hset(1, "h1", {"n": "1"})
        await store.lpush(1, "src", "h1", "e2", "e3")
        read = await store.pop_read_wait(1, "src", "fly", 1, 5.0)
        taken = await store.pop_wait(1, "src", "fly", 5, 5.0, registry=True)
        return read, taken, store.registry_seen

    lane, plain = await _both(redis_url, pops)
    assert lane == plain == ([("h1", {"n": "1"})], ["e2", "e3"], "0")


async def test_a_hand_off_goes_on_the_lane(redis_url):
    """LPUSH hands a message on (to a peer's outbox, a client's reply list): on the lane, with
    no coredis client's writer and reader tasks between the caller and its reply (a cross-node
    job passes two such hand-offs), and refused alike on a key of another type."""
    _seed(redis_url)

    async def push(store: Store) -> list[str]:
        await store.lpush(1, "hand", "a", "b")
        with pytest.raises(ContentError) as blamed:
            await store.lpush(1, "s", "x")
        assert blamed.value.reason == "wrong_type", blamed.value
        return await store.lrange(1, "hand")

    lane, plain = await _both(redis_url, push)
    assert lane == ["b", "a"]
    assert plain == ["b", "a", "b", "a"]


async def test_a_lane_authenticates_as_the_url_says(redis_url):
    """Wrong credentials: refused by the server (coredis' error, translated)."""
    assert lane_for("redis+sentinel://u:p@127.0.0.1:1/hero") is not None  # to its primary
    assert lane_for("rediss://127.0.0.1:6380") is None
    assert lane_for(redis_url) is not None
    sync = redis.Redis.from_url(redis_url)
    sync.acl_setuser("lane", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all"])
    sync.close()
    async with open_store(redis_url) as store:
        store.lane = lane_for(_with_user(redis_url, "lane", "bad"))
        with pytest.raises(StoreError, match="WRONGPASS|invalid username-password"):
            await store.script(1, ECHO, ["l"], ["a"])
        store.lane = lane_for(_with_user(redis_url, "lane", "pw"))
        assert await store.script(1, ECHO, ["l"], ["a"]) == [42, "a"]


def _with_user(url: str, user: str, password: str) -> str:
    from bus.core.urls import with_credentials

    return with_credentials(url, user, password)


async def test_a_cancelled_blocking_pop_leaves_no_reply_for_the_next_caller(redis_url):
    """A pop cancelled while it waits is dropped with its connection: an entry pushed right
    after goes to the next pop of the list, not lost in a reply no one reads, and a script
    call after it reads its own reply."""
    async with open_store(redis_url) as store:
        assert store.lane is not None
        with trio.move_on_after(0.3):
            await store.pop_wait(1, "q", "inflight", 1, 30)
        await store.lpush(1, "q", "job:1:1")
        assert await store.script(1, ECHO, ["none"], ["mine"]) == [42, "mine"]
        assert await store.pop_wait(1, "q", "inflight", 1, 5) == ["job:1:1"]
        assert await store.lrange(1, "q") == []


async def test_an_idle_connection_the_server_closed_is_not_used(redis_url):
    """The server drops every client (as a restart does): the next call opens a new
    connection instead of failing on the dead one."""
    async with open_store(redis_url) as store:
        assert store.lane is not None
        assert await store.script(1, ECHO, ["none"], ["a"]) == [42, "a"]
        opened = store.lane.opened
        sync = redis.Redis.from_url(redis_url)
        sync.client_kill_filter(_type="normal", skipme=True)
        sync.close()
        assert await store.script(1, ECHO, ["none"], ["b"]) == [42, "b"]
        assert store.lane.opened == opened + 1


class _Steps(trio.abc.Instrument):
    """Counts the steps one task is resumed for."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task, self.count = task, 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.count += 1


async def test_a_lane_request_is_resumed_once_for_its_reply(redis_url):
    """A request is written without a checkpoint after the write (trio's ``send_all`` yields
    there: a scheduler pass for nothing, per request on a lone job's path) and its reply read
    after one wait, not after a read that fails first: the caller is resumed once."""
    async with open_store(redis_url) as store, trio.open_nursery() as nursery:
        assert await store.blpop(1, "warm", 0.01) is None  # the connection and its handshake

        async def push() -> None:
            await trio.testing.wait_all_tasks_blocked()
            await store.lpush(1, "q", "x")

        steps = _Steps(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(steps)
        nursery.start_soon(push)
        popped = await store.blpop(1, "q", 10)
        trio.lowlevel.remove_instrument(steps)
    assert popped == "x"
    assert steps.count == 1


async def test_a_lane_request_larger_than_the_socket_buffers_goes_whole(redis_url):
    """A request the socket cannot take at once is written as the buffer drains, and a reply
    of many reads is read whole."""
    big = "\u2713" * 1_000_000  # 3 MB (a unix socket takes ~200 kB), the reply as much
    async with open_store(redis_url) as store:
        assert await store.script(1, ECHO, ["none"], [big]) == [42, big]
        assert await store.script(1, ECHO, ["none"], ["next"]) == [42, "next"]


async def test_a_closed_store_refuses_lane_calls(redis_url):
    async with open_store(redis_url) as store:
        kept: Store = store
    with pytest.raises(StoreError, match="closed"):
        await kept.script(1, ECHO, ["none"], ["a"])


async def test_a_lane_transaction_runs_all_or_nothing(redis_url):
    """A submission's MULTI/EXEC on the lane (Store.transact): every command runs, or, when
    the server refuses one while queueing it, none does (EXECABORT: the refusal is raised)."""
    async with open_store(redis_url) as store:
        assert store.lane is not None
        await store.transact(1, lambda tx: (tx.hset("h", {"a": "1"}), tx.lpush("l2", ["x", "y"])))
        assert await store.hgetall(1, "h") == {"a": "1"}
        assert await store.lrange(1, "l2") == ["y", "x"]
        with pytest.raises(StoreError, match="wrong number of arguments"):  # HSET, no field
            await store.transact(1, lambda tx: (tx.lpush("l3", ["z"]), tx.hset("h", {})))
        assert await store.lrange(1, "l3") == []
        assert await store.script(1, ECHO, ["none"], ["next"]) == [42, "next"]


async def test_a_lane_blocking_pop_answers_as_coredis_does(redis_url):
    _seed(redis_url)
    lane, plain = await _both(redis_url, lambda s: s.blmpop(1, "l", 0.05, 2))
    assert lane == ["", b"\xff\xfe not utf-8"]  # from the consuming end; bytes kept
    assert plain == ["\u00e9t\u00e9 \u2713", "plain"]  # the next two: popped, not read again
    async with open_store(redis_url) as store:
        assert await store.blmpop(1, "empty", 0.05, 5) == []
        assert await store.blpop(1, "empty", 0.05) is None


@given(
    st.lists(
        st.one_of(st.text(), st.binary(), st.integers(), st.floats(allow_nan=False), st.booleans()),
        min_size=1,
        max_size=8,
    )
)
def test_pack_writes_each_argument_as_one_bulk_string(args):
    """What the lane writes reads back, argument by argument, as the bytes the server gets:
    text as UTF-8, an int as its digits (a bool as 1 or 0: hiredis refuses those, the Python
    packer takes them), a float as the text of the very same double."""
    parser = Parser()
    parser.feed(pack(tuple(args)))
    _, values = parser.parse(decode=False)
    assert values == [_as_sent(a) for a in args]
    for arg, value in zip(args, values, strict=True):
        if isinstance(arg, float):
            assert float(value) == arg  # the server reads back the double that was meant
    assert not parser.can_read()  # nothing after the command


def _as_sent(arg: str | bytes | int | float) -> bytes:
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, bool):
        return b"1" if arg else b"0"
    if isinstance(arg, float):
        return repr(arg).encode()
    if isinstance(arg, int):
        return str(arg).encode()
    return arg


# -- the reader: hiredis, read as coredis reads ------------------------------------------------

_ERROR_LINES = st.sampled_from(
    [
        b"NOSCRIPT No matching script",
        b"WRONGTYPE Operation against a key holding the wrong kind of value",
        b"EXECABORT Transaction discarded",
        b"ERR unknown command 'X'",
        b"ERR something else",
        b"BUSY a script runs",
        b"READONLY You can't write against a read only replica.",
    ]
)


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


_SCALARS = st.one_of(
    st.binary(max_size=40).map(_bulk),  # any bytes: UTF-8 text, or not
    st.text(max_size=20).map(lambda t: _bulk(t.encode())),
    st.integers(-(2**63), 2**63 - 1).map(lambda i: b":%d\r\n" % i),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: b",%r\r\n" % f),
    st.sampled_from([b"_\r\n", b"$-1\r\n", b"#t\r\n", b"#f\r\n", b"+OK\r\n", b"+QUEUED\r\n"]),
    _ERROR_LINES.map(lambda e: b"-%s\r\n" % e),
)
_KEYS = st.text(max_size=10).map(lambda t: _bulk(t.encode()))
_REPLIES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6).map(lambda xs: b"*%d\r\n" % len(xs) + b"".join(xs)),
        st.dictionaries(_KEYS, inner, max_size=4).map(
            lambda d: b"%%%d\r\n" % len(d) + b"".join(k + v for k, v in d.items())
        ),
    ),
    max_leaves=20,
)


def _as_coredis(data: bytes, count: int) -> list[object]:
    """The ``count`` replies in ``data`` as coredis' parser reads them (an error as its
    exception, compared by class and text)."""
    parser = Parser()
    parser.feed(data)
    return [_comparable(parser.parse(decode=True, encoding="utf-8")[1]) for _ in range(count)]  # type: ignore[index]


def _comparable(value: object) -> object:
    if isinstance(value, Exception):
        return (type(value), str(value))
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    return value


async def _through_lane(data: bytes, count: int, chunk: int) -> list[object]:
    """The ``count`` replies in ``data`` as a lane connection reads them off a socket, the
    bytes arriving ``chunk`` at a time (a reply split anywhere, several in one read)."""
    ours, theirs = trio.socket.socketpair()
    conn = LaneConnection(trio.SocketStream(ours), "socketpair")
    pending = [conn.create_request("PING") for _ in range(count)]
    out: list[object] = []
    async with trio.open_nursery() as nursery:

        async def serve() -> None:
            with theirs:
                await theirs.recv(65536)  # the requests
                for start in range(0, len(data), chunk):
                    await theirs.send(data[start : start + chunk])
                    await trio.lowlevel.checkpoint()

        nursery.start_soon(serve)
        for reply in pending:
            try:
                out.append(_comparable(await reply))
            except Exception as exc:  # noqa: BLE001 - an error reply, raised as coredis raises it
                out.append(_comparable(exc))
    conn.close()
    return out


@given(st.lists(_REPLIES, min_size=1, max_size=4), st.integers(1, 64))
def test_the_lane_reads_every_reply_as_coredis_parser_does(replies, chunk):
    """Text (UTF-8, or the bytes of what is not), numbers, doubles, null, booleans, status,
    nested arrays and maps, and error replies as coredis' exception classes: the lane's C
    reader gives what coredis' parser gives, however the bytes are split across reads."""
    data = b"".join(replies)
    expected = _as_coredis(data, len(replies))
    assert trio.run(_through_lane, data, len(replies), chunk) == expected

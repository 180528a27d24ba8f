"""What ``hero-node status`` says of a replicated store: its primary, its replicas and their lag,
and the last failover, as the Sentinels and the primary report them."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

import anyio
import coredis
import coredis.exceptions

from bus.errors import StoreError
from bus.store.promise import (
    ReplicasWanted,
    address,
    counted_out,
    down_in,
    elsewhere,
    flagged_down,
)
from bus.store.sentinel import SentinelTarget, is_sentinel_url, parse_sentinel_url

_FAILED = (coredis.exceptions.RedisError, OSError)
T = TypeVar("T")
SENTINEL_ANSWER_S = 0.5  # a Sentinel asked along with others, stalled, is passed over


@contextlib.contextmanager
def _as_store_error(what: str) -> Iterator[None]:
    """A server that cannot be reached or refuses, as StoreError (coredis raises some of its
    errors inside an exception group, from the task group of its connection)."""
    try:
        yield
    except _FAILED as exc:
        raise StoreError(f"{what}: {exc}") from exc
    except BaseExceptionGroup as group:
        failed, rest = group.split(_FAILED)
        if failed is None or rest is not None:
            raise
        raise StoreError(f"{what}: {_leaf(failed)}") from group


def _leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def store_topology(url: str) -> dict[str, Any]:
    """``{"mode": "single"}`` for a plain URL; for a ``redis+sentinel://`` one: ``primary``
    (host:port), ``replicas`` (address, link, offset lag in bytes, seconds since their last
    ack), ``sentinels`` (how many the asked one knows, itself included), ``failovers`` (the
    Sentinels' configuration epoch: how many times a primary was elected) and
    ``primary_for_s`` (how long the current primary has been seen as primary), ``promise``
    (:func:`promise_facts`: the promise in force and what it does now). StoreError if no
    Sentinel answers."""
    if not is_sentinel_url(url):
        return {"mode": "single"}
    target = parse_sentinel_url(url)
    auth = {"username": target.username, "password": target.password}
    [facts] = await _each_sentinel(target, lambda sentinel: _ask(sentinel, target.service, auth))
    down = {r["address"] for r in facts["replicas"] if r["link"] != "up"}
    out = 0
    if down:  # counted out as the promise counts (known_replicas), from this Sentinel's view
        host, _, port = str(facts["primary"]).rpartition(":")
        out = counted_out([down], await _attached(host, int(port), auth))
    return facts | {"promise": _promise_of(target, facts["replicas"], out)}


def _promise_of(target: SentinelTarget, replicas: list[dict[str, Any]], out: int) -> dict[str, Any]:
    if not target.durable:
        now = "promises given without a wait"
        return {"name": "none", "replicas_wanted": 0, "refusing": False, "now": now}
    wanted = ReplicasWanted(target.promise, target.waitaof_replicas, time.monotonic)
    wanted.learn(len(replicas), out)
    return promise_facts(target.promise, wanted.wanted, replicas)


class Replaced(StoreError):
    """The Sentinels agree on another primary than the server a promise's writes went to."""


async def known_replicas(url: str, written: str | None = None) -> tuple[int, int]:
    """How many replicas the Sentinels of ``url`` list for its set, and how many of those a
    promise ``every-replica`` may count out (bus/store/promise.py): flagged down by every
    Sentinel that answers (any of them may lead the next failover, each by its own view),
    all of them naming one primary, and not attached to it (``ROLE`` there): ``WAITAOF`` counts any
    attached replica, so one that is would stand in for a replica that can be promoted.
    StoreError if no Sentinel answers; :class:`Replaced` if they agree on a primary other
    than ``written`` (ip:port, the server the promise wrote to: promise.py elsewhere)."""
    target = parse_sentinel_url(url)

    async def view(sentinel: coredis.Redis[str]) -> tuple[str, int, list[Any]]:
        named = await sentinel.sentinel_get_master_addr_by_name(target.service)
        replicas = await sentinel.sentinel_replicas(target.service)
        host, port = named if named is not None else ("", 0)
        return str(host), int(str(port)), list(replicas)

    views = await _each_sentinel(target, view, every=True, answer_s=SENTINEL_ANSWER_S)
    moved = elsewhere({address((host, port)) for host, port, _ in views}, written)
    if moved is not None:
        raise Replaced(f"not durable: {moved}")  # no URL: it holds the password
    listed = max(len(replicas) for _, _, replicas in views)
    down = [down_in(replicas) for _, _, replicas in views]
    primaries = {(host, port) for host, port, _ in views}
    if not set.intersection(*down) or len(primaries) != 1:
        return listed, 0  # none flagged everywhere, or a failover still settling: none out
    auth = {"username": target.username, "password": target.password}
    return listed, counted_out(down, await _attached(*primaries.pop(), auth))


async def _attached(host: str, port: int, auth: dict[str, Any]) -> set[str] | None:
    """The replicas attached to ``host:port`` as its ``ROLE`` lists them (the addresses the
    Sentinels learn from its ``INFO``); None if it does not answer as a primary."""
    try:
        with _as_store_error(f"valkey {host}:{port}"), anyio.fail_after(SENTINEL_ANSWER_S):
            client: coredis.Redis[str] = coredis.Redis(host, port, decode_responses=True, **auth)
            async with client:
                role = await client.role()
    except (StoreError, TimeoutError):
        return None
    if role.role != "master":
        return None
    return {f"{r['host']!s}:{r['port']!s}" for r in role.slaves or ()}


async def _each_sentinel(
    target: SentinelTarget,
    ask: Callable[[coredis.Redis[str]], Awaitable[T]],
    *,
    every: bool = False,
    answer_s: float = math.inf,
) -> list[T]:
    """``ask`` the Sentinels of ``target`` in turn until one answers (``every``: all of them;
    ``answer_s``: how long each may take, a stalled one counting as not answering): the
    answers. StoreError if none answers."""
    answers: list[T] = []
    last: Exception | None = None
    for host, port in target.sentinels:
        try:
            with _as_store_error(f"sentinel {host}:{port}"):
                sentinel: coredis.Redis[str] = coredis.Redis(
                    host,
                    port,
                    decode_responses=True,
                    username=target.username,
                    password=target.password,
                )
                with anyio.fail_after(answer_s):
                    async with sentinel:
                        answers.append(await ask(sentinel))
        except (StoreError, TimeoutError) as exc:
            last = exc
            continue
        if not every:
            break
    if not answers:
        raise StoreError(f"no Sentinel of {target.service} answers: {last}")
    return answers


def promise_facts(promise: str, wanted: int, replicas: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``status`` says of the promise in force: its name, the replicas' fsyncs each
    promise waits for, whether it refuses writes now (fewer replicas up, as the Sentinels see
    them: a replica they flag down that the primary still has may yet fsync writes, but one
    that stalled does not, and which one it is shows only after the fact), and what it does
    now, in words (``replicas``: :func:`store_topology`'s rows)."""
    down = [r["address"] for r in replicas if r["link"] != "up"]
    able = len(replicas) - len(down)
    refusing = wanted > able
    if refusing:
        now = (
            f"writes are refused (not durable): {wanted} replica fsync(s) wanted, "
            f"{able} replica(s) up"
        )
    elif down:
        now = f"promises given with {wanted} replica fsync(s); {', '.join(down)} down"
    else:
        now = f"promises given with {wanted} replica fsync(s)"
    return {"name": promise, "replicas_wanted": wanted, "refusing": refusing, "now": now}


async def _ask(sentinel: coredis.Redis[str], service: str, auth: dict[str, Any]) -> dict[str, Any]:
    primary = await sentinel.sentinel_master(service)
    replicas = await sentinel.sentinel_replicas(service)
    others = await sentinel.sentinel_sentinels(service)
    address = f"{primary['ip']!s}:{primary['port']!s}"
    offsets = await _replica_offsets(str(primary["ip"]), int(str(primary["port"])), auth)
    rows = []
    for r in replicas:
        name = f"{r['ip']!s}:{r['port']!s}"
        seen = offsets.get(name, {})
        rows.append(
            {
                "address": name,
                "link": "down" if flagged_down(r) else "up",
                "lag_bytes": seen.get("lag_bytes"),
                "lag_s": seen.get("lag_s"),
            }
        )
    return {
        "mode": "replicated",
        "service": service,
        "primary": address,
        "primary_for_s": round(int(str(primary.get("role-reported-time", 0))) / 1000, 1),
        "failovers": int(str(primary.get("config-epoch", 0))),
        "replicas": rows,
        "sentinels": 1 + len(others),
        "quorum": int(str(primary.get("quorum", 0))),
    }


async def _replica_offsets(host: str, port: int, auth: dict[str, Any]) -> dict[str, Any]:
    """Per replica (host:port) of the primary's ``INFO replication``: how many bytes of the
    replication stream it has not acknowledged, and seconds since its last ack."""
    try:
        with _as_store_error(f"valkey {host}:{port}"):
            client: coredis.Redis[str] = coredis.Redis(host, port, decode_responses=True, **auth)
            async with client:
                info = await client.info("replication")
    except StoreError:
        return {}
    head = int(str(info.get("master_repl_offset", 0)))
    out: dict[str, Any] = {}
    for name, value in info.items():
        if name.startswith("slave") and isinstance(value, dict):
            where = f"{value.get('ip')}:{value.get('port')}"
            offset = int(str(value.get("offset", 0)))
            out[where] = {"lag_bytes": head - offset, "lag_s": int(str(value.get("lag", 0)))}
    return out


# -- who fsyncs every write ------------------------------------------------------------------


async def tune_fsync(url: str) -> tuple[str, list[str]]:
    """Let the primary fsync its AOF once a second and make every replica fsync each write;
    the primary and the replicas it set.

    Every data server starts with ``appendfsync always`` (any of them may be promoted), which
    is correct everywhere but costs the primary an fsync on each round of writes (+0.6 ms per
    write measured here). On the primary ``everysec`` gives up nothing: each promise waits for
    ``WAITAOF 1 R``, and Valkey fsyncs at once for a WAITAOF that waits on the local disk
    (0.25 ms); a replica must keep ``always`` or it confirms a write only on its next second."""
    target = parse_sentinel_url(url)
    auth = {"username": target.username, "password": target.password}
    facts = await store_topology(url)
    primary = str(facts["primary"])
    await _set_fsync(primary, "everysec", auth)
    tuned = []
    for replica in facts["replicas"]:  # a replica that is down is tuned when it comes back
        with contextlib.suppress(StoreError):
            await _set_fsync(replica["address"], "always", auth)
            tuned.append(replica["address"])
    return primary, tuned


async def _set_fsync(address: str, mode: str, auth: dict[str, Any]) -> None:
    host, _, port = address.rpartition(":")
    with _as_store_error(f"valkey {address}: cannot set appendfsync {mode}"):
        client: coredis.Redis[str] = coredis.Redis(host, int(port), decode_responses=True, **auth)
        async with client:
            await client.config_set({"appendfsync": mode})


# -- an old primary back as a replica at once ------------------------------------------------


async def demote_woken_primaries(url: str) -> list[str]:
    """Make a replica of the Sentinels' primary each server they list as its replica that
    answers ``ROLE`` as a primary (an old primary that woke or was restarted after a
    failover); the servers told so (``REPLICAOF``).

    The Sentinels do the same (sentinel.c ``sentinelRefreshInstanceInfo``: a server flagged
    replica that reports role master gets ``REPLICAOF`` the primary, ``+convert-to-slave``),
    but only once it has reported so for 8 s (``sentinel_publish_period * 4``) at their next
    ``INFO`` (up to 10 s apart), "to receive new configs if any". Until then no promise
    ``every-replica`` is given (bus/store/promise.py: it counts that server). What it loses
    in its resync it took after it stopped being the primary: no promise rests on it.

    Acts only when a majority of the URL's Sentinels answer, on the view the Sentinels' own
    conversion requires, held by every one of them that has the newest configuration (the
    highest ``config-epoch``: the one they all adopt, ``sentinelProcessHelloMessage``): one
    primary, flagged ``master``, neither down nor failing over (``sentinelPrimaryLooksSane``;
    a Sentinel's link to it may still be connecting), which answers ``ROLE`` as a primary;
    a replica not flagged ``promoted``. Sentinels still on the older configuration (they
    hear of the new one within ``sentinel_publish_period``, 2 s) are not waited for."""
    target = parse_sentinel_url(url)

    async def view(sentinel: coredis.Redis[str]) -> tuple[dict[str, Any], list[Any]]:
        primary = await sentinel.sentinel_master(target.service)
        return dict(primary), list(await sentinel.sentinel_replicas(target.service))

    try:
        views = await _each_sentinel(target, view, every=True, answer_s=SENTINEL_ANSWER_S)
    except StoreError:
        return []
    if len(views) * 2 <= len(target.sentinels):
        return []
    newest = max(int(str(p.get("config-epoch", 0))) for p, _ in views)
    views = [(p, r) for p, r in views if int(str(p.get("config-epoch", 0))) == newest]
    named = {(str(p["ip"]), int(str(p["port"]))) for p, _ in views}
    if len(named) != 1 or any(
        "master" not in _flags(p) or _flags(p) & _UNSETTLED for p, _ in views
    ):
        return []
    [(host, port)] = named
    auth = {"username": target.username, "password": target.password}
    if await _role(host, port, auth) != "master":
        return []
    woken = {
        (str(r["ip"]), int(str(r["port"])))
        for _, replicas in views
        for r in replicas
        if "promoted" not in _flags(r)
    } - named
    told = []
    for where in sorted(woken):
        if await _role(*where, auth) == "master":
            with contextlib.suppress(StoreError):
                await _replicaof(where, (host, port), auth)
                told.append(f"{where[0]}:{where[1]}")
    return told


_UNSETTLED = {"s_down", "o_down", "failover_in_progress"}


def _flags(row: dict[str, Any]) -> set[str]:
    flags = row.get("flags", "")
    return set(flags.split(",")) if isinstance(flags, str) else {str(f) for f in flags}


async def _role(host: str, port: int, auth: dict[str, Any]) -> str:
    """What ``ROLE`` says ``host:port`` is ("master", "slave"), "" if it does not answer in
    :data:`SENTINEL_ANSWER_S` (a server still stalled: its ``-sdown`` comes later)."""
    try:
        with _as_store_error(f"valkey {host}:{port}"), anyio.fail_after(SENTINEL_ANSWER_S):
            client: coredis.Redis[str] = coredis.Redis(host, port, decode_responses=True, **auth)
            async with client:
                reply = await client.role()
    except (StoreError, TimeoutError):
        return ""
    return str(reply.role)


async def _replicaof(
    server: tuple[str, int], primary: tuple[str, int], auth: dict[str, Any]
) -> None:
    with _as_store_error(f"valkey {server[0]}:{server[1]}: REPLICAOF"):
        client: coredis.Redis[str] = coredis.Redis(*server, decode_responses=True, **auth)
        async with client:
            await client.replicaof(*primary)


# A new primary, and an old primary turned into a replica when it comes back.
SWITCH_EVENTS = ("+switch-master", "+convert-to-slave")


# A server the Sentinels see go down or come back (a replica down costs promises: promise.py).
DOWN_EVENTS = ("+sdown", "-sdown")

# A server that may be an old primary answering again: woken (``-sdown``), restarted
# (``+reboot``), or read by a Sentinel as a primary where it expects a replica (``-role-change``).
WOKEN_EVENTS = ("-sdown", "+reboot", "-role-change")


async def watch_failovers(
    url: str,
    on_switch: Callable[[str], Awaitable[None]],
    channels: tuple[str, ...] = SWITCH_EVENTS,
) -> None:
    """Call ``on_switch`` with each event on ``channels`` (by default :data:`SWITCH_EVENTS`)
    a Sentinel publishes (its channel, a space, its text), until cancelled; StoreError when
    the Sentinel goes (the caller restarts it: the next start subscribes to whichever
    answers)."""
    target = parse_sentinel_url(url)
    await _each_sentinel(target, partial(_watch, channels=channels, on_event=on_switch))


async def watch_every_sentinel(
    url: str, on_event: Callable[[str], Awaitable[None]], channels: tuple[str, ...]
) -> None:
    """:func:`watch_failovers` on every Sentinel of ``url`` at once (each announces its own
    view as it changes: the last to take a new configuration, last); a Sentinel that does not
    answer, or goes, is left out. Returns when none is watched."""
    target = parse_sentinel_url(url)

    async def one(where: tuple[str, int]) -> None:
        with contextlib.suppress(StoreError):
            watch = partial(_watch, channels=channels, on_event=on_event)
            await _each_sentinel(replace(target, sentinels=(where,)), watch)

    async with anyio.create_task_group() as group:
        for where in target.sentinels:
            group.start_soon(one, where)


async def _watch(
    sentinel: coredis.Redis[str],
    *,
    channels: tuple[str, ...],
    on_event: Callable[[str], Awaitable[None]],
) -> None:
    try:
        async with sentinel.pubsub(channels=list(channels)) as ps:
            async for message in ps:
                if message["type"] == "message":
                    await on_event(f"{message['channel']!s} {message['data']!s}")
    except* anyio.ClosedResourceError:
        pass  # coredis's pubsub, cancelled as it unsubscribes (the node stopping)

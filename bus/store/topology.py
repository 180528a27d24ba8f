"""What ``hero-node status`` says of a replicated store: its primary, its replicas and their lag,
and the last failover, as the Sentinels and the primary report them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import coredis
import coredis.exceptions
from coredis.connection import TCPLocation

from bus.errors import StoreError
from bus.store.promise import ReplicasWanted
from bus.store.sentinel import SentinelTarget, is_sentinel_url, parse_sentinel_url

_FAILED = (coredis.exceptions.RedisError, OSError)


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
    last: Exception | None = None
    for host, port in target.sentinels:
        try:
            with _as_store_error(f"sentinel {host}:{port}"):
                facts = await _ask(TCPLocation(host, port), target.service, auth)
        except StoreError as exc:
            last = exc
            continue
        return facts | {"promise": _promise_of(target, facts["replicas"])}
    raise StoreError(f"no Sentinel of {target.service} answers: {last}")


def _promise_of(target: SentinelTarget, replicas: list[dict[str, Any]]) -> dict[str, Any]:
    if not target.durable:
        now = "promises given without a wait"
        return {"name": "none", "replicas_wanted": 0, "refusing": False, "now": now}
    wanted = ReplicasWanted(target.promise, target.waitaof_replicas, time.monotonic)
    wanted.learn(len(replicas))
    return promise_facts(target.promise, wanted.wanted, replicas)


async def known_replicas(url: str) -> int:
    """How many replicas the first Sentinel of ``url`` that answers knows for its set, up or
    down (what a promise ``every-replica`` counts: bus/store/promise.py). StoreError if none
    answers."""
    target = parse_sentinel_url(url)
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
                async with sentinel:
                    return len(await sentinel.sentinel_replicas(target.service))
        except StoreError as exc:
            last = exc
    raise StoreError(f"no Sentinel of {target.service} answers: {last}")


def promise_facts(promise: str, wanted: int, replicas: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``status`` says of the promise in force: its name, the replicas' fsyncs each
    promise waits for, whether it refuses writes now (fewer replicas up), and what it does
    now, in words (``replicas``: :func:`store_topology`'s rows)."""
    down = [r["address"] for r in replicas if r["link"] != "up"]
    refusing = wanted > len(replicas) - len(down)
    if refusing:
        now = (
            f"writes are refused (not durable): {wanted} replica fsync(s) wanted, "
            f"{len(replicas) - len(down)} replica(s) up"
        )
    elif down:
        now = f"promises given with {wanted} replica fsync(s); {', '.join(down)} down"
    else:
        now = f"promises given with {wanted} replica fsync(s)"
    return {"name": promise, "replicas_wanted": wanted, "refusing": refusing, "now": now}


async def _ask(where: TCPLocation, service: str, auth: dict[str, Any]) -> dict[str, Any]:
    sentinel: coredis.Redis[str] = coredis.Redis(
        where.host, where.port, decode_responses=True, **auth
    )
    async with sentinel:
        primary = await sentinel.sentinel_master(service)
        replicas = await sentinel.sentinel_replicas(service)
        others = await sentinel.sentinel_sentinels(service)
    address = f"{primary['ip']!s}:{primary['port']!s}"
    offsets = await _replica_offsets(str(primary["ip"]), int(str(primary["port"])), auth)
    rows = []
    for r in replicas:
        name = f"{r['ip']!s}:{r['port']!s}"
        seen = offsets.get(name, {})
        flags = str(r.get("flags", ""))
        rows.append(
            {
                "address": name,
                "link": "down" if "s_down" in flags or "disconnected" in flags else "up",
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


# A new primary, and an old primary turned into a replica when it comes back.
SWITCH_EVENTS = ("+switch-master", "+convert-to-slave")


# A server the Sentinels see go down or come back (a replica down costs promises: promise.py).
DOWN_EVENTS = ("+sdown", "-sdown")


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
                try:
                    async with sentinel, sentinel.pubsub(channels=list(channels)) as ps:
                        async for message in ps:
                            if message["type"] == "message":
                                await on_switch(f"{message['channel']!s} {message['data']!s}")
                except* anyio.ClosedResourceError:
                    pass  # coredis's pubsub, cancelled as it unsubscribes (the node stopping)
            return
        except StoreError as exc:
            last = exc
    raise StoreError(f"no Sentinel of {target.service} to watch: {last}")

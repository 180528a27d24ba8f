"""What ``hero-node status`` says of a replicated store: its primary, its replicas and their lag,
and the last failover, as the Sentinels and the primary report them."""

from __future__ import annotations

from typing import Any

import coredis
import coredis.exceptions
from coredis.connection import TCPLocation

from bus.errors import StoreError
from bus.store.sentinel import is_sentinel_url, parse_sentinel_url


async def store_topology(url: str) -> dict[str, Any]:
    """``{"mode": "single"}`` for a plain URL; for a ``redis+sentinel://`` one: ``primary``
    (host:port), ``replicas`` (address, link, offset lag in bytes, seconds since their last
    ack), ``sentinels`` (how many the asked one knows, itself included), ``failovers`` (the
    Sentinels' configuration epoch: how many times a primary was elected) and
    ``primary_for_s`` (how long the current primary has been seen as primary). StoreError if
    no Sentinel answers."""
    if not is_sentinel_url(url):
        return {"mode": "single"}
    target = parse_sentinel_url(url)
    auth = {"username": target.username, "password": target.password}
    last: Exception | None = None
    for host, port in target.sentinels:
        try:
            return await _ask(TCPLocation(host, port), target.service, auth)
        except (coredis.exceptions.RedisError, OSError) as exc:
            last = exc
    raise StoreError(f"no Sentinel of {target.service} answers: {last}")


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
        client: coredis.Redis[str] = coredis.Redis(host, port, decode_responses=True, **auth)
        async with client:
            info = await client.info("replication")
    except (coredis.exceptions.RedisError, OSError):
        return {}
    head = int(str(info.get("master_repl_offset", 0)))
    out: dict[str, Any] = {}
    for name, value in info.items():
        if name.startswith("slave") and isinstance(value, dict):
            where = f"{value.get('ip')}:{value.get('port')}"
            offset = int(str(value.get("offset", 0)))
            out[where] = {"lag_bytes": head - offset, "lag_s": int(str(value.get("lag", 0)))}
    return out

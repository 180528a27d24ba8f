"""The ``[store]`` table of config.toml: a replicated store found through Sentinels.

Without it (or with no ``sentinels``) the node runs its embedded single Valkey. With it::

    [store]
    sentinels = ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"]
    service = "hero"
    waitaof_local = 1       # a promise waits for the local fsync of the primary ...
    waitaof_replicas = 1    # ... and of this many replicas (0 and 0: no wait)
    waitaof_timeout_ms = 1000
    promise = "every-replica"  # or "one-replica" (weaker: docs/operate/promise.md)

the node, its CLI and its runner processes connect as the ACL users of node/host/acl.py with
the passwords of the home's ``secrets/`` (the same users exist on every data server and
Sentinel: ``hero-node store-acl`` prints their ACL), through a ``redis+sentinel://`` URL
(bus/store/sentinel.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import tomli_w

from bus.store.promise import EVERY_REPLICA, ONE_REPLICA, PROMISES
from bus.store.sentinel import sentinel_url
from node.errors import ConfigError


@dataclass(frozen=True)
class StoreConfig:
    sentinels: list[str] = field(default_factory=list)  # "host:port" each
    service: str = "hero"
    waitaof_local: int = 1
    waitaof_replicas: int = 1
    waitaof_timeout_ms: int = 1000
    # every-replica: a promise waits for every replica's fsync (bus/store/promise.py)
    promise: str = EVERY_REPLICA

    @property
    def replicated(self) -> bool:
        return bool(self.sentinels)

    def addresses(self) -> list[tuple[str, int]]:
        out = []
        for item in self.sentinels:
            host, _, port = item.rpartition(":")
            out.append((host.strip("[]"), int(port)))
        return out

    def url(self, user: str, password: str) -> str:
        """The ``redis+sentinel://`` URL ``user`` connects with."""
        return sentinel_url(
            self.addresses(),
            self.service,
            user,
            password,
            waitaof=f"{self.waitaof_local},{self.waitaof_replicas}",
            waitaof_timeout_ms=str(self.waitaof_timeout_ms),
            promise=self.promise,
        )

    @property
    def weak_promise(self) -> str | None:
        """The warning a node gives at start when its promises are the weaker kind."""
        if not self.replicated or self.promise != ONE_REPLICA:
            return None
        return (
            '[store] promise = "one-replica": an acknowledged job is on ONE replica; a primary '
            "that stalls and wakes while the Sentinels fail over can confirm writes, then lose "
            "them (docs/operate/promise.md)"
        )


_TYPES: Final = {
    "sentinels": list,
    "service": str,
    "waitaof_local": int,
    "waitaof_replicas": int,
    "waitaof_timeout_ms": int,
    "promise": str,
}


def parse_store(raw: object) -> StoreConfig:
    """The ``[store]`` table; ConfigError names what is wrong."""
    if not isinstance(raw, Mapping):
        raise ConfigError("[store] must be a table")
    unknown = set(raw) - set(_TYPES)
    if unknown:
        raise ConfigError(f"unknown [store] setting(s): {', '.join(sorted(unknown))}")
    for name, kind in _TYPES.items():
        value = raw.get(name)
        if name in raw and (not isinstance(value, kind) or isinstance(value, bool)):
            raise ConfigError(f"[store] {name} has the wrong type ({value!r})")
    store = StoreConfig(**raw)
    for item in store.sentinels:
        host, sep, port = str(item).rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f'[store] sentinels: "host:port" each, got {item!r}')
    if store.waitaof_local not in (0, 1) or store.waitaof_replicas < 0:
        raise ConfigError("[store] waitaof_local is 0 or 1, waitaof_replicas >= 0")
    if store.promise not in PROMISES:
        raise ConfigError(f"[store] promise is one of {', '.join(PROMISES)} ({store.promise!r})")
    if store.waitaof_timeout_ms < 0 or not store.service:
        raise ConfigError("[store] waitaof_timeout_ms >= 0 and a service name")
    return store


def render_store(store: StoreConfig) -> str:
    """The ``[store]`` table ``hero-node init`` writes (commented out for the embedded Valkey)."""
    values = {
        "sentinels": store.sentinels,
        "service": store.service,
        "waitaof_local": store.waitaof_local,
        "waitaof_replicas": store.waitaof_replicas,
        "waitaof_timeout_ms": store.waitaof_timeout_ms,
        "promise": store.promise,
    }
    body = tomli_w.dumps({"store": values})
    note = (
        "# a replicated store: Sentinels that name the primary (empty: the embedded Valkey);\n"
        "# a promise (a link's ack, a submit) is given once WAITAOF confirms its writes fsynced\n"
        "# on the primary (waitaof_local) and on every replica of the set (promise =\n"
        '# "every-replica"; "one-replica": on waitaof_replicas, weaker: docs/operate/promise.md;\n'
        "# docs/operate/replicated-store.md). The ACL users with this home's passwords must\n"
        "# exist on every data server and Sentinel: hero-node store-acl\n"
    )
    return note + body

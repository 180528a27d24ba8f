"""The named operations of bus/store that the blocking client (bus/client/sync.py) takes, on
redis-py, for scripts that do not run trio.

Each runs what its trio flavour runs, read from the same place: the node id is the field
:data:`bus.store.records.NODE_ID_FIELD` of ``node:info`` (:func:`bus.store.records.node_id`),
a submission sends the commands :func:`bus.store.records.message_writes` lists in one MULTI/EXEC
(:func:`bus.store.records.write_messages`), and an answer is the BLPOP of a reply list
(:func:`bus.store.records.pop_reply`). Only the client library differs; its errors become
StoreError here, as :mod:`bus.store.connection` translates coredis's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import redis

from bus.core import keys
from bus.errors import StoreError
from bus.store.records import NODE_ID_FIELD, message_writes

# How redis-py takes the arguments of each verb message_writes lists (coredis takes them as
# they are: a mapping, a list).
_SEND: dict[str, Callable[[Any, str, Any], object]] = {
    "hset": lambda tx, key, fields: tx.hset(key, mapping=fields),
    "lpush": lambda tx, key, values: tx.lpush(key, *values),
}


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except redis.RedisError as exc:
        raise StoreError(f"redis: {exc}") from exc


class BlockingStore:
    """One node's Redis, a redis-py client per DB, opened on first use."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._clients: dict[int, redis.Redis] = {}

    def _db(self, n: int) -> redis.Redis:
        if n not in self._clients:
            self._clients[n] = redis.Redis.from_url(self.url, db=n, decode_responses=True)
        return self._clients[n]

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def node_id(self) -> str | None:
        """The id of the node serving this Redis; None if no node ever ran on it."""
        with _translated():
            found = self._db(keys.ACTORS_DB).hget(keys.NODE_INFO, NODE_ID_FIELD)
        return str(found) if found else None

    def write_messages(
        self, ctx: int, hashes: Sequence[tuple[str, Mapping[str, str]]], pushed: list[str]
    ) -> None:
        """A client's submission: each message hash, then ``pushed`` on ``msg_out``, in one
        transaction."""
        with _translated(), self._db(ctx).pipeline(transaction=True) as tx:
            for verb, key, arg in message_writes(hashes, pushed):
                _SEND[verb](tx, key, arg)
            tx.execute()

    def pop_reply(self, ctx: int, reply: str, timeout_s: float) -> str | None:
        """The oldest answer on a reply list, waiting up to ``timeout_s``; None after that."""
        with _translated():
            popped = self._db(ctx).blpop([reply], timeout=timeout_s)
        return None if popped is None else str(popped[1])

"""The Redis store: one coredis client per DB, object load/save, reliable queues, atomic updates.

Every coredis error is translated into :class:`StoreError` here; nothing above bus/ sees coredis.
Blocking pops take a connection of their own from the pool, so a service waiting on BLMOVE never
delays another's commands.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import coredis
import coredis.exceptions
import trio
from coredis.commands.script import Script
from coredis.tokens import PureToken

from bus import keys
from bus.errors import BusError, ContentError, StoreError
from bus.ids import now
from bus.models import Actor, Context, Hash, decode_hash
from bus.reasons import Reason
from bus.urls import redact

log = logging.getLogger(__name__)

T = TypeVar("T")
Redis = coredis.Redis[str]

# Store the hash and queue its key only if the key is new: deliveries and redeliveries of the
# same message are idempotent. Returns 1 if stored, 0 if it was already there.
_DELIVER_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
redis.call('LPUSH', KEYS[2], KEYS[1])
return 1
"""


MAX_REDELIVERIES = 5

# The hash an entry names ({} if there is none), or the name of the type its key holds instead:
# a reply per entry, so that one entry naming a string or a list costs no other entry of the
# batch (an HGETALL on it would abort the script after it moved the others).
READ_HASH_LUA = """
local function read_hash(v)
  local t = redis.call('TYPE', v)['ok']
  if t == 'hash' then return redis.call('HGETALL', v) end
  if t == 'none' then return {} end
  return t
end
"""

# Move up to ARGV[1] entries from KEYS[1] (source) to KEYS[2] (inflight), oldest first. With
# ARGV[2] == '1' each entry is followed by what READ_HASH_LUA reads of the hash it names:
# {key1, {field, value, ...} | type, ...}
_POP_BATCH = Script(
    script=READ_HASH_LUA
    + """
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local v = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
  if not v then break end
  out[#out + 1] = v
  if ARGV[2] == '1' then out[#out + 1] = read_hash(v) end
end
return out
"""
)

# KEYS: inflight source redeliveries dlq ; ARGV: max now source-name
_RECOVER = Script(
    script="""
local moved = 0
while true do
  local item = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  if not item then break end
  local n = redis.call('HINCRBY', KEYS[3], item, 1)
  if n > tonumber(ARGV[1]) then
    redis.call('LREM', KEYS[2], -1, item)
    redis.call('HDEL', KEYS[3], item)
    redis.call('LPUSH', KEYS[4], cjson.encode({key = item, reason = 'too_many_deliveries',
      detail = 'delivered ' .. n .. ' times without being processed', at = tonumber(ARGV[2]),
      queue = ARGV[3], count = n}))
  else
    moved = moved + 1
  end
end
redis.call('EXPIRE', KEYS[3], 86400)
return moved
"""
)


# KEYS: dlq redeliveries ; ARGV: key
_RETRY_DEAD = Script(
    script="""
local n = 0
for _, raw in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local ok, e = pcall(cjson.decode, raw)
  if ok and e.key == ARGV[1] and e.queue and e.queue ~= '' then
    redis.call('LREM', KEYS[1], 1, raw)
    redis.call('HDEL', KEYS[2], e.key)
    if n == 0 then redis.call('LPUSH', e.queue, e.key) end
    n = n + 1
  end
end
return n
"""
)

_PURGE_DEAD = Script(
    script="""
local n = 0
for _, raw in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local ok, e = pcall(cjson.decode, raw)
  if ok and e.key == ARGV[1] then
    redis.call('LREM', KEYS[1], 1, raw)
    n = n + 1
  end
end
return n
"""
)


def _flat_hash(raw: Any) -> Hash:  # noqa: ANN401 - a Lua reply: flat list (or RESP3 map)
    if isinstance(raw, dict):
        return decode_hash(raw)
    return decode_hash({raw[i]: raw[i + 1] for i in range(0, len(raw), 2)})


# Replies that say the content a command touched is unusable, not that the server failed,
# and the reason each gives the entry that named it.
_CONTENT_ERRORS = {
    "WRONGTYPE": Reason.WRONG_TYPE,
    "not an integer": Reason.NOT_A_NUMBER,
    "overflow": Reason.NOT_A_NUMBER,
    "DB index is out of range": Reason.UNKNOWN_CONTEXT,
}


def _translate(url: str, exc: Exception) -> BusError:
    """The bus error for a coredis or socket error: ContentError when the reply blames what a
    key holds (a service refuses the entry that named it), else StoreError (Redis failed)."""
    text = str(exc)
    if isinstance(exc, coredis.exceptions.WrongTypeError):
        return ContentError(Reason.WRONG_TYPE, printable(text))
    if isinstance(exc, coredis.exceptions.ResponseError):
        for marker, reason in _CONTENT_ERRORS.items():
            if marker in text:
                return ContentError(reason, printable(text))
    return StoreError(f"redis {url}: {exc}")


def printable(value: str | bytes, limit: int = 200) -> str:
    """``value`` as text that always encodes (bytes that are not UTF-8 and lone surrogates
    written as backslash escapes), cut to ``limit`` characters: what a log line or a dlq
    entry may quote of hostile content."""
    if isinstance(value, bytes):
        text = value.decode("utf-8", "backslashreplace")
    else:
        text = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars)"


def _dlq_entry(key: str, reason: str, detail: str, queue: str) -> str:
    """A dead letter as JSON that always serialises (ASCII, surrogates escaped) and stays
    bounded whatever the refused content held."""
    fields = {
        "key": printable(key, 1000),
        "reason": printable(reason),
        "detail": printable(detail, 2000),
    }
    return json.dumps(fields | {"at": now(), "queue": printable(queue, 1000)})


_READ_HASH = Script(script=READ_HASH_LUA + "return read_hash(KEYS[1])")
_READ_HASHES = Script(
    script=READ_HASH_LUA
    + "local out = {}\nfor i, k in ipairs(KEYS) do out[i] = read_hash(k) end\nreturn out"
)


class _NoScript:
    """A pipelined EVALSHA the server did not know (the script did not run)."""


class Store:
    """Access to one Valkey/Redis server; ``await db(n)`` gives the client for DB n.

    coredis wants each client's connection pool entered by a parent task before other tasks
    share it, so every client is opened by a holder task in the store's own nursery.
    """

    def __init__(self, url: str, nursery: trio.Nursery) -> None:
        self.url = redact(url)  # for errors and logs; only the pool sees the password
        self._dial_url = url
        self._nursery = nursery
        self._clients: dict[int, Redis] = {}
        self._open_lock = trio.Lock()
        self._closing = trio.Event()
        self._holders: set[trio.CancelScope] = set()

    async def db(self, n: int) -> Redis:
        client = self._clients.get(n)
        if client is not None:
            return client
        async with self._open_lock:
            if n not in self._clients:
                self._clients[n] = await self._nursery.start(self._hold_client, n)
        return self._clients[n]

    async def _hold_client(self, n: int, *, task_status: trio.TaskStatus[Redis]) -> None:
        """Own DB ``n``'s client until the store closes. Shielded, so that the services the
        store serves can still write (a shutdown requeue, say) while they are being cancelled;
        :func:`open_store` bounds how long that may take."""
        client: Redis = coredis.Redis.from_url(self._dial_url, db=n, decode_responses=True)
        with trio.CancelScope(shield=True) as scope:
            self._holders.add(scope)
            try:
                async with client:
                    task_status.started(client)
                    await self._closing.wait()
            except (coredis.exceptions.RedisError, OSError) as exc:
                raise StoreError(f"redis {self.url} db {n}: {exc}") from exc

    def _close(self, grace_s: float = 5.0) -> None:
        self._closing.set()
        for scope in self._holders:
            scope.deadline = trio.current_time() + grace_s

    # -- generic ---------------------------------------------------------------------------------

    async def call(self, db: int, fn: Callable[[Redis], Awaitable[T]]) -> T:
        """Run one coredis command on DB ``db``, translating its errors."""
        client = await self.db(db)
        try:
            return await fn(client)
        except (coredis.exceptions.RedisError, OSError) as exc:
            raise _translate(self.url, exc) from exc
        except RuntimeError as exc:  # coredis: the pool has exited (the store is closing)
            raise StoreError(f"redis {self.url}: store closed ({exc})") from exc

    @asynccontextmanager
    async def transaction(self, db: int) -> AsyncIterator[Any]:
        """A MULTI/EXEC pipeline on DB ``db``; commands queued inside run atomically on exit."""
        client = await self.db(db)
        try:
            async with client.pipeline(transaction=True) as pipe:
                yield pipe
        except (coredis.exceptions.RedisError, OSError) as exc:
            raise _translate(self.url, exc) from exc

    async def script(self, db: int, script: Script[str], keys: list[str], args: list[str]) -> Any:  # noqa: ANN401
        """Run a Lua script (EVALSHA, loading it on first use) on DB ``db``."""
        return await self.call(db, lambda r: script(keys=keys, args=args, client=r))

    async def scripts(
        self, db: int, calls: list[tuple[Script[str], list[str], list[str]]]
    ) -> list[Any]:
        """Several Lua scripts in one pipelined round trip (not atomic together); results.

        coredis checks ``SCRIPT EXISTS`` before every pipeline that runs a Script (one more
        round trip each time); here the pipeline sends bare EVALSHAs and only the calls that
        come back NOSCRIPT (a fresh or restarted server: nothing of them ran) are loaded and
        run again."""
        client = await self.db(db)
        try:
            results = await self._evalsha_many(client, calls)
            missing = [i for i, r in enumerate(results) if isinstance(r, _NoScript)]
            if missing:
                for script in {calls[i][0] for i in missing}:
                    await client.script_load(script.script)
                retried = await self._evalsha_many(client, [calls[i] for i in missing])
                for i, r in zip(missing, retried, strict=True):
                    if isinstance(r, _NoScript):
                        raise StoreError(f"redis {self.url}: script still missing after load")
                    results[i] = r
            return results
        except (coredis.exceptions.RedisError, OSError) as exc:
            raise _translate(self.url, exc) from exc

    @staticmethod
    async def _evalsha_many(
        client: Redis, calls: list[tuple[Script[str], list[str], list[str]]]
    ) -> list[Any]:
        async with client.pipeline(transaction=False, raise_on_error=False) as pipe:
            pending: list[Any] = [pipe.evalsha(s.sha, keys=k, args=a) for s, k, a in calls]
        out: list[Any] = []
        for p in pending:
            try:
                out.append(await p)
            except coredis.exceptions.NoScriptError:
                out.append(_NoScript())
        return out

    async def ping(self) -> None:
        await self.call(0, lambda r: r.ping())

    async def hgetall(self, db: int, key: str) -> Hash:
        raw = await self.call(db, lambda r: r.hgetall(key))
        return decode_hash(raw)

    async def hset(self, db: int, key: str, fields: Mapping[str, str]) -> None:
        await self.call(db, lambda r: r.hset(key, dict(fields)))

    async def lpush(self, db: int, key: str, *values: str) -> None:
        await self.call(db, lambda r: r.lpush(key, list(values)))

    async def lrange(self, db: int, key: str) -> list[str]:
        return list(await self.call(db, lambda r: r.lrange(key, 0, -1)))

    async def llen(self, db: int, key: str) -> int:
        return int(await self.call(db, lambda r: r.llen(key)))

    async def exists(self, db: int, key: str) -> bool:
        return bool(await self.call(db, lambda r: r.exists([key])))

    # -- reliable queues -------------------------------------------------------------------------

    async def pop_reliable(
        self, db: int, source: str, inflight: str, timeout_s: float
    ) -> str | None:
        """BLMOVE the oldest entry of ``source`` onto ``inflight``; None after timeout_s, or
        when the entry was not UTF-8 (it is dead-lettered: no key of this bus is such).

        The entry stays in ``inflight`` until :meth:`ack` removes it, so a crash between pop and
        ack leaves it recoverable by :meth:`recover`.
        """
        value = await self.call(
            db, lambda r: r.blmove(source, inflight, PureToken.RIGHT, PureToken.LEFT, timeout_s)
        )
        return None if value is None else await self.utf8_entry(db, inflight, value, source)

    async def utf8_entry(self, db: int, inflight: str, value: object, queue: str) -> str | None:
        """A popped entry as text; None if it is not UTF-8 (coredis then hands over its bytes):
        refused with reason ``not_utf8``."""
        if not isinstance(value, bytes):
            return str(value)
        detail = "the entry is not UTF-8 text"
        await self.refuse_entry(db, inflight, value, Reason.NOT_UTF8, detail, queue=queue)
        return None

    async def pop_batch(self, db: int, source: str, inflight: str, limit: int) -> list[str]:
        """Move up to ``limit`` entries already queued on ``source`` to ``inflight`` (one round
        trip; the batching partner of a blocking :meth:`pop_reliable`)."""
        if limit <= 0:
            return []
        moved = await self.script(db, _POP_BATCH, [source, inflight], [str(limit), "0"])
        texts = [await self.utf8_entry(db, inflight, v, source) for v in moved]
        return [t for t in texts if t is not None]

    async def pop_read(
        self, db: int, source: str, inflight: str, limit: int, timeout_s: float
    ) -> list[tuple[str, Hash]]:
        """Move up to ``limit`` entries of ``source`` to ``inflight`` and read the hash each one
        names: what is queued already in one round trip (entries and hashes in one Lua call);
        only when ``source`` is empty a blocking :meth:`pop_reliable` (up to ``timeout_s``),
        whose entry is read at once. [] after the timeout."""
        raw = await self.script(db, _POP_BATCH, [source, inflight], [str(limit), "1"])
        if not raw:
            first = await self.pop_reliable(db, source, inflight, timeout_s)
            if first is None:
                return []
            raw = [first, await self.script(db, _READ_HASH, [first], [])]
        out: list[tuple[str, Hash]] = []
        for value, read in zip(raw[::2], raw[1::2], strict=True):
            if await self.utf8_entry(db, inflight, value, source) is None:
                continue
            if isinstance(read, str | bytes):
                detail = f"{printable(value)} holds a {printable(read)}, not a hash"
                await self.refuse_entry(
                    db, inflight, value, Reason.WRONG_TYPE, detail, queue=source
                )
            else:
                out.append((str(value), _flat_hash(read)))
        return out

    async def refuse_entry(
        self, db: int, inflight: str, value: str | bytes, reason: str, detail: str, *, queue: str
    ) -> None:
        """Dead-letter one popped entry that cannot be used (its key holds no hash, it is not
        UTF-8, ...) and take it off ``inflight`` (by its exact bytes), in one transaction;
        logged. A retry (``dlq retry``) sends it back to ``queue``."""
        key = printable(value, 1000)
        log.warning(
            "refused entry %s of %s (db %d): %s: %s", printable(key), queue, db, reason, detail
        )
        async with self.transaction(db) as tx:
            tx.lpush(keys.DLQ, [_dlq_entry(key, reason, detail, queue)])
            tx.lrem(inflight, 1, value)

    async def read_hashes(self, db: int, hash_keys: list[str]) -> list[Hash | str]:
        """Each hash of ``hash_keys`` ({} if absent), or in its place the name of the type
        its key holds instead (READ_HASH_LUA), in one round trip: one key of the wrong type
        costs the others nothing."""
        raw = await self.script(db, _READ_HASHES, hash_keys, [])
        return [
            r.decode() if isinstance(r, bytes) else r if isinstance(r, str) else _flat_hash(r)
            for r in raw
        ]

    async def hgetall_many(self, db: int, hash_keys: list[str]) -> list[Hash]:
        """HGETALL of several hashes in one pipelined round trip."""
        client = await self.db(db)
        try:
            async with client.pipeline(transaction=False) as pipe:
                pending = [pipe.hgetall(k) for k in hash_keys]
            return [decode_hash(await p) for p in pending]
        except (coredis.exceptions.RedisError, OSError) as exc:
            raise _translate(self.url, exc) from exc

    async def exists_many(self, db: int, names: list[str]) -> list[bool]:
        """EXISTS of each key, in one pipelined round trip."""
        client = await self.db(db)
        try:
            async with client.pipeline(transaction=False) as pipe:
                pending = [pipe.exists([k]) for k in names]
            return [bool(await p) for p in pending]
        except (coredis.exceptions.RedisError, OSError) as exc:
            raise _translate(self.url, exc) from exc

    async def ack(self, db: int, inflight: str, value: str) -> None:
        await self.call(db, lambda r: r.lrem(inflight, 1, value))

    async def recover(
        self, db: int, inflight: str, source: str, *, max_redeliveries: int = MAX_REDELIVERIES
    ) -> int:
        """Move what a previous run left in ``inflight`` back to the consuming end of ``source``.

        Every such entry was delivered and never finished: a message that keeps killing its
        consumer would loop forever, so past ``max_redeliveries`` it goes to ``dlq`` instead
        (reason ``too_many_deliveries``). Returns how many entries were requeued.
        """
        args = [str(max_redeliveries), str(now()), source]
        moved = await self.script(
            db, _RECOVER, [inflight, source, keys.REDELIVERIES, keys.DLQ], args
        )
        if moved:
            log.info("recovered %d in-flight entries of %s (db %d)", moved, source, db)
        return int(moved)

    async def deliver(
        self, db: int, message_key: str, fields: Mapping[str, str], queue: str
    ) -> bool:
        """Store a message hash and queue its key unless it is already here (idempotent)."""
        args = [x for kv in fields.items() for x in kv]
        result = await self.call(db, lambda r: r.eval(_DELIVER_LUA, [message_key, queue], args))
        return bool(result)

    async def dead_letter(
        self, db: int, key: str, reason: str, detail: str = "", *, queue: str = ""
    ) -> None:
        """Record why ``key`` was refused; ``queue`` is where a retry would send it back."""
        await self.lpush(db, keys.DLQ, _dlq_entry(key, reason, detail, queue))

    async def dead_letters(self, db: int) -> list[dict[str, Any]]:
        """The dead letters of DB ``db``, newest first."""
        return [json.loads(e) for e in await self.lrange(db, keys.DLQ)]

    async def retry_dead_letter(self, db: int, key: str) -> int:
        """Re-drive ``key``: its dead letters leave the dlq and it is queued again where it
        was refused. Returns how many entries were re-driven (0: none, or not re-drivable)."""
        return int(await self.script(db, _RETRY_DEAD, [keys.DLQ, keys.REDELIVERIES], [key]))

    async def purge_dead_letters(self, db: int, key: str | None = None) -> int:
        """Delete the dead letters of ``key`` (all of them if None); how many went."""
        if key is None:
            count = await self.llen(db, keys.DLQ)
            await self.call(db, lambda r: r.delete([keys.DLQ]))
            return count
        return int(await self.script(db, _PURGE_DEAD, [keys.DLQ], [key]))

    # -- expiry events (keyspace notifications) --------------------------------------------------

    async def enable_expired_events(self) -> bool:
        """Make the server publish expired-key events (``notify-keyspace-events`` gains ``Ex``,
        keeping what is set). False if the server refuses CONFIG (a managed Redis); StoreError
        if it cannot be reached."""
        client = await self.db(keys.ACTORS_DB)
        try:
            current = await client.config_get(["notify-keyspace-events"])
            flags = str(next(iter(current.values()), "") or "")
            if "E" in flags and ("x" in flags or "A" in flags):
                return True
            merged = "".join(sorted(set(flags) | {"E", "x"}))
            await client.config_set({"notify-keyspace-events": merged})
            return True
        except coredis.exceptions.ResponseError as exc:
            log.warning("redis %s refuses keyspace notifications: %s", self.url, exc)
            return False
        except (coredis.exceptions.RedisError, OSError) as exc:
            raise _translate(self.url, exc) from exc

    async def watch_expired(
        self,
        db: int,
        on_key: Callable[[str], Awaitable[None]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call ``on_key`` with each key of DB ``db`` that expires (needs
        :meth:`enable_expired_events`); reports started once subscribed. Runs until cancelled;
        StoreError if Redis fails. Events are not durable: a subscriber that reconnects misses
        what expired meanwhile, so callers pair this with a sweep."""
        client = await self.db(db)
        channel = f"__keyevent@{db}__:expired"
        try:
            async with client.pubsub(channels=[channel], ignore_subscribe_messages=True) as ps:
                task_status.started()
                async for message in ps:
                    if message["type"] == "message":
                        await on_key(str(message["data"]))
        except (coredis.exceptions.RedisError, OSError) as exc:
            raise _translate(self.url, exc) from exc

    # -- registry objects ------------------------------------------------------------------------

    async def get_actor(self, actor_id: int) -> Actor | None:
        h = await self.hgetall(keys.ACTORS_DB, keys.actor(actor_id))
        return Actor.from_hash(h) if h else None

    async def put_actor(self, actor: Actor) -> None:
        await self.hset(keys.ACTORS_DB, keys.actor(actor.id), actor.to_hash())

    async def get_context(self, context_id: int) -> Context | None:
        h = await self.hgetall(context_id, keys.context(context_id))
        return Context.from_hash(h) if h else None

    async def put_context(self, context: Context) -> None:
        """Save a context in its own DB and announce it so a running node starts serving it."""
        if context.id < 1:
            raise StoreError("context ids start at 1 (DB 0 holds actors and peers)")
        await self.hset(context.id, keys.context(context.id), context.to_hash())
        async with self.transaction(keys.ACTORS_DB) as pipe:
            pipe.sadd(keys.CONTEXTS, [str(context.id)])
            pipe.lpush(keys.NODE_EVENTS, [keys.context(context.id)])

    async def context_ids(self) -> list[int]:
        members = await self.call(keys.ACTORS_DB, lambda r: r.smembers(keys.CONTEXTS))
        return sorted(int(m) for m in members)


@asynccontextmanager
async def open_store(url: str) -> AsyncIterator[Store]:
    """A connected store; raises StoreError if the server does not answer."""
    async with trio.open_nursery() as nursery:
        store = Store(url, nursery)
        try:
            await store.ping()
            yield store
        finally:
            store._close()

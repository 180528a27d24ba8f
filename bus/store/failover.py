"""Dialling the store, and riding out a Sentinel failover.

:func:`dial` opens the coredis client of one DB: the URL's server itself, or, for a
``redis+sentinel://`` URL (bus/store/sentinel.py), whichever server the Sentinels name primary
when a connection is made (coredis's ``Sentinel.primary_for``: a new connection asks them again,
checks ``ROLE`` and drops the pool's old connections once the primary moved).

While a primary dies and a replica is promoted (``down-after-milliseconds`` plus the election:
about 2-3 s), commands fail. :class:`Failover` sends a command again only when that cannot
make it run twice:

- the failure proves it did not run: no connection could be made, the Sentinels named no
  primary yet, the server named is no primary (``READONLY``, a stale ``ROLE``), or refused
  it before running it (``NOREPLICAS`` under ``min-replicas-to-write``, ``MASTERDOWN``,
  ``LOADING``);
- or the command is idempotent (a read), when its connection was cut after it was sent.

Anything else (a write or a script whose reply was lost with its connection) is reported as
the StoreError it becomes: the caller's own recovery (reliable queues, fenced attempts, the
outbox's re-sending) decides, as after any Valkey restart.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import coredis
import coredis.exceptions as cx
import trio
from coredis.connection import TCPLocation

from bus.store.sentinel import is_sentinel_url, parse_sentinel_url

log = logging.getLogger(__name__)

T = TypeVar("T")

FAILOVER_WAIT_S = 30.0  # longest a command waits for a new primary (an election takes ~3 s)
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0

# Replies a server gives before running a command, when it cannot take writes now, and
# coredis' classes of those it knows (a ReadOnlyError's text has lost its "READONLY").
_REFUSED_BEFORE_RUNNING = ("READONLY", "NOREPLICAS", "MASTERDOWN", "LOADING", "TRYAGAIN")
_REFUSED = cx.PrimaryNotFoundError | cx.StalePrimaryError | cx.BusyLoadingError | cx.ReadOnlyError


def _reply(exc: BaseException) -> str:
    """The server's reply in ``exc``; for a pipelined command coredis prefixes it with
    "Command # N (...) of pipeline caused error: " (a MULTI/EXEC refused by one command ran
    none of them)."""
    return str(exc).rpartition("caused error: ")[2]


def _not_run(exc: BaseException) -> bool:
    """Whether ``exc`` proves the command never ran."""
    if isinstance(exc, _REFUSED):
        return True
    if isinstance(exc, cx.ConnectionError):
        return _reply(exc).startswith("Unable to establish a connection")
    if isinstance(exc, cx.ResponseError):
        return _reply(exc).startswith(_REFUSED_BEFORE_RUNNING)
    return False


def _cut(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection lost mid-command (the command may have run)."""
    return isinstance(exc, cx.ConnectionError | TimeoutError | ConnectionResetError)


def _stale(exc: BaseException) -> bool:
    """A connection that still reaches a demoted primary, or an old one that woke up cut off
    from its replicas (``NOREPLICAS``: the Sentinels take up to 10 s more to demote it): the
    pool must ask the Sentinels where the primary is now."""
    return isinstance(exc, cx.ReadOnlyError | cx.StalePrimaryError) or (
        isinstance(exc, cx.ResponseError) and _reply(exc).startswith(("READONLY", "NOREPLICAS"))
    )


class Failover:
    """The retry policy of a store behind Sentinels (``wait_s``: how long a command waits for
    a primary, on trio's clock; ``leave``: drops the store's connections to a server that is
    no longer the primary, so the next ones ask the Sentinels)."""

    def __init__(
        self, leave: Callable[[], None] = lambda: None, wait_s: float = FAILOVER_WAIT_S
    ) -> None:
        self.leave = leave
        self.wait_s = wait_s
        self.retried = 0  # commands sent again (for tests and the log)
        # grows with every sign of a failover (an error handled here, a pool dropped): a
        # promise whose writes and barrier did not all happen in one epoch is not given
        self.epoch = 0
        self.wakes: list[Callable[[], None]] = []  # called each time the epoch grows

    def grow(self) -> None:
        """A sign of a failover: the epoch grows, and every one of :attr:`wakes` is called."""
        self.epoch += 1
        for wake in list(self.wakes):
            wake()

    def noticed(self, exc: BaseException) -> None:
        """Count a failure that a failover may explain (the epoch grows), and leave the old
        primary when ``exc`` shows a connection reaches a server that is no longer one."""
        if _not_run(exc) or _cut(exc):
            self.grow()
        if _stale(exc):
            self.leave()

    async def retrying(
        self,
        fn: Callable[[], Awaitable[T]],
        *,
        idempotent: bool = False,
    ) -> T:
        deadline = trio.current_time() + self.wait_s
        delay = BACKOFF_MIN_S
        while True:
            try:
                return await fn()
            except (cx.RedisError, OSError) as exc:
                self.noticed(exc)
                if not (_not_run(exc) or (idempotent and _cut(exc))):
                    raise
                if trio.current_time() + delay > deadline:
                    raise
                if self.retried % 50 == 0:
                    log.warning("store failing over (%s); sending the command again", exc)
                self.retried += 1
            await trio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)


@asynccontextmanager
async def dial(url: str, db: int) -> AsyncIterator[coredis.Redis[str]]:
    """The client of DB ``db`` at ``url``, open for the block."""
    if not is_sentinel_url(url):
        async with coredis.Redis.from_url(url, db=db, decode_responses=True) as plain:
            yield plain
        return
    target = parse_sentinel_url(url)
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    sentinels = coredis.Sentinel(
        [TCPLocation(host, port) for host, port in target.sentinels],
        sentinel_kwargs={**auth, "decode_responses": True},
        decode_responses=True,
        **auth,
    )
    async with sentinels:
        primary = sentinels.primary_for(target.service, db=db)
        async with primary:
            yield primary

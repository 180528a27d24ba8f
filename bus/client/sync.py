"""A blocking client for scripts that do not run trio: submit jobs, wait for their results.

It runs the same plan as the trio client (bus/core/submission.py: the same signed messages, one
MULTI/EXEC per submitted batch) on a redis-py connection, and each message is answered on its
own ``reply:<message key>`` list (a blocking script waits for one message at a time, so the
shared inbox of the trio client would buy it nothing). Registrations, flows and logs stay with
the trio client (:mod:`bus.client.api`), and so does a replicated store (a Sentinel URL): this
client neither follows a failover nor waits for a write to be durable on two machines::

    with open_sync_client(url) as client:
        [message] = client.submit_many(key, 42, to="self", context_id=2, jobs=[job])
        [result] = client.wait_results(message, timeout_s=30)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from bus.core import keys, spans
from bus.core.envelope import JobResult, parse_reply
from bus.core.models import Message, RunnerJob
from bus.core.submission import job_messages, write_plan
from bus.errors import ClientError
from bus.store.blocking import BlockingStore
from crypto import Signer


class SyncClient:
    """Submissions and results on one node's Redis, blocking. Its methods raise ClientError for
    a request that cannot be carried out and StoreError when Redis fails."""

    def __init__(self, redis_url: str) -> None:
        self.url = redis_url
        self.store = BlockingStore(redis_url)
        self._node_id = ""

    def close(self) -> None:
        self.store.close()

    def node_id(self) -> str:
        """The id of the node serving this Redis; ClientError if no node ever ran on it."""
        if not self._node_id:
            found = self.store.node_id()
            if not found:
                raise ClientError("no hero-node has run on this Redis yet (no node:info)")
            self._node_id = found
        return self._node_id

    def submit_many(
        self,
        signer: Signer,
        caller_id: int,
        *,
        to: str,
        context_id: int,
        jobs: Iterable[RunnerJob | Sequence[RunnerJob]],
        timeout_s: int = 60,
        timeout_ack_s: int = 120,
        timeout_result_s: int = 3600,
    ) -> list[Message]:
        """Sign and queue one message per item of ``jobs`` for node ``to`` (its 64-hex id, or
        ``self``), one transaction per batch; the messages in order, for :meth:`wait_results`."""
        origin = self.node_id()
        if to == "self":
            to = origin
        if len(to) != 64:
            raise ClientError(f"node {to[:80]!r}: give its 64-hex id or 'self'")
        traceparent, tracestate = spans.outgoing_trace(None)
        messages = job_messages(
            signer,
            caller_id,
            origin=origin,
            to=to,
            context_id=context_id,
            jobs=jobs,
            timeout_s=timeout_s,
            timeout_ack_s=timeout_ack_s,
            timeout_result_s=timeout_result_s,
            reply_to="",
            traceparent=traceparent,
            tracestate=tracestate,
        )
        for write in write_plan(messages):
            self.store.write_messages(context_id, write.hashes, write.pushed)
        return messages

    def wait_results(self, message: Message, timeout_s: float) -> list[JobResult]:
        """One result per job of ``message``; ClientError after ``timeout_s``."""
        reply_key = keys.reply(message.key)
        results: list[JobResult] = []
        while len(results) < len(message.job):
            popped = self.store.pop_reply(message.context_id, reply_key, timeout_s)
            if popped is None:
                raise ClientError(f"no result for {message.key} within {timeout_s:g} s")
            try:
                results.append(parse_reply(popped)[1])
            except ValueError as exc:
                raise ClientError(f"{reply_key}: {exc}") from None
        return results


@contextmanager
def open_sync_client(redis_url: str) -> Iterator[SyncClient]:
    """A :class:`SyncClient` on ``redis_url``, closed on exit."""
    client = SyncClient(redis_url)
    try:
        yield client
    finally:
        client.close()

"""The trio client API: register actors, contexts and peers on a node; submit jobs; await results.

A client talks to its node's Redis, as the spec's actors do (step 1, "Publish"): it writes the
signed message, which embeds its jobs, into the context DB, pushes the message key on
``msg_out``, and waits on the dedicated ``reply:<message key>`` list (BLPOP, no polling) for the
results; a client opened with an ``inbox`` names it in each message (signed ``reply_to``) and
pops the answers to all its messages from that one list, in batches (bus/client/inbox.py).
The job hashes are written by the node: where a job runs when it is materialised, and the
origin's copy when the supervisor routes the message to a peer. Until then a job is
found through its message (:meth:`Client.job_fields`).

Concurrent submissions on one client are group-committed: whoever finds no write in progress
writes everything queued meanwhile in one transaction; the others wait for the write that
carries theirs (a lone caller writes at once).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import trio

from bus.client.inbox import ReplyInbox
from bus.core import keys, spans
from bus.core.dag import FlowError, FlowSpec, parse_flow, validate_flow
from bus.core.envelope import JobResult, parse_reply, sign_message
from bus.core.flows import DEFAULT_FLOW_TTL_S, FlowDoc, FlowState, job_state, sign_flow
from bus.core.ids import new_id, new_nonce, now
from bus.core.models import (
    Actor,
    Context,
    Flow,
    JobStatus,
    Message,
    MessageStatus,
    MessageType,
    Peer,
    RunnerJob,
    check_retry_policy,
)
from bus.core.noderefs import KnownNode, pick_node
from bus.core.submission import job_messages, write_plan
from bus.core.tracecontext import message_trace
from bus.core.urls import check_link_url
from bus.errors import BusError, ClientError, ContentError, StoreError
from bus.store import records
from bus.store.connection import Store, open_store
from crypto import ALGORITHM_ED25519, Signer, parse_public_key, parse_public_key_for
from crypto.errors import KeyFormatError

# The supervisor's processing list (node/intake/supervisor.py SERVICE): a message popped from
# msg_out waits there until it is routed.
SUPERVISOR_INFLIGHT = keys.inflight("supervisor")


@dataclass(eq=False)
class _Batch:
    """Messages of one context waiting to be written together (group commit)."""

    messages: list[Message] = field(default_factory=list)
    taken: bool = False  # a flusher is writing (or wrote) it: nothing more may join
    error: BaseException | None = None
    done: trio.Event = field(default_factory=trio.Event)  # written and durable, or failed


def new_job(
    caller_id: int,
    context_id: int,
    script_type: str,
    script: str,
    *,
    env_vars: Mapping[str, str] | None = None,
    timeout_s: int = 60,
    retries: int = 0,
    retry_on: Sequence[str] = (),
    backoff: str = "",
    backoff_ms: int = 0,
) -> RunnerJob:
    """A job with a fresh id, for :meth:`Client.submit` and :meth:`Client.submit_many`.

    ``retries`` failed attempts are run again; ``retry_on`` limits that to these causes
    (``timeout``, ``runner_lost``, ``exit:<code>``, ``exit:any``; others fail at once), after an
    ``exponential`` (default) or ``linear`` ``backoff`` from ``backoff_ms`` (default 500).
    Raises ModelError for a policy the node would refuse."""
    check_retry_policy(list(retry_on), backoff, backoff_ms)
    stamp = now()
    return RunnerJob(
        id=new_id(),
        caller_id=caller_id,
        context_id=context_id,
        script=script,
        script_type=script_type,
        timeout=timeout_s,
        retries=retries,
        env_vars=dict(env_vars or {}),
        created_at=stamp,
        updated_at=stamp,
        retry_on=list(retry_on),
        backoff=backoff,
        backoff_ms=backoff_ms,
    )


class Client:
    """The client API on one node's Redis: registrations, submissions, results, flows and logs.

    Open one with :func:`open_client`; one client may serve many concurrent tasks (their writes
    are group-committed). Its methods raise ClientError for a request that cannot be carried out
    and StoreError when Redis fails. With an ``inbox`` name (see
    :func:`bus.client.inbox.new_inbox_name`)
    its messages ask for their answers there, popped in batches; ClientError for a bad name."""

    def __init__(self, store: Store, *, inbox: str = "") -> None:
        self.store = store
        if inbox and keys.inbox_name_problem(inbox):
            raise ClientError(f"inbox {inbox[:80]!r}: {keys.inbox_name_problem(inbox)}")
        self.inbox = inbox
        self._replies = ReplyInbox(store)
        self._node_id: str | None = None
        self._open: dict[int, _Batch] = {}  # per context DB: the batch new writes join
        self._write_locks: dict[int, trio.Lock] = {}
        self._arriving = 0  # submissions reading what they need before they join a batch

    async def node_id(self) -> str:
        """The id of the node serving this Redis; ClientError if no node ever ran on it."""
        if self._node_id is None:
            found = await records.node_id(self.store)
            if not found:
                raise ClientError("no hero-node has run on this Redis yet (no node:info)")
            self._node_id = found
        return self._node_id

    # -- registry --------------------------------------------------------------------------------

    async def register_actor(
        self,
        actor_id: int,
        pubkey: str,
        address: Iterable[str] = (),
        *,
        algorithm: str = ALGORITHM_ED25519,
    ) -> Actor:
        """Register (or replace) ``actor_id``'s public key of ``algorithm`` (``ed25519`` or
        ``secp256k1``, compressed); ClientError if the key is not valid for it."""
        try:
            parse_public_key_for(algorithm, pubkey)
        except KeyFormatError as exc:
            raise ClientError(f"actor {actor_id}: {exc}") from exc
        stamp = now()
        actor = Actor(actor_id, pubkey.lower(), list(address), stamp, stamp, algorithm)
        await self.store.put_actor(actor)
        return actor

    async def register_context(
        self,
        context_id: int,
        *,
        admins: Iterable[int] = (),
        executors: Iterable[int] = (),
        readers: Iterable[int] = (),
    ) -> Context:
        if context_id < 1:
            raise ClientError("context ids start at 1 (DB 0 holds actors and peers)")
        context = Context(
            context_id,
            sorted(set(admins)),
            sorted(set(readers)),
            sorted(set(executors)),
            created_at=now(),
            updated_at=now(),
        )
        await self.store.put_context(context)
        return context

    async def add_peer(self, node_id: str, address: str = "", name: str = "") -> Peer:
        try:
            parse_public_key(node_id)
        except KeyFormatError as exc:
            raise ClientError(f"peer {node_id[:16]}…: {exc}") from exc
        try:
            check_link_url(address)
        except ValueError as exc:
            raise ClientError(f"peer {node_id[:16]}…: {exc}") from None
        peer = Peer(node_id.lower(), address, name, created_at=now(), updated_at=now())
        await records.put_peer(self.store, peer)
        return peer

    async def peers(self) -> list[Peer]:
        ids = await records.peer_ids(self.store)
        found = [await records.read_peer(self.store, i) for i in sorted(ids)]
        return [Peer.from_hash(h) for h in found if h]

    async def resolve_node(self, ref: str) -> str:
        """A node id from 'self', a full id, a name (this node's or a peer's) or an id prefix
        of at least 8 hex digits: the rule of bus/core/noderefs.py. ClientError if it names
        no node or several."""
        own_id = await self.node_id()  # cached: a local submit reads nothing more
        if ref in ("self", "local", own_id):
            return own_id
        info = await records.node_info(self.store)
        own = KnownNode(own_id, info.get("name", ""))
        peers = [KnownNode(p.id, p.name) for p in await self.peers()]
        return pick_node(ref, own, peers)

    # -- jobs ------------------------------------------------------------------------------------

    async def submit_job(
        self,
        signer: Signer,
        caller_id: int,
        *,
        to: str,
        context_id: int,
        script_type: str,
        script: str,
        env_vars: Mapping[str, str] | None = None,
        timeout_s: int = 60,
        retries: int = 0,
        timeout_ack_s: int = 120,
        timeout_result_s: int = 3600,
    ) -> Message:
        """Sign and queue a one-job message for node ``to``; returns the message.

        ``timeout_s`` bounds one run of the script; a remote node that does not acknowledge the
        message within ``timeout_ack_s``, or answer within ``timeout_result_s``, fails it.
        Raises ClientError for an unknown node, StoreError if the write failed."""
        job = new_job(
            caller_id,
            context_id,
            script_type,
            script,
            env_vars=env_vars,
            timeout_s=timeout_s,
            retries=retries,
        )
        [message] = await self.submit_many(
            signer,
            caller_id,
            to=to,
            context_id=context_id,
            jobs=[job],
            timeout_s=timeout_s,
            timeout_ack_s=timeout_ack_s,
            timeout_result_s=timeout_result_s,
        )
        return message

    async def submit(
        self,
        signer: Signer,
        caller_id: int,
        *,
        to: str,
        context_id: int,
        jobs: list[RunnerJob],
        timeout_s: int = 60,
        timeout_ack_s: int = 120,
        timeout_result_s: int = 3600,
    ) -> Message:
        """Sign and queue one message carrying ``jobs`` for node ``to``; returns the message.
        Raises ClientError for an unknown node, StoreError if the write failed."""
        [message] = await self.submit_many(
            signer,
            caller_id,
            to=to,
            context_id=context_id,
            jobs=[jobs],
            timeout_s=timeout_s,
            timeout_ack_s=timeout_ack_s,
            timeout_result_s=timeout_result_s,
        )
        return message

    async def submit_many(
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
        """Sign and queue one message per item of ``jobs`` (a job, or the jobs one message
        carries; see :func:`new_job`) for node ``to``, written together (one transaction per
        512 messages); returns the messages in order, each to be awaited with
        :meth:`wait_results`. Raises ClientError for an unknown node or an empty message,
        StoreError if the write failed (then none of a chunk's messages was queued)."""
        self._arriving += 1  # until it joins a batch (no await after this block): _publish
        try:
            origin = await self.node_id()
            if len(to) != 64:  # not a node id: 'self', a peer name or an id prefix
                to = await self.resolve_node(to)
        finally:
            self._arriving -= 1
        span = _producer_span("submit", context_id, caller_id)
        traceparent, tracestate = spans.outgoing_trace(span)
        try:
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
                reply_to=self.inbox,
                traceparent=traceparent,
                tracestate=tracestate,
            )
            if messages:
                await self._publish(context_id, messages)
        except BaseException as exc:
            spans.end(span, "failed", type(exc).__name__)
            raise
        if span is not None:
            spans.end(span, "queued", attributes=_carried(messages))
        return messages

    async def _publish(self, context_id: int, messages: list[Message]) -> None:
        """Write ``messages`` and push their keys on ``msg_out`` (spec step 1), group-committed
        with the concurrent calls on this context: they join the open batch; whoever then holds
        the write lock and finds its batch not yet taken writes the whole batch. Raises the
        write's error in every caller whose batch failed (StoreError for a Redis failure)."""
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller queues nothing
        batch = self._open.get(context_id) or self._open.setdefault(context_id, _Batch())
        batch.messages.extend(messages)
        lock = self._write_locks.get(context_id) or self._write_locks.setdefault(
            context_id, trio.Lock()
        )
        if lock.locked() or self._arriving:
            try:  # wait for the write in progress, or let those on their way join ours first
                await lock.acquire()
            except BaseException:  # cancelled before any write took it: withdraw ours
                if not batch.taken:
                    ours = {id(m) for m in messages}
                    batch.messages[:] = [m for m in batch.messages if id(m) not in ours]
                raise
        else:  # a lone submission: written now, without lock.acquire's scheduler pass
            lock.acquire_nowait()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                lock.release()

        try:
            if not batch.taken:
                batch.taken = True
                if self._open.get(context_id) is batch:
                    del self._open[context_id]
                try:  # the lock goes once the write is answered: the next batch is written
                    # while this one waits to be durable (its WAITAOF covers both)
                    await self._write(context_id, batch.messages, written=release)
                except BaseException as exc:
                    batch.error = exc
                    raise
                finally:
                    batch.done.set()
                return
        finally:
            release()
        await batch.done.wait()
        if batch.error is not None:  # written by another caller, and that write failed
            err = batch.error
            what = f"the write carrying {messages[0].key} failed"
            if isinstance(err, StoreError):
                raise StoreError(f"{what}: {err}") from err
            raise ClientError(f"{what}: {err!r}") from err

    async def _write(
        self, context_id: int, messages: list[Message], written: Callable[[], None]
    ) -> None:
        """Write ``messages``; ``written`` is called once the writes are answered (before the
        wait for them to be durable, on a replicated store)."""
        epoch = self.store.epoch  # a failover during the writes voids the promise
        plan = write_plan(messages)
        for i, write in enumerate(plan, 1):
            # a submit returns once its messages are durable (a replicated store: fsynced on
            # the primary and a replica), confirmed on the connection of its last write, which
            # covers the earlier ones; else its caller is told (StoreError), as for a failed write
            durable_since = epoch if i == len(plan) else None
            try:  # sent again if a failover refused it unrun (Store.transact)
                await records.write_messages(
                    self.store,
                    context_id,
                    write.hashes,
                    write.pushed,
                    durable_since=durable_since,
                    written=written,
                )
            except ContentError as exc:  # msg_out (or a key) of another type: the write failed
                raise StoreError(f"redis {self.store.url}: {exc}") from exc
        written()

    async def stop_job(
        self, signer: Signer, caller_id: int, job_key: str, context_id: int
    ) -> Message:
        """Send a signed stop request for ``job_key`` to the node that runs it; the job ends in
        ``error`` with reason ``stopped`` and its waiting client is answered as usual."""
        job = await self.job_fields(context_id, job_key)
        if not job:
            raise ClientError(f"no job {job_key} in context {context_id}")
        request = await records.read_message(self.store, context_id, job.get("message_key", ""))
        origin = await self.node_id()
        body = json.dumps({"job_key": job_key, "request": job.get("message_key", "")})
        # the stop joins the job's trace: the request's own context when it has a valid one
        traceparent, tracestate = _request_trace(request)
        message = sign_message(
            Message(
                id=new_id(),
                caller_id=caller_id,
                context_id=context_id,
                message=body,
                message_type=MessageType.STOP,
                created_at=now(),
                updated_at=now(),
                origin=origin,
                destination=request.get("destination") or origin,
                nonce=new_nonce(),
                traceparent=traceparent,
                tracestate=tracestate,
            ),
            signer,
        )
        await self._publish(context_id, [message])
        return message

    async def job_fields(self, context_id: int, job_key: str) -> dict[str, str]:
        """The hash of job ``job_key`` on this node or, for a job submitted here whose message
        the supervisor has not routed yet (still in ``msg_out``, or being routed), what its
        message says of it: its fields, ``message_key``, ``status`` dispatched and ``pending``
        (where it waits). {} if there is neither. Raises StoreError."""
        fields, queued, routing = await records.job_and_unrouted(
            self.store, context_id, job_key, SUPERVISOR_INFLIGHT
        )
        if fields:
            return fields
        for where, waiting in (("routing", routing), ("msg_out", queued)):
            message = await self._carrier(context_id, job_key, waiting)
            if message is not None:
                [job] = [j for j in message.job if j.key == job_key]
                return job.to_hash() | {
                    "status": JobStatus.DISPATCHED.value,
                    "created_at": str(message.created_at),
                    "updated_at": str(message.created_at),
                    "message_key": message.key,
                    "origin": message.origin,
                    "node": message.destination,
                    "pending": f"{where}: submitted, not routed yet",
                }
        return {}

    async def _carrier(self, ctx: int, job_key: str, message_keys: list[str]) -> Message | None:
        """The message among ``message_keys`` that carries job ``job_key`` (read in chunks of
        256 ``job`` fields; only this fallback of :meth:`job_fields` scans)."""
        caller, _, job_id = job_key.removeprefix("job:").partition(":")
        needle = f'"id":{job_id}'
        for start in range(0, len(message_keys), 256):
            chunk = [k for k in message_keys[start : start + 256] if k.split(":")[1:2] == [caller]]
            if not chunk:
                continue
            found = await records.field_of_many(self.store, ctx, chunk, "job")
            for key, raw in zip(chunk, found, strict=True):
                if raw is None or needle not in str(raw):
                    continue
                try:
                    message = Message.from_hash(await records.read_message(self.store, ctx, key))
                except BusError:
                    continue
                if any(j.key == job_key for j in message.job):
                    return message
        return None

    async def job_logs(
        self, context_id: int, job_key: str, *, follow: bool = False
    ) -> AsyncIterator[tuple[str, str]]:
        """The output of a job on this node as ``(stream, text)`` pairs: what a running job has
        written so far (live with ``follow``, until it ends), or a finished job's output.
        Raises ClientError if there is no such job."""
        last = "0-0"
        while True:
            entries = await records.log_entries(self.store, context_id, job_key, last, block=follow)
            for entry_id, fields in entries:
                last = entry_id
                if "end" in fields:
                    return
                yield fields.get("stream", "stdout"), fields.get("data", "")
            if entries:
                continue
            job = await self.job_fields(context_id, job_key)
            if not job:
                raise ClientError(f"no job {job_key} in context {context_id}")
            done = job.get("status") in ("finished", "error")
            if done and last == "0-0":  # it ended without publishing live: its result has it
                result = json.loads(job.get("result") or "{}")
                for stream in ("stdout", "stderr"):
                    if result.get(stream):
                        yield stream, result[stream]
                return
            if done or not follow:
                return

    async def wait_results(self, message: Message, timeout_s: float) -> list[JobResult]:
        """Wait for one result per job of ``message``; ClientError after ``timeout_s``. A
        message that names an inbox is answered there (one pop per batch of answers, shared
        with this client's other waiters); else on its own ``reply:<message key>``. Traced
        (when the application set up OpenTelemetry) as the client's wait: a span in the
        message's trace, from this call to the last answer."""
        span = _wait_span(message)
        try:
            results = await self._wait_results(message, timeout_s)
        except BaseException as exc:
            spans.end_error(span, exc)
            raise
        if span is not None:  # counted only for a span: this runs per job waited for
            failed = sum(r.status is not JobStatus.FINISHED for r in results)
            spans.end(span, "answered", attributes={"hero.results.failed": failed})
        return results

    async def _wait_results(self, message: Message, timeout_s: float) -> list[JobResult]:
        if message.reply_to:
            return await self._replies.wait(message, timeout_s)
        results: list[JobResult] = []
        reply_key = keys.reply(message.key)
        while len(results) < len(message.job):
            popped = await records.pop_reply(self.store, message.context_id, reply_key, timeout_s)
            if popped is None:
                raise ClientError(f"no result for {message.key} within {timeout_s:g} s")
            try:
                results.append(parse_reply(popped)[1])
            except ValueError as exc:
                raise ClientError(f"{reply_key}: {exc}") from None
        return results

    async def delivery_status(self, context_id: int, key: str) -> dict[str, str] | None:
        """Where message ``key`` is: pending, sent, acknowledged, held, received, processed,
        failed (``state``), with its timestamps and its jobs' statuses; None if there is no
        such hash."""
        store = self.store
        fields = await records.read_message(store, context_id, key)
        if not fields:
            return None
        entry = f"{context_id}|{key}"
        dest = fields.get("destination", "")
        if fields.get("status") == "error":
            state = "failed"
        elif fields.get("status") == "processed":
            state = "processed"
        elif await self._in_list(context_id, keys.MSG_OUT, key):
            state = "pending (msg_out)"
        elif await self._in_list(context_id, SUPERVISOR_INFLIGHT, key):
            state = "pending (msg_out, being routed)"
        elif dest and await self._in_list(keys.ACTORS_DB, keys.outbox(dest), entry):
            state = "pending (outbox, waiting for a link)"
        elif dest and await self._in_list(keys.ACTORS_DB, keys.outbox_inflight(dest), entry):
            state = "sent (waiting for the peer's ack)"
        elif "received_at" in fields and await records.is_held(
            store, context_id, fields.get("received_from", ""), key
        ):
            state = "held (its ack may never have left; runs once acknowledged again to its peer)"
        elif "received_at" in fields:
            state = "received"
        elif "acked_at" in fields or fields.get("status") == "acknowledged":
            state = "acknowledged"
        else:
            state = fields.get("status", MessageStatus.DISPATCHED.value)
        report = {"state": state}
        for name in (
            "status",
            "reason",
            "origin",
            "destination",
            "created_at",
            "acked_at",
            "received_at",
            "processed_at",
            "updated_at",
        ):
            if fields.get(name):
                report[name] = _stamp(fields[name]) if name.endswith("_at") else fields[name]
        pending = state.startswith("pending (msg_out")
        for job in json.loads(fields.get("job", "[]") or "[]"):
            jkey = keys.job(int(job["caller_id"]), int(job["id"]))
            status = (await records.read_job(store, context_id, jkey)).get("status")
            if status is None:  # its job hashes are written when the message is routed
                status = "dispatched (not routed yet)" if pending else "(not here)"
            report[jkey] = status
        return report

    async def _in_list(self, db: int, list_key: str, value: str) -> bool:
        return await records.holds(self.store, db, list_key, value)

    # -- flows -----------------------------------------------------------------------------------

    async def submit_flow(
        self,
        signer: Signer,
        caller_id: int,
        spec: FlowSpec | Mapping[str, object],
        *,
        context_id: int,
        ttl_s: int = DEFAULT_FLOW_TTL_S,
        deadline_s: int | None = None,
    ) -> int:
        """Check, sign and store a flow at this node, and wake its flow engine; returns its id.
        The flow ends in error if not over ``deadline_s`` after submission (signed; None: the
        node's ``flow_deadline_s``).

        Node refs ('self', peer names, ids, prefixes) are resolved to node ids. Raises
        FlowError naming the offending jobs for a bad document, an invalid DAG (cycle, unknown
        dependency), an unknown node or a job in another context than ``context_id``.
        """
        if not isinstance(spec, FlowSpec):
            spec = parse_flow(dict(spec))
        origin = await self.node_id()
        spec = await self._resolve_flow_nodes(spec)
        validate_flow(spec, {origin, *(p.id for p in await self.peers())})
        strays = [j.id for j in spec.jobs if j.context_id != context_id]
        if strays:
            detail = ", ".join(strays)
            raise FlowError(f"job(s) {detail} must run in the flow's context {context_id}", strays)
        stamp = now()
        span = _producer_span("submit_flow", context_id, caller_id)
        traceparent, tracestate = spans.outgoing_trace(span)
        doc = FlowDoc(
            id=new_id(),
            caller_id=caller_id,
            context_id=context_id,
            origin=origin,
            created_at=stamp,
            expires_at=stamp + ttl_s,
            nonce=new_nonce(),
            spec=spec,
            job_ids={j.id: new_id() for j in spec.jobs},
            deadline_s=deadline_s,
            traceparent=traceparent,
            tracestate=tracestate,
        )
        try:
            await self._store_flow(doc, sign_flow(doc, signer))
        except BaseException as exc:
            spans.end(span, "failed", type(exc).__name__)
            raise
        spans.end(span, "stored", attributes={spans.FLOW_ID: str(doc.id)})
        return doc.id

    async def _resolve_flow_nodes(self, spec: FlowSpec) -> FlowSpec:
        """``spec`` with every job's node as a node id ('self', this node's name, a peer's id,
        name or id prefix); FlowError naming the jobs whose node is unknown."""
        own = await records.node_info(self.store)
        resolved, strays = [], []
        for job in spec.jobs:
            try:
                ref = "self" if job.node == own.get("name") else job.node
                node = ref if len(ref) == 64 else await self.resolve_node(ref)
            except ClientError:
                strays.append(job)
                continue
            resolved.append(replace(job, node=node.lower()))
        if strays:
            detail = ", ".join(f"{j.id} (node {j.node!r})" for j in strays)
            raise FlowError(f"unknown node for job(s): {detail}", [j.id for j in strays])
        return replace(spec, jobs=tuple(resolved))

    async def _store_flow(self, doc: FlowDoc, signatures: list[dict[str, str]]) -> None:
        flow = Flow(
            id=doc.id,
            caller_id=doc.caller_id,
            context_id=doc.context_id,
            jobs=[doc.job_ids[j.id] for j in doc.spec.jobs],
            env_vars=dict(doc.spec.env_vars),
            created_at=doc.created_at,
            updated_at=doc.created_at,
        )
        extra = {
            "name": doc.spec.name,
            "origin": doc.origin,
            "doc": json.dumps(doc.to_dict(), separators=(",", ":")),
            "signatures": json.dumps(signatures),
            "reason": "",
        }
        # no job hashes: a client may not write job:* (the engine writes each job's copy when
        # it releases it; until then a missing copy reads as waiting_for_prerequisites)
        await records.put_flow(self.store, doc.context_id, doc.id, flow.to_hash() | extra)

    async def flow_state(self, flow_id: int, context_id: int) -> FlowState:
        """A snapshot of a flow and its jobs; ClientError if there is no such flow."""
        fields = await records.read_flow(self.store, context_id, flow_id)
        if not fields:
            raise ClientError(f"no flow {flow_id} in context {context_id}")
        try:
            doc = FlowDoc.from_dict(json.loads(fields.get("doc", "")))
        except (ValueError, BusError) as exc:
            raise ClientError(f"flow {flow_id} has an unreadable document: {exc}") from None
        jobs = []
        for job in doc.spec.jobs:
            job_fields = await records.read_job(self.store, context_id, doc.job_key(job.id))
            jobs.append(job_state(doc, job, job_fields))
        flow = Flow.from_hash(fields)
        return FlowState(
            flow_id, doc.spec.name, flow.status, fields.get("reason", ""), tuple(jobs), flow.result
        )

    async def wait_flow(
        self,
        flow_id: int,
        context_id: int,
        timeout_s: float,
        on_change: Callable[[FlowState], None] | None = None,
    ) -> FlowState:
        """Wait until the flow is final (BLPOP on its progress list, no polling).

        ``on_change`` is called with each new snapshot that differs from the previous one.
        Raises ClientError after ``timeout_s`` or if the flow does not exist.
        """
        deadline = trio.current_time() + timeout_s
        seen: tuple[object, ...] | None = None
        while True:
            state = await self.flow_state(flow_id, context_id)
            if on_change is not None and state.signature() != seen:
                on_change(state)
            seen = state.signature()
            left = deadline - trio.current_time()
            if state.done:
                return state
            if left <= 0:
                raise ClientError(f"flow {flow_id} not final within {timeout_s:g} s")
            if not await records.wait_flow_progress(self.store, context_id, flow_id, left):
                raise ClientError(f"flow {flow_id} not final within {timeout_s:g} s")


def _producer_span(operation: str, context_id: int, caller_id: int) -> spans.Span | None:
    """The client's PRODUCER span of one submission, a child of the caller's current span;
    None unless the application set up OpenTelemetry."""
    if not spans.recording():  # its attributes are not built for nothing: one per submission
        return None
    attributes = {
        spans.DESTINATION: keys.MSG_OUT,
        spans.CONTEXT: context_id,
        spans.CALLER: caller_id,
        "messaging.operation.name": operation,
    }
    return spans.start(__name__, f"{operation} {keys.MSG_OUT}", "PRODUCER", attributes=attributes)


def _wait_span(message: Message) -> spans.Span | None:
    """The client's span of waiting for ``message``'s results: a child of the span that sent
    it (its signed traceparent); None unless the application set up OpenTelemetry. Started
    and ended explicitly, never current across the wait's awaits."""
    if not spans.recording():
        return None
    trace = message_trace(message.traceparent, message.tracestate)
    attributes: dict[str, object] = {
        spans.MESSAGE_ID: message.key,
        spans.CONTEXT: message.context_id,
        spans.CALLER: message.caller_id,
        spans.DESTINATION: keys.reply(message.key) if not message.reply_to else "inbox",
        spans.JOB_KEYS: [job.key for job in message.job],
    }
    context = spans.remote_context(trace.parent, trace.tracestate)
    return spans.start(__name__, "wait reply", "CONSUMER", context=context, attributes=attributes)


def _carried(messages: Sequence[Message]) -> dict[str, str | int]:
    """The span attributes naming what a submission queued (never a script or an env)."""
    if len(messages) == 1:
        return {spans.MESSAGE_ID: messages[0].key}
    return {spans.BATCH_COUNT: len(messages)}


def _request_trace(request: Mapping[str, str]) -> tuple[str, str]:
    """The trace context of a stored request message (its hash) when it is valid, else the
    caller's own (:func:`spans.outgoing_trace`)."""
    judged = message_trace(request.get("traceparent", ""), request.get("tracestate", ""))
    if judged.parent is None:
        return spans.outgoing_trace(None)
    return judged.parent.header, judged.tracestate


def _stamp(value: str) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(value))) + f" ({value})"
    except ValueError:
        return value


@asynccontextmanager
async def open_client(redis_url: str, *, inbox: str = "") -> AsyncIterator[Client]:
    """A :class:`Client` on the node's Redis at ``redis_url``, closed on exit; with ``inbox``,
    its messages are answered on that reply inbox (see :class:`Client`).

    Raises StoreError if Redis cannot be reached, ClientError for a bad inbox name."""
    async with open_store(redis_url) as store:
        yield Client(store, inbox=inbox)

"""The trio client API: register actors, contexts and peers on a node; submit jobs; await results.

A client talks to its node's Redis, as the spec's actors do: it writes the signed message and
its jobs into the context DB, pushes the message key on ``msg_out``, and waits on the dedicated
``reply:<message key>`` list (BLPOP, no polling) for the results.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from bus import keys
from bus.envelope import sign_message
from bus.errors import ClientError
from bus.ids import new_id, new_nonce, now
from bus.models import Actor, Context, JobStatus, Message, MessageType, Peer, RunnerJob
from bus.store import Store, open_store
from crypto import KeyPair, parse_public_key
from crypto.errors import KeyFormatError


@dataclass(frozen=True)
class JobResult:
    job_key: str
    status: JobStatus
    result: dict[str, str]
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status is JobStatus.FINISHED

    @property
    def stdout(self) -> str:
        return self.result.get("stdout", "")


class Client:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def node_id(self) -> str:
        """The id of the node serving this Redis; ClientError if no node ever ran on it."""
        node_id = await self.store.call(keys.ACTORS_DB, lambda r: r.hget(keys.NODE_INFO, "id"))
        if not node_id:
            raise ClientError("no hero-node has run on this Redis yet (no node:info)")
        return str(node_id)

    # -- registry --------------------------------------------------------------------------------

    async def register_actor(
        self, actor_id: int, pubkey: str, address: Iterable[str] = ()
    ) -> Actor:
        try:
            parse_public_key(pubkey)
        except KeyFormatError as exc:
            raise ClientError(f"actor {actor_id}: {exc}") from exc
        actor = Actor(actor_id, pubkey.lower(), list(address), created_at=now(), updated_at=now())
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
        peer = Peer(node_id.lower(), address, name, created_at=now(), updated_at=now())
        async with self.store.transaction(keys.ACTORS_DB) as tx:
            tx.hset(keys.peer(peer.id), peer.to_hash())
            tx.sadd(keys.PEERS, [peer.id])
            tx.lpush(keys.NODE_EVENTS, [keys.peer(peer.id)])
        return peer

    async def peers(self) -> list[Peer]:
        ids = await self.store.call(keys.ACTORS_DB, lambda r: r.smembers(keys.PEERS))
        found = [await self.store.hgetall(keys.ACTORS_DB, keys.peer(i)) for i in sorted(ids)]
        return [Peer.from_hash(h) for h in found if h]

    async def resolve_node(self, ref: str) -> str:
        """A node id from 'self', a full id, a peer name or a unique id prefix."""
        own = await self.node_id()
        if ref in ("self", "local", own):
            return own
        peers = await self.peers()
        matches = {p.id for p in peers if ref in (p.id, p.name) or p.id.startswith(ref.lower())}
        if own.startswith(ref.lower()):
            matches.add(own)
        if len(matches) == 1:
            return matches.pop()
        if not matches:
            raise ClientError(f"unknown node {ref!r}: not this node, nor a peer id or name")
        raise ClientError(f"node {ref!r} is ambiguous: matches {len(matches)} nodes")

    # -- jobs ------------------------------------------------------------------------------------

    async def submit_job(
        self,
        signer: KeyPair,
        caller_id: int,
        *,
        to: str,
        context_id: int,
        script_type: str,
        script: str,
        env_vars: Mapping[str, str] | None = None,
        timeout_s: int = 60,
        retries: int = 0,
    ) -> Message:
        """Sign and queue a one-job message for node ``to``; returns the message."""
        job = RunnerJob(
            id=new_id(),
            caller_id=caller_id,
            context_id=context_id,
            script=script,
            script_type=script_type,
            timeout=timeout_s,
            retries=retries,
            env_vars=dict(env_vars or {}),
            created_at=now(),
            updated_at=now(),
        )
        return await self.submit(
            signer, caller_id, to=to, context_id=context_id, jobs=[job], timeout_s=timeout_s
        )

    async def submit(
        self,
        signer: KeyPair,
        caller_id: int,
        *,
        to: str,
        context_id: int,
        jobs: list[RunnerJob],
        timeout_s: int = 60,
    ) -> Message:
        origin = await self.node_id()
        if len(to) != 64:  # not a node id: 'self', a peer name or an id prefix
            to = await self.resolve_node(to)
        message = sign_message(
            Message(
                id=new_id(),
                caller_id=caller_id,
                context_id=context_id,
                message_type=MessageType.JOB,
                timeout=timeout_s,
                job=jobs,
                created_at=now(),
                updated_at=now(),
                origin=origin,
                destination=to,
                nonce=new_nonce(),
            ),
            signer,
        )
        async with self.store.transaction(context_id) as tx:
            for job in jobs:
                tx.hset(job.key, job.to_hash() | {"message_key": message.key})
            tx.hset(message.key, message.to_hash())
            tx.lpush(keys.MSG_OUT, [message.key])
        return message

    async def wait_results(self, message: Message, timeout_s: float) -> list[JobResult]:
        """Wait for one result per job of ``message``; ClientError after ``timeout_s``."""
        results: list[JobResult] = []
        reply_key = keys.reply(message.key)
        while len(results) < len(message.job):
            popped = await self.store.call(
                message.context_id, lambda r: r.blpop([reply_key], timeout=timeout_s)
            )
            if popped is None:
                raise ClientError(f"no result for {message.key} within {timeout_s:g} s")
            d = json.loads(popped[1])
            results.append(
                JobResult(d["job_key"], JobStatus(d["status"]), d["result"], d.get("reason", ""))
            )
        return results


@asynccontextmanager
async def open_client(redis_url: str) -> AsyncIterator[Client]:
    async with open_store(redis_url) as store:
        yield Client(store)

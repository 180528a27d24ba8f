"""What the services of a running node share, as small parts: a service takes the parts it
uses (its identity, the peers, the wake-ups, ...), not the whole node."""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any, Protocol, TypeVar

import trio

from bus.core.deadlines import RECEIVED_FROM
from bus.core.models import Actor, Context, Message, Peer
from bus.core.stats import StatsBatch
from bus.core.verify import AcceptedAlgorithms, Freshness
from bus.store import records
from bus.store.connection import Store
from bus.store.serve import Known, Popped
from bus.wire.breakers import PeerBreakers
from bus.wire.outbox import PeerOutbox
from bus.wire.transport import Transport
from crypto import KeyPair
from node.config import NodeConfig
from node.host.signer import SignedResults, Signer
from node.sandbox.probe import Isolation

log = logging.getLogger(__name__)

T = TypeVar("T")

REPLY_MEMORY = 16_384  # requests sent to peers whose reply_to Recent.reply_targets keeps


class Waker(Protocol):
    """What wake_idle_slots interrupts (a runner process's blocking pop)."""

    def cancel(self) -> None: ...


@dataclass
class Identity:
    """Who this node is, in this boot."""

    key: KeyPair
    # how old and how far ahead a signed message may be (from the config)
    freshness: Freshness
    # the key algorithms an actor's message may be signed with, per context (from the config)
    algorithms: AcceptedAlgorithms
    # the key of the admission stamp (bus/core/admitted.py; node/host/hardening.py) and the
    # signer process runners get a socket to (node/host/signer.py); set by the daemon
    admission_key: bytes = b""
    signer: Signer | None = None
    boot: str = field(default_factory=lambda: secrets.token_hex(4))
    # the node's public key, which names it: read for every message judged, routed and
    # delivered, so resolved here once rather than by a call each time
    node_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.node_id = self.key.public_hex


@dataclass
class Counters:
    """Counters of what happened, by name (see :meth:`count`); ``counted`` is set when one
    changes and re-armed by the service that publishes them (node/observe/tallies.py)."""

    metrics: dict[str, int] = field(default_factory=dict)
    counted: trio.Event = field(default_factory=trio.Event)
    # services restarted by node.resilient, by name (a Redis outage; never content)
    restarts: dict[str, int] = field(default_factory=dict)

    def count(self, name: str, n: int = 1) -> None:
        self.metrics[name] = self.metrics.get(name, 0) + n
        self.counted.set()

    def service_restarted(self, name: str) -> None:
        self.restarts[name] = self.restarts.get(name, 0) + 1
        self.count("service_restarts")


@dataclass
class JobStats:
    """Job statistics the node's own scripts counted and handed back (materialising a job,
    accepting a result: bus/store/atomic/lua/stats_jobs.lua, stats_collected), by context,
    not yet in ``stats:jobs``; ``counted`` is set when one is added and re-armed by the service
    that writes them (node/observe/tallies.py)."""

    pending: dict[int, StatsBatch] = field(default_factory=dict)
    counted: trio.Event = field(default_factory=trio.Event)
    # set by the writer service: write everything counted so far (a scrape, before it reads)
    write: Callable[[], Coroutine[Any, Any, None]] | None = None

    def add(self, ctx: int, flat: list[str]) -> None:
        if flat:
            batch = self.pending.get(ctx)
            if batch is None:  # made only when missing: not one per materialised job, unused
                batch = self.pending[ctx] = StatsBatch()
            batch.add_flat(flat)
            self.counted.set()


@dataclass
class Shutdown:
    """Graceful shutdown: intake stops when ``stopping`` is set; ``idle`` is set when no job
    runs."""

    stopping: trio.Event = field(default_factory=trio.Event)
    idle: trio.Event = field(default_factory=trio.Event)
    running_jobs: int = 0
    intake: set[trio.CancelScope] = field(default_factory=set)

    def stop_intake(self) -> None:
        """Stop taking new work; what runs goes on (see :meth:`job_started`)."""
        self.stopping.set()
        for scope in list(self.intake):
            scope.cancel()
        if self.running_jobs == 0:
            self.idle.set()

    def job_started(self) -> None:
        self.running_jobs += 1

    def job_ended(self) -> None:
        self.running_jobs -= 1
        if self.running_jobs == 0 and self.stopping.is_set():
            self.idle.set()


@dataclass
class WakeUps:
    """What wakes a waiting service before its timeout."""

    # runner slots that may block on their type queue, by (context, script type): see
    # wake_idle_slots
    idle_slots: dict[tuple[int, str], set[Waker]] = field(default_factory=dict)
    retry_scheduled: dict[int, trio.Event] = field(default_factory=dict)
    deadline_scheduled: dict[int, trio.Event] = field(default_factory=dict)
    # per context: when the deadline service looks next (Unix ms; -1: at its idle wake-up)
    deadline_due: dict[int, int] = field(default_factory=dict)
    flow_deadline_scheduled: dict[int, trio.Event] = field(default_factory=dict)
    # per context: a message was held, or a link came up (node/intake/held.py)
    held: dict[int, trio.Event] = field(default_factory=dict)

    def deadline_armed(self, ctx: int, at_ms: int) -> None:
        """A deadline of ``ctx`` is armed for ``at_ms``: wake the deadline service only if it
        would look later (node/intake/deadlines.py); that look finds this one anyway."""
        due = self.deadline_due.get(ctx, -1)
        if due < 0 or at_ms < due:
            self.deadline_due[ctx] = at_ms
            self.deadline_scheduled.setdefault(ctx, trio.Event()).set()

    def wake_idle_slots(self, ctx: int, script_type: str) -> None:
        """A job was queued on a priority or targeted list: idle slots block on the plain type
        queue only, so interrupt them to look at all their lists now (not at their pop
        timeout)."""
        for scope in self.idle_slots.get((ctx, script_type), ()):
            scope.cancel()

    def wake_held(self) -> None:
        """Every context's held messages may go: a link came up, or one was held."""
        for event in self.held.values():
            event.set()

    def wake_retries(self, ctx: int) -> None:
        self.retry_scheduled.setdefault(ctx, trio.Event()).set()


@dataclass
class Backpressure:
    """How far the node's runners are behind what intake materialised."""

    # per context: the deepest type queue as the last materialisation left it (runners have
    # only shortened it since, unless a retry or another process pushed meanwhile)
    queue_depth: dict[int, int] = field(default_factory=dict)
    jobs_taken: int = 0  # by this node's runner slots, since start
    _taken_waiters: list[tuple[int, trio.Event]] = field(default_factory=list)

    async def wait_jobs_taken(self, count: int) -> None:
        """Until this node's runner slots have taken ``count`` more jobs (supervisor
        backpressure: one wake-up for the lot, not one per job)."""
        event = trio.Event()
        self._taken_waiters.append((self.jobs_taken + count, event))
        try:
            await event.wait()
        finally:
            if not event.is_set():  # cancelled (timeout): forget the waiter
                self._taken_waiters[:] = [w for w in self._taken_waiters if w[1] is not event]

    def job_taken(self) -> None:
        self.jobs_taken += 1
        if self._taken_waiters:
            due = [w for w in self._taken_waiters if w[0] <= self.jobs_taken]
            if due:
                for _, event in due:
                    event.set()
                self._taken_waiters[:] = [w for w in self._taken_waiters if not w[1].is_set()]


@dataclass
class Peers:
    """The nodes this one knows and its links to them."""

    own_id: str
    known: dict[str, Peer] = field(default_factory=dict)
    # the circuit breaker of each peer's link (bus/wire/breakers.py)
    breakers: PeerBreakers = field(default_factory=PeerBreakers)
    outboxes: dict[str, PeerOutbox] = field(default_factory=dict)
    # the node's links (their state and traffic, for node/observe/metrics.py); set once they exist
    transport: Transport | None = None

    def known_peer_ids(self) -> set[str]:
        return set(self.known)

    def is_known_node(self, node_id: str) -> bool:
        return node_id == self.own_id or node_id in self.known

    async def load_peers(self, store: Store) -> list[Peer]:
        """Refresh the in-memory peer registry from DB 0; return peers not seen before."""
        ids = await records.peer_ids(store)
        fresh = []
        for peer_id in ids:
            h = await records.read_peer(store, peer_id)
            if not h:
                continue
            peer = Peer.from_hash(h)
            if peer.id not in self.known:
                fresh.append(peer)
            self.known[peer.id] = peer
        return fresh


@dataclass
class RegistryCache:
    """Actors and contexts as of a registry version, read once per version."""

    store: Store
    _cache: dict[tuple[str, int], tuple[str, Any]] = field(default_factory=dict)
    _read: str | None = None  # the version read by GET, before any admitted pop

    async def version(self) -> str:
        """The registry's version (``registry:version``) as of after the last admitted pop:
        every write of an actor or a context bumps it (bus/store/connection.py), so an entry
        cached under another version is never used again. Every message admitted was popped
        before, by a pop whose script read the version after its pops (Store.pop_read_batch
        or pop_read_wait with ``registry``), so that version sees every registry write made
        before the message was submitted: no round trip of its own. One GET only while nothing
        was popped that way (a message judged without a pop)."""
        if self.store.registry_seen is not None:
            return self.store.registry_seen
        if self._read is None:
            self._read = await records.registry_version(self.store)
        return self._read

    async def actor(self, actor_id: int, version: str) -> Actor | None:
        """``actor:<id>`` as of registry ``version`` (:meth:`version`)."""
        key = ("actor", actor_id)
        hit: Actor | None = self._hit(key, version)
        return hit if hit is not None else await self._load(key, version, self.store.get_actor)

    async def context(self, context_id: int, version: str) -> Context | None:
        """``context:<id>`` as of registry ``version`` (:meth:`version`)."""
        key = ("context", context_id)
        hit: Context | None = self._hit(key, version)
        return hit if hit is not None else await self._load(key, version, self.store.get_context)

    # Every admitted message asks for its actor and its context: a hit costs no coroutine but
    # the caller's, and a load is made only for a miss

    def _hit(self, key: tuple[str, int], version: str) -> Any:  # noqa: ANN401 - Actor | Context
        hit = self._cache.get(key)
        return hit[1] if hit is not None and hit[0] == version else None

    async def _load(
        self, key: tuple[str, int], version: str, load: Callable[[int], Coroutine[Any, Any, T]]
    ) -> T:
        # the version is read before the load: a write between them bumps it again, so what
        # this load saw is tagged older than the registry and reloaded at the next use
        value = await load(key[1])
        if value is not None:  # absence is never cached: a registration applies at once
            self._cache[key] = (version, value)
        return value

    def forget(self) -> None:
        """Drop cached actors and contexts (a registration event arrived)."""
        self._cache.clear()


class LiveRunner(Protocol):
    """A live runner process as the node's services see it (node/runners/processes.py
    RunnerProcess)."""

    # the token base of the process's starts (each process of a slot has its own): the
    # attempts it started hold ``<token_base>:<job key>``
    token_base: str

    def stop(self, job_key: str, reason: str) -> None:
        """Ask it to stop ``job_key`` if it runs it."""

    def primary_moved(self) -> None:
        """The Sentinels named a new primary: it shuts its connections to the old one."""


@dataclass
class Runners:
    """This node's live runner processes (node/runners/processes.py)."""

    # by (context, slot id): the slot's live process
    processes: dict[tuple[int, str], LiveRunner] = field(default_factory=dict)
    # how jobs are isolated, found at start (node/runners/sandboxes.py); None: not yet known
    isolation: Isolation | None = None

    def stop_running(self, job_key: str, reason: str) -> None:
        """Stop ``job_key`` if one of this node's runner processes is running it (each is
        told; the one running it kills it and ends it with ``reason``)."""
        for process in self.processes.values():
            process.stop(job_key, reason)

    def primary_moved(self) -> None:
        """The Sentinels named a new primary: every live runner process is told."""
        for process in list(self.processes.values()):
            process.primary_moved()


@dataclass
class Recent:
    """What this node did lately, remembered so that answers need no read."""

    # result messages this node or its signer signed lately, by key: their signature entry
    # (see node.intake.messages.signed_here)
    signed_results: SignedResults = field(default_factory=SignedResults)
    # requests this node sent to peers lately, by (context, key): their signed reply_to ("" if
    # none), so that the answers their results carry need no read
    # (node.intake.consumer.reply_targets)
    reply_targets: OrderedDict[tuple[int, str], str] = field(default_factory=OrderedDict)

    def remember_reply_to(self, message: Message) -> None:
        """Keep the signed ``reply_to`` of a job message this node sends to a peer (bounded)."""
        self.reply_targets[message.context_id, message.key] = message.reply_to
        while len(self.reply_targets) > REPLY_MEMORY:
            self.reply_targets.popitem(last=False)


# -- what holds intake back (node/intake/pressure.py says when and why) -----------------------


class IntakeHold:
    """Why the node takes no new jobs now (cause -> detail); :meth:`wait_open` returns once
    nothing holds them, :meth:`wait_changed` at the next change."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}
        self._open = trio.Event()
        self._open.set()
        self._changed = trio.Event()

    def _change(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def hold(self, cause: str, detail: str) -> bool:
        """Hold new jobs for ``cause``; whether it is new."""
        new = cause not in self.held
        self.held[cause] = detail
        if self._open.is_set():
            self._open = trio.Event()
        if new:
            self._change()
        return new

    def release(self, cause: str) -> bool:
        """``cause`` no longer holds new jobs; whether it did."""
        if self.held.pop(cause, None) is None:
            return False
        if not self.held:
            self._open.set()
        self._change()
        return True

    async def wait_open(self) -> None:
        """Return once nothing holds new jobs (at once if nothing does)."""
        while self.held:
            await self._open.wait()

    def text(self) -> str:
        return "; ".join(f"{cause}: {detail}" for cause, detail in sorted(self.held.items()))


MAX_LOST_ACKS = 65_536  # acks a link never wrote, remembered until their message is popped
# how long after a link owed an ack the consumer waits for it to be written; then it holds the
# message (a peer that stops reading blocks its link's writer: it delays no one else longer)
ACK_GRACE_S = 2.0


class OwedAcks:
    """Job messages a link stored in this boot whose ack has not left on it yet.

    A message is stored and queued on ``msg_in`` before its ack is written (node/links/
    frames.py), so the consumer may pop it first. If it ran then and this node died before
    the ack left, its origin would tell its client ``timeout_ack`` while this node runs it.
    So a link owes each ack from before the store (:meth:`owe`), its writer settles it once
    written or never (:meth:`settle`, the link's ``acks_out``), and the consumer runs a job
    message only once its ack was written (:meth:`written`); one whose ack never left, or
    not within ``grace_s`` of the store, is held like one stored before a restart
    (node/intake/held.py), until a link acks it."""

    def __init__(self, most_lost: int = MAX_LOST_ACKS, grace_s: float = ACK_GRACE_S) -> None:
        self._owed: dict[tuple[int, str], tuple[float, trio.Event]] = {}
        self._lost: OrderedDict[tuple[int, str], None] = OrderedDict()
        self._most_lost = most_lost
        self.grace_s = grace_s

    def owe(self, ctx: int, message_keys: Iterable[str]) -> None:
        since = trio.current_time()  # owed again: its grace starts again
        for key in message_keys:
            self._lost.pop((ctx, key), None)
            owed = self._owed.get((ctx, key))
            self._owed[(ctx, key)] = (since, owed[1] if owed is not None else trio.Event())

    def settle(self, acks: Iterable[Mapping[str, object]], written: bool) -> None:
        """``acks`` (``{"ctx", "key"}``, as a link posts them) written to their link, or not."""
        for ack in acks:
            ctx, key = ack.get("ctx"), ack.get("key")
            if not isinstance(ctx, int) or not isinstance(key, str):
                continue
            owed = self._owed.pop((ctx, key), None)
            if owed is None:
                continue
            event = owed[1]
            if not written:
                self._lost[(ctx, key)] = None
                while len(self._lost) > self._most_lost:
                    self._lost.popitem(last=False)
            event.set()

    async def written(self, ctx: int, key: str) -> bool:
        """Whether the ack of message ``key`` left on its link (waits while it is owed, up to
        ``grace_s`` after it was owed); False for an ack its link never wrote, or not yet."""
        owed = self._owed.get((ctx, key))
        if owed is not None:
            since, event = owed
            with trio.move_on_at(since + self.grace_s):
                await event.wait()
            if not event.is_set():
                return False
        if (ctx, key) in self._lost:
            del self._lost[(ctx, key)]
            return False
        return True


@dataclass
class Inbound:
    """Messages each peer's link delivered that wait in ``msg_in`` (in this boot's memory: a
    backlog a restart finds is drained without counting), and a wake-up when the consumer's
    pop takes some (:meth:`popped`, its queue's ``taken``: bus/store/serve.py)."""

    waiting: dict[str, int] = field(default_factory=dict)
    _taken: trio.Event = field(default_factory=trio.Event)
    # by context: the hashes of the messages this process pushed on msg_in (links, supervisor)
    known: defaultdict[int, Known] = field(default_factory=lambda: defaultdict(Known))
    owed: OwedAcks = field(default_factory=OwedAcks)  # acks of stored messages not yet written

    def delivered(self, peer: str, n: int) -> None:
        """``n`` more (or, negative, fewer) of ``peer``'s messages wait. A link counts a group
        before it stores it, so the consumer never takes one not counted yet."""
        if n:
            self.waiting[peer] = max(0, self.waiting.get(peer, 0) + n)

    def popped(self, entries: list[Popped]) -> None:
        """The consumer's pop moved ``entries`` off ``msg_in``: each counted for the peer that
        delivered it (its ``received_from`` field), if one did."""
        self.taken(popped.fields.get(RECEIVED_FROM, "") for popped in entries)

    def taken(self, peers: Iterable[str]) -> None:
        """The consumer took these messages (each its peer, "" for none) off ``msg_in``."""
        for peer in peers:
            if self.waiting.get(peer, 0) > 0:
                self.waiting[peer] -= 1
        self._taken.set()
        self._taken = trio.Event()

    async def wait_room(self, peer: str, limit: int) -> None:
        """Return once fewer than ``limit`` messages of ``peer`` wait (0: no limit)."""
        while limit and self.waiting.get(peer, 0) >= limit:
            await self._taken.wait()


@dataclass
class Pressure:
    """What holds intake back (NodeState.pressure)."""

    hold: IntakeHold = field(default_factory=IntakeHold)
    inbound: Inbound = field(default_factory=Inbound)


@dataclass
class NodeState:
    """The parts of a running node; the daemon builds it and hands each service its parts."""

    config: NodeConfig
    key: InitVar[KeyPair]
    store: Store
    admission_key: InitVar[bytes] = b""
    signer: InitVar[Signer | None] = None
    identity: Identity = field(init=False)
    counters: Counters = field(init=False, default_factory=Counters)
    job_stats: JobStats = field(init=False, default_factory=JobStats)
    shutdown: Shutdown = field(init=False, default_factory=Shutdown)
    wakeups: WakeUps = field(init=False, default_factory=WakeUps)
    backpressure: Backpressure = field(init=False, default_factory=Backpressure)
    peers: Peers = field(init=False)
    registry: RegistryCache = field(init=False)
    runners: Runners = field(init=False, default_factory=Runners)
    recent: Recent = field(init=False, default_factory=Recent)
    pressure: Pressure = field(init=False, default_factory=Pressure)  # node/intake/pressure.py

    def __post_init__(self, key: KeyPair, admission_key: bytes, signer: Signer | None) -> None:
        freshness = Freshness(self.config.max_age_s, self.config.max_skew_s)
        algorithms = self.config.accepted_algorithms
        self.identity = Identity(key, freshness, algorithms, admission_key, signer)
        if signer is not None:  # one memory of the results signed here: its own and its signer's
            self.recent.signed_results = signer.signed
        self.peers = Peers(key.public_hex)
        self.registry = RegistryCache(self.store)

"""The node's nursery tree, top-down: each service, the function started, the module to open.

run_node
├── run_valkey               embedded Valkey, unless a Redis URL is set (node/host/valkey.py)
├── run_signer               the node key's process: signs runners' results (node/host/signer.py)
└── services                 (the store open; each service restarted by node/resilient.py)
    ├── serve                the transport's listener: authenticated links (bus/wire/transport.py)
    ├── watch                registry events: contexts, peers registered while running (Registry)
    ├── run_counters         the counters ``status`` shows (node/observe/tallies.py)
    ├── run_node_info        the node's own facts in node:info, once up (node/observe/nodeinfo.py)
    ├── run_link_info        the peer links ``status`` shows (node/observe/linkinfo.py)
    ├── carry_asks           clients' trace asks to peers, answers back (node/links/trace.py)
    ├── run_console          the web console, when ``[console] listen`` is set (node/web/server.py)
    ├── run_dlq_watch        DB 0's dead letters: bound, archive, hook (node/observe/dlq.py)
    ├── run_breaker_publisher  the peers' circuit breakers (node/links/peer_breakers.py)
    ├── run_store_tuning     replicated store: fsync, failovers (node/host/store_tuning.py)
    ├── run_pressure_watch   free disk and store memory: hold new jobs (node/intake/pressure.py)
    ├── per peer
    │   ├── run              the durable outbox to the peer (bus/wire/outbox.py PeerOutbox)
    │   └── dial_forever     when the peer has an address (bus/wire/transport.py)
    └── per context
        ├── run_supervisor       msg_out: check, route, materialise (node/intake/supervisor.py)
        ├── run_consumer         msg_in: admit, materialise, results (node/intake/consumer.py)
        ├── run_retry_scheduler  retries when due (node/runners/recovery.py)
        ├── run_deadlines        timeout_ack and timeout_result (node/intake/deadlines.py)
        ├── run_held             what a restart left unacknowledged (node/intake/held.py)
        ├── run_flow_engine      flows at their origin (node/flows/engine.py)
        ├── run_dlq_watch        the context's dead letters (node/observe/dlq.py)
        ├── run_fair_share       waiting jobs into their queues (node/intake/fair_share.py)
        ├── run_results          what external runners finish (node/runners/external.py)
        ├── run_reaper           external runners' lost leases (node/runners/external.py)
        ├── run_presence         the slots' heartbeat (node/runners/presence.py)
        └── run_runner_process   one per slot: a ``python -m node.worker`` process
                                 (node/runners/processes.py; the process: node/worker/loop.py)

The queue services (supervisor, consumer, flow engine, dlq watchers, results, outboxes) are
handlers of one loop, bus/store/serve.py. tests/layout/test_rooms.py checks this picture against the
services started below.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from functools import partial

import trio

from bus.core import keys
from bus.core.breaker import BreakerConfig
from bus.core.ids import now
from bus.core.models import Actor, Context, Peer
from bus.core.queues import consume_order, slot_bases
from bus.core.urls import bare_host, link_url, redact
from bus.errors import Refused
from bus.store import records
from bus.store.connection import open_store
from bus.store.migrate import migrate
from bus.wire import outbox
from bus.wire.breakers import PeerBreakers
from bus.wire.transport import Transport, TransportConfig
from crypto import KeyPair, passphrase_from_env, read_key_file, read_signing_key_file
from node.config import NodeConfig
from node.config.commands import validate_commands
from node.flows.engine import run_flow_engine
from node.host.acl import NODE, RUNNER, embedded_spec, role_url
from node.host.hardening import check_home, ensure_admission_key, is_dumpable
from node.host.homelock import hold_home
from node.host.ports import listen_error
from node.host.signer import run_signer
from node.host.valkey import run_valkey
from node.intake.admission import load_message
from node.intake.consumer import run_consumer
from node.intake.deadlines import run_deadlines
from node.intake.fair_share import run_fair_share
from node.intake.held import run_held
from node.intake.messages import Rejected, reject
from node.intake.pressure import raised_bounds, run_pressure_watch
from node.intake.supervisor import run_supervisor
from node.links.encryption import (
    encryption_fields,
    migrate_peer_addresses,
    scheme,
    warn_legacy,
    with_encryption,
)
from node.links.frames import LinkHandler
from node.links.peer_breakers import run_breaker_publisher
from node.links.summary import SummaryDesk
from node.observe.dlq import run_dlq_watch
from node.observe.linkinfo import run_link_info
from node.observe.nodeinfo import run_node_info
from node.observe.tallies import JobStatsWriter, run_counters
from node.observe.tracing import tracing
from node.resilient import resilient
from node.runners.adoption import kill_orphans_but_adoptable
from node.runners.external import run_reaper, run_results
from node.runners.presence import Slot, run_presence, runner_id
from node.runners.processes import RunnerSlot, run_runner_process, slots_of, start_in_stages
from node.runners.recovery import run_retry_scheduler
from node.runners.sandboxes import find_isolation
from node.sandbox.probe import Isolation, sweep_leaves
from node.slot.commands import script_commands
from node.state import NodeState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    name: str
    redis_url: str
    ws_url: str
    pid: int
    console_url: str = ""  # http://host:port of the web console ("": off)
    # the running node's shared state (metrics, restarts), for whoever runs it in-process
    state: NodeState | None = field(default=None, compare=False, repr=False)


async def run_node(
    config: NodeConfig,
    *,
    key: KeyPair | None = None,
    stop: trio.Event | None = None,
    task_status: trio.TaskStatus[NodeInfo] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the node until cancelled, or until ``stop`` is set: then stop intake, give running
    jobs ``config.grace_s`` to finish, requeue the rest and return. Reports :class:`NodeInfo`
    once every service is up. The home's lock is held all along (node/host/homelock.py).

    Raises HomeInUse (touching nothing) if another node runs on this home, ConfigError/
    KeyFileError for a bad home, ValkeyError/StoreError if Redis fails.
    """
    with hold_home(config.home, config.run_dir):
        await _run_node(config, key, stop, task_status)


async def _run_node(
    config: NodeConfig,
    key: KeyPair | None,
    stop: trio.Event | None,
    task_status: trio.TaskStatus[NodeInfo],
) -> None:
    check_home(config.home, [config.node_key_path, config.actor_key_path])
    admission_key = ensure_admission_key(config.home)
    if key is None:
        key = read_key_file(config.node_key_path, passphrase=passphrase_from_env())
    async with trio.open_nursery() as root:
        # with a configured Redis the runners use its URL, its users yours (docs/security/valkey.md)
        redis_url = runner_url = config.redis_url
        if config.store.replicated:  # the primary the Sentinels name, followed across failovers
            if config.store.weak_promise is not None:  # said out loud, as isolation "none" is
                log.warning("%s", config.store.weak_promise)
            redis_url = role_url(config, "", NODE)
            runner_url = role_url(config, "", RUNNER)
        elif not redis_url:
            spec = embedded_spec(config)
            published = await root.start(run_valkey, spec)
            redis_url = role_url(config, published, NODE)
            runner_url = role_url(config, published, RUNNER)
        signer = await root.start(run_signer, key)
        async with (
            open_store(redis_url) as store,
            tracing(config.tracing, key.public_hex, config.name),
        ):
            node = NodeState(config, key, store, admission_key=admission_key, signer=signer)
            try:
                await _run_services(node, (redis_url, runner_url), stop, task_status)
            finally:
                if node.runners.isolation is not None and node.runners.isolation.cgroups:
                    # its runners have all ended (their nursery waited for them): the leaves
                    # of those killed go too. A few rmdirs, not awaited: cancelled, it runs too
                    sweep_leaves(config.home)
        root.cancel_scope.cancel()


async def _run_services(
    node: NodeState,
    urls: tuple[str, str],
    stop: trio.Event | None,
    task_status: trio.TaskStatus[NodeInfo],
) -> None:
    """``urls``: the node's own Redis URL, and what its runner processes connect with (the
    ``runner`` ACL user)."""
    redis_url, runner_url = urls
    config = node.config
    await bootstrap(node)
    await migrate(node.store, await node.store.context_ids())
    warn_legacy(config)
    await migrate_peer_addresses(node.store, config)
    node.runners.isolation = await trio.to_thread.run_sync(find_isolation, config)
    contexts: set[int] = set()
    handler = LinkHandler(node, contexts)
    registry: Registry | None = None
    node.peers.breakers = PeerBreakers(
        BreakerConfig(config.breaker_failures, config.breaker_open_s, config.breaker_probes)
    )

    async def reload_peers() -> None:  # an unknown dialler may have just been registered
        if registry is not None:
            await registry.refresh()

    transport = Transport(
        node.identity.key,
        node.peers.known_peer_ids,
        handler.on_frame,
        handler.on_bad_frame,
        transport_config(config),
        reload_peers=reload_peers,
        on_refused=lambda _reason: node.counters.counted.set(),
        on_link=partial(_on_link, node),
        before_dial=node.peers.breakers.before_dial,
        acks_out=node.pressure.inbound.owed.settle,
    )
    node.peers.transport = transport
    async with trio.open_nursery() as services:
        host = bare_host(config.listen_host)  # "[::1]" names the address ::1
        try:
            port = await services.start(transport.serve, host, config.listen_port)
        except OSError as exc:
            what, setting = "the link listener", "listen_port"
            raise listen_error(what, host, config.listen_port, setting, exc) from None
        ws_url = link_url(scheme(config), host, port)
        registry = Registry(
            node, transport, services, contexts, ws_url=ws_url, redis_url=runner_url
        )
        await registry.refresh()
        await services.start(registry.resilient, "registry", registry.watch)
        await services.start(
            registry.resilient, "counters", run_counters, node.counters, node.store, transport
        )
        await services.start(registry.resilient, "links", run_link_info, node.store, transport)
        await services.start(registry.resilient, "trace asks", handler.traces.carry_asks, transport)
        writer = JobStatsWriter(node.job_stats, node.store, node.identity.node_id)
        await services.start(registry.resilient, "job statistics", writer.run)
        console_url = await _start_console(node, transport, handler.summaries, services)
        await services.start(registry.resilient, "dlq 0", run_dlq_watch, node, keys.ACTORS_DB)
        await services.start(
            registry.resilient, "breakers", run_breaker_publisher, node.peers.breakers, node.store
        )
        # room for itself and bounds: node/intake/pressure.py, node/intake/admission.py
        await services.start(registry.resilient, "pressure", run_pressure_watch, node)
        for raised in raised_bounds(config):
            log.warning("queue bound raised: %s", raised)
        if config.store.replicated:
            from node.host.store_tuning import run_store_tuning

            await services.start(
                registry.resilient,
                "store",
                run_store_tuning,
                node.store,
                redis_url,
                node.runners.primary_moved,
            )
        for up in registry.runners_up:  # ready means ready to run jobs
            await up.wait()
        registry.booted = True
        # published (node.json, node:info, the ready line) without its password: readers take
        # theirs from the home (node/host/acl.py)
        info = NodeInfo(
            node.identity.node_id,
            config.name,
            redact(redis_url),
            ws_url,
            os.getpid(),
            console_url=console_url,
            state=node,
        )
        fields = _node_fields(node, info)
        await services.start(registry.resilient, "node info", run_node_info, node.store, fields)
        _write_node_json(node, fields)
        log.info(
            "node %s (%s…) up: %s, redis %s",
            config.name,
            node.identity.node_id[:16],
            ws_url,
            info.redis_url,
        )
        task_status.started(info)
        if stop is not None:
            await stop.wait()
            await drain(node, services.cancel_scope)


async def _start_console(
    node: NodeState, transport: Transport, summaries: SummaryDesk, nursery: trio.Nursery
) -> str:
    """Serve the web console if configured; its URL ("" if off). The web stack is imported
    only then, so a node without a console never loads it. Raises ConsoleError (one line) if
    its address cannot be bound."""
    if not node.config.console.enabled:
        return ""
    from node.web.server import run_console

    url: str = await nursery.start(run_console, node, transport, summaries, node.config.console)
    return url


async def drain(node: NodeState, services: trio.CancelScope) -> None:
    """Graceful stop: no new jobs; running ones get grace_s to finish; then everything stops
    (jobs still running are killed and requeued by their runner)."""
    log.info(  # running_jobs: live runner processes (node/runners/processes.py), busy or not
        "stopping intake; %d runner process(es) finishing, grace %.0f s",
        node.shutdown.running_jobs,
        node.config.grace_s,
    )
    node.shutdown.stop_intake()
    with trio.move_on_after(node.config.grace_s) as grace:
        await node.shutdown.idle.wait()
    if grace.cancelled_caught:
        log.warning("grace period over; aborting %d runner process(es)", node.shutdown.running_jobs)
    services.cancel()


def transport_config(config: NodeConfig) -> TransportConfig:
    """Frame limits and link encryption (node/links/encryption.py)."""
    base = TransportConfig(
        max_frame_bytes=config.max_frame_bytes,
        handshake_timeout_s=config.handshake_timeout_s,
        max_pending=config.max_pending_links,
        max_pending_per_address=config.max_pending_links_per_address,
    )
    return with_encryption(base, config)


class Registry:
    """Starts services for contexts and peers as they are registered, also while running."""

    def __init__(
        self,
        node: NodeState,
        transport: Transport,
        nursery: trio.Nursery,
        contexts: set[int],
        *,
        ws_url: str = "",
        redis_url: str = "",
    ) -> None:
        """``redis_url``: what the runner processes connect with (the ``runner`` user's URL).
        Raises ConfigError if a [runners] type has no command (node/slot/commands.py)."""
        self.node = node
        self.transport = transport
        self.nursery = nursery
        self.contexts = contexts
        self.ws_url = ws_url
        self.redis_url = redis_url
        self.runners_up: list[trio.Event] = []  # one per context: its runner processes are up
        self.booted = False  # the node reported ready: contexts from now on are new ones
        # every [runners] type is accepted; a type with concurrency 0 has no local slot and no
        # command (external runners serve it, see docs/use/runners.md#external-runners)
        config = node.config
        validate_commands(config.commands, config.runners)
        commands = script_commands(config.runners, config.commands)
        self.script_types = {t: commands.get(t, []) for t in config.runners}
        self._refreshing = trio.Lock()
        # every service restart is counted on the node (Counters.restarts)
        self.resilient = partial(resilient, on_restart=node.counters.service_restarted)

    def slots(self, ctx: int) -> list[Slot]:
        """The local runner slots of context ``ctx`` (for registration and presence)."""
        config, out = self.node.config, []
        for script_type in self.script_types:
            group = config.runner_groups.get(script_type, "")
            for slot in range(config.runners[script_type]):
                bases = slot_bases(script_type, group, str(slot))
                out.append(
                    Slot(
                        runner_id(self.node.identity.node_id, ctx, script_type, slot),
                        script_type,
                        tuple(consume_order(bases)),
                        keys.inflight(f"runner:{script_type}:{slot}"),
                    )
                )
        return out

    async def refresh(self) -> None:
        """Start what was registered since the last refresh (one refresh at a time: registry
        events and the transport, for an unknown dialler, both ask for one)."""
        async with self._refreshing:
            await self._refresh()

    async def _refresh(self) -> None:
        for peer in await self.node.peers.load_peers(self.node.store):
            await self.nursery.start(self._run_peer, peer)
        for ctx in await self.node.store.context_ids():
            if ctx not in self.contexts:
                await self.nursery.start(self._run_context, ctx)
                self.contexts.add(ctx)

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Refresh on every registration event (BLPOP on node:events)."""
        task_status.started()
        while True:
            event = await records.next_registry_event(self.node.store, 30)
            if event is not None:
                log.info("registry event %s", event)
                self.node.registry.forget()
                await self.refresh()

    async def _run_peer(
        self, peer: Peer, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        resilient = self.resilient
        async with trio.open_nursery() as nursery:
            box = outbox.PeerOutbox(
                self.node.store, self.transport, peer.id, partial(undeliverable, self.node)
            )
            self.node.peers.outboxes[peer.id] = box
            await nursery.start(resilient, f"outbox {peer.name or peer.id[:16]}", box.run)
            if peer.address:
                nursery.start_soon(self.transport.dial_forever, peer.id, peer.address)
            task_status.started()

    async def _start_runners(self, nursery: trio.Nursery, ctx: int, up: trio.Event) -> None:
        iso = self.node.runners.isolation
        # no sandbox: no runner; jobs of their types are answered isolation_refused on admission
        # (node/intake/admission.py unrunnable), those queued before wait for a fixed host
        if iso is None or not iso.runs_jobs:
            why = iso.why if iso is not None else "isolation unknown"
            log.error("context %d: no runner started, jobs are not run: %s", ctx, why)
            up.set()
            return

        async def start(runner: RunnerSlot) -> None:
            script_type, command, slot = runner
            await nursery.start(
                self.resilient,
                f"runner {ctx}/{script_type}:{slot}",
                run_runner_process,
                self.node,
                ctx,
                script_type,
                command,
                slot,
                self.redis_url,
            )

        slots = slots_of(self.node, self.script_types)
        await start_in_stages(slots, start, staged=self.booted)
        up.set()

    async def _run_context(
        self, ctx: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        node, resilient = self.node, self.resilient
        async with trio.open_nursery() as nursery:
            await nursery.start(
                resilient, f"supervisor {ctx}", run_supervisor, node, ctx, set(self.script_types)
            )
            await nursery.start(
                resilient, f"consumer {ctx}", run_consumer, node, ctx, set(self.script_types)
            )
            await nursery.start(resilient, f"retries {ctx}", run_retry_scheduler, node, ctx)
            await nursery.start(resilient, f"deadlines {ctx}", run_deadlines, node, ctx)
            await nursery.start(resilient, f"held {ctx}", run_held, node, ctx)
            await nursery.start(resilient, f"flows {ctx}", run_flow_engine, node, ctx)
            await nursery.start(resilient, f"dlq {ctx}", run_dlq_watch, node, ctx)
            await nursery.start(resilient, f"fair share {ctx}", run_fair_share, node, ctx)
            # -- runner presence, external runners (node/runners/presence.py, external.py) --
            await nursery.start(resilient, f"results {ctx}", run_results, node, ctx)
            await nursery.start(resilient, f"reaper {ctx}", run_reaper, node, ctx)
            await nursery.start(
                resilient,
                f"presence {ctx}",
                run_presence,
                node.identity,
                node.store,
                ctx,
                self.slots(ctx),
                self.ws_url,
            )
            # -- end runner presence, external runners --
            # its runner processes start side by side, in the background: the context is served
            # (its messages acked) meanwhile; the node reports ready once they are up
            up = trio.Event()
            self.runners_up.append(up)
            nursery.start_soon(self._start_runners, nursery, ctx, up)
            log.info("serving context %d", ctx)
            task_status.started()


async def undeliverable(node: NodeState, ctx: int, key: str, refused: Refused) -> None:
    """A message the outbox cannot deliver: dead-lettered, and its sender told why."""
    try:
        message = await load_message(node, ctx, key)
    except Rejected:
        message = None
    rejected = Rejected(refused.reason, refused.detail)
    await reject(node, ctx, key, rejected, message, "outbox", queue=keys.MSG_OUT)


def _on_link(node: NodeState, peer_id: str, up: bool) -> None:
    """A link came up or failed: the peer's circuit breaker counts it; a link that came up may
    acknowledge messages a restart left held (node/intake/held.py)."""
    node.peers.breakers.on_link(peer_id, up)
    if up:
        node.wakeups.wake_held()


async def bootstrap(node: NodeState) -> None:
    """Kill scripts a crashed run left behind (not those still running a job's current attempt:
    their slots adopt them); on first start, register this home's default actor and its
    context (admin)."""
    config, store = node.config, node.store
    orphans = await kill_orphans_but_adoptable(node)
    if orphans:
        log.warning("killed %d script(s) a previous run of this node left running", orphans)
    if config.actor_key_path.exists() and await store.get_actor(config.actor_id) is None:
        actor_key = read_signing_key_file(config.actor_key_path, passphrase=passphrase_from_env())
        await store.put_actor(
            Actor(
                config.actor_id,
                actor_key.public_hex,
                created_at=now(),
                updated_at=now(),
                algorithm=actor_key.algorithm,
            )
        )
        log.info("registered default actor %d", config.actor_id)
    if await store.get_context(config.context_id) is None:
        await store.put_context(
            Context(config.context_id, admins=[config.actor_id], created_at=now(), updated_at=now())
        )
        log.info("created default context %d", config.context_id)


def isolation_fields(iso: Isolation | None) -> dict[str, str]:
    """What node:info says of the isolation (hero-node status, the console)."""
    if iso is None:
        return {}
    fields = {"isolation": iso.mode, "isolation_why": iso.why, "limits": iso.limits}
    fields["cpu_time"] = iso.cpu_time  # what cpu_s bounds: "job tree" or "process"
    return fields | {"bwrap": iso.bwrap_info, "isolation_fix": iso.fix}


def _node_fields(node: NodeState, info: NodeInfo) -> dict[str, str]:
    """What tells clients on this machine where the node is (DB 0 ``node:info``, kept there by
    node/observe/nodeinfo.py, and run/node.json)."""
    fields = {
        "id": info.node_id,
        "name": info.name,
        "ws_url": info.ws_url,
        "redis_url": info.redis_url,
        "pid": str(info.pid),
        "console_url": info.console_url,
        "started_at": str(now()),
        # whether processes of the node's uid may read its memory, or its signer's
        # (PR_SET_DUMPABLE, node/host/hardening.py): "0" is the safe answer
        "dumpable": str(int(is_dumpable())),
        "signer_dumpable": str(int(node.identity.signer is None or node.identity.signer.dumpable)),
    } | isolation_fields(node.runners.isolation)
    return fields | encryption_fields(node.config)


def _write_node_json(node: NodeState, fields: dict[str, str]) -> None:
    run_dir = node.config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / "node.json.tmp"
    tmp.write_text(json.dumps(fields, indent=2))
    tmp.replace(run_dir / "node.json")

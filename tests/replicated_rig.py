"""A node on a replicated store for the failover tests: a real primary, two replicas and three
Sentinels on free ports (node/host/replicated.py), the node a real `hero-node run` process whose
home names them in ``[store]``; everything stopped by its PID on exit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import coredis
import coredis.exceptions
import redis
import trio

from node.config.store import StoreConfig
from node.host.acl import CLIENT, NODE, ensure_secrets, role_url
from node.host.home import init_home
from node.host.launch import Ready, drain, start_node_process
from node.host.replicated import SENTINEL, SET_ROLES, ReplicatedSet

ROOT = Path(__file__).resolve().parents[1]


def sentinels_name(servers: ReplicatedSet, port: int) -> None:
    """Make every Sentinel name the server on ``port`` primary of the set, as after a
    promotion, while the servers themselves stay as they are (the primary keeps its replicas):
    the view a process gets when it asks the Sentinels from a primary they have replaced."""
    for sentinel_port in servers.sentinel_ports:
        sentinel = redis.Redis(
            "127.0.0.1", sentinel_port, username=SENTINEL, password=servers.passwords[SENTINEL]
        )
        with sentinel:
            sentinel.execute_command("SENTINEL", "REMOVE", servers.service)
            sentinel.execute_command("SENTINEL", "MONITOR", servers.service, "127.0.0.1", port, 2)


@dataclass
class Rig:
    home: Path
    servers: ReplicatedSet
    node: trio.Process
    node_url: str
    client_url: str
    ready: Ready  # the node's id and websocket URL (and console URL, if it serves one)
    log: Path  # the node's stderr

    def work(self, ctx: int = 1) -> Path:
        """Context ``ctx``'s work dir as the node and its sandboxes see it, while the node
        runs: with a disk quota it is an image mounted in the node's own mount namespace
        (node/sandbox/disk.py), and ``home/work/<ctx>`` seen from here is the empty dir under
        that mount. The plain path where the node's view is closed to this user (a node that
        is not dumpable, a test not run as root: no quota mount then either)."""
        plain = self.home / "work" / str(ctx)
        home = Path(f"/proc/{self.node.pid}/root") / self.home.relative_to("/")
        try:
            home.stat()  # the work dir itself may not be made yet
        except OSError:
            return plain
        return home / "work" / str(ctx)


@asynccontextmanager
async def replicated_node(
    tmp: Path,
    *,
    runners: dict[str, int] | None = None,
    waitaof: tuple[int, int] = (1, 1),
    waitaof_timeout_ms: int = StoreConfig.waitaof_timeout_ms,
    promise: str = StoreConfig.promise,
    console_listen: str = "",
) -> AsyncIterator[Rig]:
    home = tmp / "node"
    home.mkdir(parents=True)
    passwords = ensure_secrets(home, SET_ROLES)
    servers = ReplicatedSet(tmp / "store", passwords)
    try:
        await trio.to_thread.run_sync(servers.start)
        store = StoreConfig(
            sentinels=servers.sentinel_addresses,
            waitaof_local=waitaof[0],
            waitaof_replicas=waitaof[1],
            waitaof_timeout_ms=waitaof_timeout_ms,
            promise=promise,
        )
        config = init_home(
            home,
            name="r",
            listen_port=0,
            console_listen=console_listen,
            runners=runners or {"python": 4, "sh": 1},
            store=store,
        )
        log = (tmp / "node.log").open("ab")
        try:
            proc, ready = await start_node_process(home, stderr=log, cwd=ROOT)
            try:
                async with trio.open_nursery() as nursery:
                    assert proc.stdout is not None
                    nursery.start_soon(drain, proc.stdout)
                    yield Rig(
                        home,
                        servers,
                        proc,
                        role_url(config, "", NODE),
                        role_url(config, "", CLIENT),
                        ready,
                        tmp / "node.log",
                    )
                    nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    if proc.returncode is None:
                        proc.terminate()
                        with trio.move_on_after(30):
                            await proc.wait()
                    if proc.returncode is None:
                        proc.kill()
                        await proc.wait()
        finally:
            log.close()
    finally:
        await trio.to_thread.run_sync(servers.stop)


async def current_primary(rig: Rig) -> int:
    """The port of the server the Sentinels name primary (the first that answers)."""
    for port in rig.servers.sentinel_ports:
        sentinel: coredis.Redis[str] = coredis.Redis(
            "127.0.0.1",
            port,
            decode_responses=True,
            username=NODE,
            password=rig.servers.passwords[NODE],
        )
        try:
            async with sentinel:
                host_port = await sentinel.sentinel_get_master_addr_by_name(rig.servers.service)
        except (coredis.exceptions.RedisError, OSError):
            continue
        if host_port:
            return int(host_port[1])
    raise AssertionError("no Sentinel names a primary")


@asynccontextmanager
async def sentinel_events(
    rig: Rig, channels: list[str]
) -> AsyncIterator[trio.MemoryReceiveChannel[str]]:
    """Every Sentinel's announcements on ``channels`` ("channel text"), in the order they come,
    subscribed before the block starts (the leader of a failover announces its steps alone)."""
    send, receive = trio.open_memory_channel[str](1000)  # a failover announces ~20
    async with trio.open_nursery() as nursery, receive:
        async with send:
            for port in rig.servers.sentinel_ports:
                password = rig.servers.passwords[NODE]
                await nursery.start(_subscribed, port, password, channels, send.clone())
        yield receive
        nursery.cancel_scope.cancel()


async def _subscribed(
    port: int,
    password: str,
    channels: list[str],
    send: trio.MemorySendChannel[str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    sentinel: coredis.Redis[str] = coredis.Redis(
        "127.0.0.1", port, decode_responses=True, username=NODE, password=password
    )
    # entered once the server confirmed the subscription: a fault injected next is seen
    try:
        async with send, sentinel, sentinel.pubsub(channels=channels) as ps:
            task_status.started()
            async for message in ps:
                if message["type"] == "message":
                    await send.send(f"{message['channel']!s} {message['data']!s}")
    except* anyio.ClosedResourceError:
        pass  # coredis's pubsub, cancelled as it unsubscribes (the block ending)

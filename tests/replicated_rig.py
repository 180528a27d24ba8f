"""A node on a replicated store for the failover tests: a real primary, two replicas and three
Sentinels on free ports (node/host/replicated.py), the node a real `hero-node run` process whose
home names them in ``[store]``; everything stopped by its PID on exit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from node.config.store import StoreConfig
from node.host.acl import CLIENT, NODE, ensure_secrets, role_url
from node.host.home import init_home
from node.host.launch import Ready, drain, start_node_process
from node.host.replicated import SET_ROLES, ReplicatedSet

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Rig:
    home: Path
    servers: ReplicatedSet
    node: trio.Process
    node_url: str
    client_url: str
    ready: Ready  # the node's id and websocket URL


@asynccontextmanager
async def replicated_node(
    tmp: Path,
    *,
    runners: dict[str, int] | None = None,
    waitaof: tuple[int, int] = (1, 1),
    waitaof_timeout_ms: int = StoreConfig.waitaof_timeout_ms,
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
        )
        config = init_home(
            home,
            name="r",
            listen_port=0,
            console_listen="",
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

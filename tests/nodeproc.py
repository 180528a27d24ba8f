"""Nodes as real subprocesses (`hero-node run`), for tests where a crash or a signal is the point.

Each has fixed ports (listener and embedded Valkey) so it comes back where it was after a restart.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import trio

from node.config import load_config, render_config
from node.errors import NodeError
from node.host.acl import reachable_url, role_url
from node.host.home import init_home
from node.host.launch import start_node_process
from node.host.valkey import below_ephemeral, free_port, stop_stale
from node.sandbox.probe import sweep_leaves

ROOT = Path(__file__).resolve().parents[1]


STOPPED_BY = "hero-node: stopped by an unexpected error"


def stable_port() -> int:
    """A free TCP port below the kernel's ephemeral range, for a server that is restarted on
    the same port: a port ``bind(0)`` gave may meanwhile be the source port of an outgoing
    connection (they come from that range), and the restart's bind then fails.

    A probe only says the port is free now, not that no one else will take it before the
    server binds it: each pytest-xdist worker picks from its own slice of the range, and a
    worker never hands out a port twice."""
    first, low = below_ephemeral()
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    size = (low - first) // workers
    start = first + (worker % workers) * size
    return free_port((start, start + size))


class NodeProcess:
    def __init__(
        self, home: Path, name: str, *, netns: str = "", host: str = "", **init: object
    ) -> None:
        """``netns``: run inside that network namespace, listening on ``host`` (port 7700),
        its Valkey on its unix socket only (reached from here through the home)."""
        self.home = home
        self.name = name
        self.netns = netns
        self.listen_port = 7700 if netns else stable_port()
        self.valkey_port = 0 if netns else stable_port()
        if not netns:
            # probed and handed out like the others: the default (listen_port + an offset) is
            # not, and another test's server may hold it when the node binds
            init.setdefault("console_listen", f"127.0.0.1:{stable_port()}")
        self.config = init_home(
            home, name=name, listen_port=self.listen_port, valkey_port=self.valkey_port, **init
        )  # type: ignore[arg-type]
        # the tests' jobs announce themselves over TCP (tests/scripts.py): context 1 may use
        # the network, as in conftest.py's node_factory
        self.config = replace(self.config, sandbox={"1": {"network": True}})
        # no disk quota unless a test sets one (tests/sandbox/test_bounds.py): a quota mounts
        # each context's work dir in the node's own mount namespace, and these tests' jobs
        # share their files with the test through the work dir as the host sees it
        self.config = replace(self.config, limits={"disk_mb": 0})
        self.config.config_path.write_text(render_config(self.config), encoding="utf-8")
        if host:
            set_node(home, listen_host=f'"{host}"')
            self.config = load_config(home)
        self.proc: trio.Process | None = None
        self.node_id = ""
        self.ws_url = f"ws://{host or '127.0.0.1'}:{self.listen_port}"
        self.redis_url = role_url(self.config, reachable_url(self.config))  # as the node
        self.log = home / "node.log"

    async def start(self) -> None:
        """Start `hero-node run` and wait (bounded) for its ready line."""
        with self.log.open("ab") as logf:  # noqa: ASYNC230 - a local file, opened once
            try:
                self.proc, ready = await start_node_process(
                    self.home,
                    stderr=logf,
                    cwd=ROOT,
                    prefix=["ip", "netns", "exec", self.netns] if self.netns else [],
                )
            except NodeError as exc:
                raise RuntimeError(f"{self.name} died: {self.log.read_text()[-2000:]}") from exc
        self.node_id = ready.node_id

    def death(self) -> str:
        """How the node ended if its process exited before it was stopped ("" while it runs):
        the exit code and the end of its log, for a failing test's report."""
        if self.proc is None or self.proc.returncode is None:
            return ""
        text = self.log.read_text(errors="replace")
        # the node names what stopped it before a traceback the tail may not reach back to
        why = [line for line in text.splitlines() if line.startswith(STOPPED_BY)]
        said = "".join(f"{line}\n" for line in why)
        code = self.proc.returncode
        return f"{self.name} exited with {code}:\n{said}its log ends:\n{text[-4000:]}"

    async def signal_and_wait(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        with trio.fail_after(timeout_s):
            return await self.proc.wait()

    async def kill(self) -> None:
        await self.signal_and_wait(signal.SIGKILL)

    async def close(self) -> None:
        """Stop the node (SIGTERM, then SIGKILL) and any Valkey a killed run of it left."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            with trio.move_on_after(30):
                await self.proc.wait()
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()
        await trio.to_thread.run_sync(stop_stale, self.config.valkey_dir)
        await trio.to_thread.run_sync(sweep_leaves, self.home)  # a killed node could not


def set_node(home: Path, **values: object) -> None:
    """Rewrite settings of config.toml (values as TOML) before the node starts: each line
    ``name = ...`` init wrote ([node]'s, or [runners]' ``python`` and ``sh``)."""
    path = home / "config.toml"
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        name = line.split("=", 1)[0].strip()
        if name in values:
            lines[i] = f"{name} = {values[name]}"
    path.write_text("\n".join(lines) + "\n")

"""Starting `hero-node run` as a child process and knowing when it is ready.

The node prints one ready line on stdout once every service is up (see :func:`ready_line`);
the testnet, the benchmarks and the tests start nodes with :func:`start_node_process`, which
waits (bounded) for that line and returns what it says.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

import trio

from bus.client.api import open_client
from crypto import KeyPair
from node.config import load_config
from node.errors import NodeError
from node.host.acl import NODE, role_url

READY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Ready:
    """What a started node announced: its id, websocket URL, Redis URL and console URL."""

    node_id: str
    ws_url: str
    redis_url: str
    console_url: str = ""  # the web console, if the node serves one


def ready_line(name: str, ready: Ready) -> str:
    console = f" console {ready.console_url}" if ready.console_url else ""
    return (
        f"hero-node {name} ready: id {ready.node_id} listen {ready.ws_url} redis {ready.redis_url}"
        + console
    )


def parse_ready_line(line: str) -> Ready:
    """The announcement in a ready line; NodeError if ``line`` is not one."""
    words = line.split()
    try:
        ready = Ready(*(words[words.index(w) + 1] for w in ("id", "listen", "redis")))
    except (ValueError, IndexError):
        raise NodeError(f"not a ready line: {line.strip()[:200]!r}") from None
    if "console" in words[:-1]:
        ready = replace(ready, console_url=words[words.index("console") + 1])
    return ready


async def start_node_process(
    home: Path,
    *,
    log_level: str = "info",
    stderr: IO[bytes] | None = None,
    cwd: Path | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
    prefix: Sequence[str] = (),
) -> tuple[trio.Process, Ready]:
    """Run `hero-node --home HOME run`; return the process once it is ready, and its
    announcement with a Redis URL that authenticates as the node (from the home).

    Raises NodeError if it exits or does not get ready within ``ready_timeout_s`` (it is
    then killed). The caller owns the process and must drain its stdout (:func:`drain`).
    ``prefix`` runs the node under a command that then execs it (``ip netns exec NAME``).
    """
    proc = await trio.lowlevel.open_process(
        [
            *prefix,
            sys.executable,
            "-m",
            "node.cli",
            "--home",
            str(home),
            "--log-level",
            log_level,
            "run",
        ],
        stdout=subprocess.PIPE,
        stderr=stderr,
        cwd=cwd,
    )
    assert proc.stdout is not None
    try:
        with trio.fail_after(ready_timeout_s):
            line = await _read_line(proc.stdout)
        if "ready:" not in line:
            raise NodeError(f"the node at {home} did not start (see its log): {line!r}")
        ready = parse_ready_line(line)
        # the ready line names the URL without its password; the home has it
        url = role_url(load_config(home), ready.redis_url, NODE)
        return proc, replace(ready, redis_url=url)
    except BaseException:
        with trio.CancelScope(shield=True):
            proc.kill()
            await proc.wait()
        raise


async def _read_line(stream: trio.abc.ReceiveStream) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some(1)
        if not chunk:
            break
        data += chunk
    return data.decode()


async def drain(stream: trio.abc.ReceiveStream) -> None:
    """Copy what a node prints after its ready line to our stdout (and keep its pipe empty)."""
    async for chunk in stream:
        sys.stdout.write(chunk.decode(errors="replace"))


async def wire_mesh(
    nodes: Iterable[tuple[str, Ready]], actor: KeyPair, actor_id: int, context_id: int
) -> None:
    """Every node (name, announcement) knows every other with its address, and ``actor`` as
    ``actor_id``, admin of ``context_id``."""
    nodes = list(nodes)
    for _name, node in nodes:
        async with open_client(node.redis_url) as client:
            for other_name, other in nodes:
                if other is not node:
                    await client.add_peer(other.node_id, other.ws_url, name=other_name)
            await client.register_actor(actor_id, actor.public_hex)
            await client.register_context(context_id, admins=[actor_id])

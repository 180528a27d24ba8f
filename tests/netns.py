"""A namespaced testnet: each node in its own network namespace, faults made with nftables.

Layout: one hub namespace holds a bridge; each node namespace has one veth (``e0``) into it,
with an address of 198.18.0.0/24 (RFC 2544's benchmark range; it exists only inside these
namespaces, so no traffic leaves them). Faults are nftables rules inside the node namespaces,
on their input hook (a packet to a node is dropped where it arrives):

- loss: each packet from another node dropped with probability ``percent`` (``numgen random``),
  so every link loses that much in each direction;
- a partition: everything from the other side dropped, at both ends;
- a one-way partition: packets from A to B dropped at B; B to A still flow.

Everything is made and removed by name (a run's names carry a random tag: under a private pid
namespace every run has the same pid): :func:`netlab` deletes the namespaces in its ``finally``,
which removes their veths, the bridge and every rule with them. Root only: :func:`require_root`
skips elsewhere, and fails instead under CI.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import pytest
import trio

SUBNET = "198.18.0"
LOSS_TABLE, CUT_TABLE = "hero_loss", "hero_cut"


def require_root() -> None:
    """Skip (fail under CI=true) unless this can make namespaces and nftables rules."""
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    why = ""
    if os.geteuid() != 0:
        why = "needs root (ip netns, veth pairs, nftables rules)"
    elif missing:
        why = f"needs {' and '.join(missing)} (Debian: iproute2, nftables)"
    if why and os.environ.get("CI") == "true":
        pytest.fail(f"the namespaced testnet {why}; CI runs as root with both installed")
    if why:
        pytest.skip(f"the namespaced testnet {why}")


async def run(*argv: str, stdin: bytes = b"", check: bool = True) -> None:
    await trio.run_process(
        list(argv), stdin=stdin, check=check, capture_stdout=True, capture_stderr=True
    )


class NetLab:
    def __init__(self, n: int, tag: str) -> None:
        self.tag = tag
        self.hub = f"{tag}-hub"
        self.names = [f"{tag}-{i}" for i in range(n)]

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    async def create(self) -> None:
        await run("ip", "netns", "add", self.hub)
        await run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        await run("ip", "-n", self.hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            await run("ip", "netns", "add", ns)
            port = f"p{i}"
            await run(
                *("ip", "-n", self.hub, "link", "add", port, "type", "veth"),
                *("peer", "name", "e0", "netns", ns),
            )
            await run("ip", "-n", self.hub, "link", "set", port, "master", "br0", "up")
            await run("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "e0")
            await run("ip", "-n", ns, "link", "set", "e0", "up")
            await run("ip", "-n", ns, "link", "set", "lo", "up")

    async def destroy(self) -> None:
        """Delete every namespace of this net by name (their links and rules go with them)."""
        for ns in [*self.names, self.hub]:
            await run("ip", "netns", "delete", ns, check=False)

    async def _table(self, i: int, table: str, rules: Iterable[str]) -> None:
        chain = "\n".join(f"    {rule};" for rule in rules)
        text = (
            f"table inet {table} {{\n  chain input {{\n"
            f"    type filter hook input priority 0; policy accept;\n{chain}\n  }}\n}}\n"
        )
        await run("ip", "netns", "exec", self.names[i], "nft", "-f", "-", stdin=text.encode())

    async def _drop_table(self, i: int, table: str) -> None:
        await run(
            *("ip", "netns", "exec", self.names[i]),
            *("nft", "delete", "table", "inet", table),
            check=False,
        )

    async def loss(self, percent: int) -> None:
        """Every link loses ``percent`` % of its packets, each way."""
        rule = f'iifname "e0" numgen random mod 100 < {percent} counter drop'
        for i in range(len(self.names)):
            await self._table(i, LOSS_TABLE, [rule])

    async def partition(self, side: set[int]) -> None:
        """Nodes in ``side`` and the others stop hearing each other (silently: no reset)."""
        others = set(range(len(self.names))) - side
        for group, far in ((side, others), (others, side)):
            sources = ", ".join(self.address(j) for j in sorted(far))
            for i in group:
                await self._table(i, CUT_TABLE, [f"ip saddr {{ {sources} }} counter drop"])

    async def one_way(self, src: int, dst: int) -> None:
        """Packets from ``src`` to ``dst`` are dropped; ``dst`` to ``src`` still flow."""
        await self._table(dst, CUT_TABLE, [f"ip saddr {self.address(src)} counter drop"])

    async def dropped(self, table: str = CUT_TABLE) -> int:
        """Packets the rules of ``table`` dropped so far, in every node namespace (a table
        that :meth:`heal` removed counts no more)."""
        total = 0
        for ns in self.names:
            done = await trio.run_process(
                ["ip", "netns", "exec", ns, "nft", "list", "table", "inet", table],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            total += sum(int(n) for n in re.findall(rb"counter packets (\d+)", done.stdout))
        return total

    async def heal(self) -> None:
        """End partitions (loss stays)."""
        for i in range(len(self.names)):
            await self._drop_table(i, CUT_TABLE)


def leftovers(tag: str) -> list[str]:
    """Namespaces whose names carry ``tag`` (after a run: none)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in listed.stdout.splitlines() if line.startswith(tag)]


@asynccontextmanager
async def netlab(n: int) -> AsyncIterator[NetLab]:
    """``n`` node namespaces on a bridge, removed afterwards whatever happens (the caller
    stops the processes it ran inside them first)."""
    tag = f"hn{secrets.token_hex(3)}"
    net = NetLab(n, tag)
    try:
        await net.create()
        yield net
    finally:
        with trio.CancelScope(shield=True):
            await net.destroy()

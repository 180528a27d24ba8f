"""A peer of a node under test, on our own Transport, that keeps the ``tell`` frames the node
answers it with: the other end of a real, authenticated link, for sending the node asks and
tells a real node would not (tests/observe/test_job_trace.py, tests/web/test_grid_summary.py)."""

from __future__ import annotations

import trio

from bus.core.frames import Frame
from bus.wire.transport import Link, Transport, TransportConfig
from crypto import KeyPair


class FakePeer:
    """Keeps the tells it gets by ask id; ``of``: only those of that kind ("summary")."""

    def __init__(self, of: str | None = None) -> None:
        self.key = KeyPair.generate()
        self.of = of
        self.tells: dict[int, dict] = {}
        self.got = trio.Event()

    async def on_frame(self, link: Link, frame: Frame) -> None:
        if frame.type == "tell" and (self.of is None or frame.body.get("of") == self.of):
            self.tells[frame.body["tell"]["ask"]] = frame.body["tell"]
            self.got.set()
            self.got = trio.Event()

    async def on_bad_frame(self, link: Link, detail: str) -> None:
        raise AssertionError(f"the node sent a bad frame: {detail}")

    async def told(self, ask_id: int) -> dict:
        while ask_id not in self.tells:
            await self.got.wait()
        return self.tells[ask_id]


async def link_fake_peer(
    nursery: trio.Nursery,
    node,  # noqa: ANN001 - conftest.RunningNode
    *,
    name: str = "fake",
    of: str | None = None,
) -> tuple[FakePeer, Link]:
    """A :class:`FakePeer` that ``node`` knows by ``name`` (no address: the peer dials, in
    ``nursery``), and its link to ``node`` once authenticated (within 30 s)."""
    peer = FakePeer(of)
    await node.client.add_peer(peer.key.public_hex, "", name=name)
    transport = Transport(
        peer.key, lambda: {node.node_id}, peer.on_frame, peer.on_bad_frame, TransportConfig()
    )
    nursery.start_soon(transport.dial_forever, node.node_id, node.info.ws_url)
    with trio.fail_after(30):
        return peer, await transport.wait_link(node.node_id)

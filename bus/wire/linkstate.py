"""What a node knows of each peer link, in memory: up or down since when, when the peer was
last heard from, the round-trip time of the last websocket ping, and why the last dial failed.

The transport updates it as links come and go (:class:`bus.wire.transport.Transport` ``states``);
the node publishes it (node/observe/linkinfo.py) where ``hero-node status`` and the web console read
it. No I/O here: a change only sets :attr:`LinkStates.changed`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Final

import trio

from bus.core.ids import now

UP: Final = "up"
DOWN: Final = "down"


@dataclass
class LinkState:
    """One peer's link. Times are wall-clock unix seconds (0: never); ``rtt_ms`` is -1 until a
    ping was answered; ``error`` says why the link is down ("" while up)."""

    state: str = DOWN
    since: int = 0
    last_seen: int = 0
    rtt_ms: float = -1.0
    error: str = ""
    # what protects the last link that came up ("TLSv1.3 <cipher>"), or "" and why not
    encryption: str = ""
    plaintext: str = ""


class LinkStates:
    """Every peer's :class:`LinkState`, by node id; ``changed`` is set on each change."""

    def __init__(self) -> None:
        self._states: dict[str, LinkState] = {}
        self.changed = trio.Event()

    def of(self, peer_id: str) -> LinkState:
        """The peer's live state. A link's reader stamps ``last_seen`` on it for every frame
        from the peer (an answered ping does, through :meth:`rtt`), published with the next
        change, so that a busy link costs neither an extra write nor a call per frame."""
        state = self._states.get(peer_id)
        if state is None:
            state = self._states[peer_id] = LinkState()
        return state

    def _touch(self) -> None:
        self.changed.set()

    def up(self, peer_id: str, encryption: str = "", plaintext: str = "") -> None:
        """A link came up, protected by ``encryption`` ("" for cleartext, ``plaintext`` why)."""
        state = self.of(peer_id)
        stamp = now()
        state.state, state.since, state.last_seen, state.error = UP, stamp, stamp, ""
        state.encryption, state.plaintext = encryption, plaintext
        self._touch()

    def down(self, peer_id: str, error: str) -> None:
        """The link closed or could not be opened; ``since`` keeps the first moment of an
        outage across failed redials, so that it says how long the peer has been away."""
        state = self.of(peer_id)
        if state.state != DOWN or not state.since:
            state.state, state.since = DOWN, now()
        state.error = error or "link closed"
        self._touch()

    def rtt(self, peer_id: str, seconds: float) -> None:
        state = self.of(peer_id)
        state.rtt_ms, state.last_seen = round(seconds * 1000, 3), now()
        self._touch()

    def get(self, peer_id: str) -> LinkState:
        """A copy of one peer's state (a peer never linked: down since 0)."""
        state = self._states.get(peer_id)
        return LinkState() if state is None else LinkState(**asdict(state))

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Every state as a JSON-ready dict, by peer id; re-arms :attr:`changed` first, so a
        change made after the snapshot is reported next time."""
        self.changed = trio.Event()
        return {peer: asdict(state) for peer, state in sorted(self._states.items())}

"""One circuit breaker per peer (bus/core/breaker.py), fed by the links' fate.

The transport reports each link that came up (a success) and each dial, handshake or link
that failed (a failure), and asks before each dial: while a peer's breaker is open the dialer
waits, and half-open it lets one probe through. The supervisor refuses a job message for a peer
whose breaker is open when its ack deadline comes before the next probe (``peer_unavailable``:
it could only end in ``timeout_ack``). The node publishes their states in ``node:info``
(node/links/peer_breakers.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import trio

from bus.core.breaker import Breaker, BreakerConfig, BreakerState
from bus.core.ids import now

log = logging.getLogger(__name__)


class PeerBreakers:
    """The breakers of every peer, on trio's clock (``clock``: for tests)."""

    def __init__(
        self,
        config: BreakerConfig | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.config = config or BreakerConfig()
        self._clock = clock
        self._breakers: dict[str, Breaker] = {}
        self._opened_wall: dict[str, int] = {}  # when each opened, in Unix seconds (shown)
        self.changed = trio.Event()  # set (and replaced) at each change of a breaker

    def get(self, peer_id: str) -> Breaker:
        return self._breakers.get(peer_id) or Breaker(self.config)

    def state(self, peer_id: str) -> BreakerState:
        return self.get(peer_id).state(self._clock())

    def link_up(self, peer_id: str) -> None:
        self._set(peer_id, self.get(peer_id).succeeded(self._clock()))

    def link_failed(self, peer_id: str) -> None:
        self._set(peer_id, self.get(peer_id).failed(self._clock()))

    def on_link(self, peer_id: str, up: bool) -> None:
        """The transport's report: a link came up, or a dial or link failed."""
        (self.link_up if up else self.link_failed)(peer_id)

    async def before_dial(self, peer_id: str) -> None:
        """Return when a dial to ``peer_id`` may start: at once while its breaker is closed,
        else once it is half-open with a probe free (or closed again by a link the peer
        dialled)."""
        while True:
            allowed, breaker = self.get(peer_id).attempt(self._clock())
            if allowed:
                self._breakers[peer_id] = breaker
                return
            changed = self.changed
            # open: until probes may go; half-open with every probe out: until one ends
            probe_at = breaker.probe_at()
            opened = breaker.state(self._clock()) is BreakerState.OPEN and probe_at is not None
            with trio.move_on_at(probe_at if opened and probe_at is not None else math.inf):
                await changed.wait()

    def refusal(self, peer_id: str, ack_in_s: float) -> str | None:
        """Why a message for ``peer_id`` that must be acknowledged within ``ack_in_s`` cannot
        be, or None: its breaker is open until after that."""
        clock = self._clock()
        breaker = self.get(peer_id)
        probe_at = breaker.probe_at()
        if breaker.state(clock) is not BreakerState.OPEN or probe_at is None:
            return None
        wait_s = probe_at - clock
        if ack_in_s >= wait_s:
            return None
        return (
            f"the link to {peer_id[:16]}… failed {breaker.failures} times in a row; its next "
            f"try is in {wait_s:.0f} s, after the ack deadline (in {max(ack_in_s, 0):.0f} s)"
        )

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Each peer with a breaker that saw a failure: state, failures, and while not closed
        when it opened (Unix s) and the seconds until a probe may go."""
        clock, out = self._clock(), {}
        for peer_id, breaker in sorted(self._breakers.items()):
            state = breaker.state(clock)
            if state is BreakerState.CLOSED and not breaker.failures:
                continue
            entry: dict[str, Any] = {"state": state.value, "failures": breaker.failures}
            probe_at = breaker.probe_at()
            if probe_at is not None:
                entry["opened_at"] = self._opened_wall.get(peer_id, 0)
                entry["probe_in_s"] = round(max(0.0, probe_at - clock), 1)
            out[peer_id] = entry
        return out

    def _set(self, peer_id: str, breaker: Breaker) -> None:
        before = self.get(peer_id)
        self._breakers[peer_id] = breaker
        clock = self._clock()
        was, now_state = before.state(clock), breaker.state(clock)
        if breaker.opened_at is not None and breaker.opened_at != before.opened_at:
            self._opened_wall[peer_id] = now()
            log.warning(
                "circuit breaker of peer %s… open: %d failures in a row; next try in %.0f s",
                peer_id[:16],
                breaker.failures,
                self.config.open_s,
            )
        elif was is not BreakerState.CLOSED and now_state is BreakerState.CLOSED:
            log.info("circuit breaker of peer %s… closed: the link is up", peer_id[:16])
        if before != breaker:
            self.changed.set()
            self.changed = trio.Event()

"""One job's, message's or flow's hop timeline for the console: the document ``hero-node job
trace --json`` prints (node/cli/schemas/job-trace.json), gathered the same way
(node/links/asks.py), for the page to draw.

A peer tells its part of a trace only to an actor who may read the context there, and the ask
is signed by that actor (bus/core/traces.py). The console asks as its home's actor, the one
``hero-node`` commands run as by default (``actor.key`` in the node's home): a console reader
sees what that actor would see with ``job trace``, which holds no script, environment value or
output. Without a readable actor key (none, or one under a passphrase) the timeline holds this
node's part only, and each peer is named with the reason it was not asked.
"""

from __future__ import annotations

import logging
from typing import Any

from bus.core.traces import is_traceable
from crypto import CryptoError, read_signing_key_file
from node.links.asks import Asker, gather_trace, subject
from node.state import NodeState

log = logging.getLogger(__name__)


class Tracer:
    """Timelines, asked as ``asker``."""

    def __init__(self, node: NodeState, asker: Asker, wait_s: float) -> None:
        self.node, self.asker, self.wait_s = node, asker, wait_s

    @classmethod
    def of_home(cls, node: NodeState, wait_s: float) -> Tracer:
        """Asking as the home's actor, if its key can be read without a passphrase."""
        own, actor = node.identity.node_id, node.config.actor_id
        try:
            signer = read_signing_key_file(node.config.actor_key_path, passphrase=None)
        except (CryptoError, OSError) as exc:
            why = f"the console cannot read this home's actor key ({type(exc).__name__})"
            log.info("console: timelines hold this node's part only: %s", why)
            return cls(node, Asker(node.store, None, actor, own, why), wait_s)
        return cls(node, Asker(node.store, signer, actor, own), wait_s)

    async def timeline(self, ctx: int, key: str) -> dict[str, Any] | None:
        """The trace document of ``key`` in ``ctx``, None if this node holds no record of it.
        Raises ValueError if ``key`` names nothing a trace follows, StoreError if Valkey
        fails."""
        key = subject(key)
        if not is_traceable(key):
            raise ValueError(f"{key[:80]!r} is not a job, message or flow key")
        names = {p.id: p.name for p in self.node.peers.known.values()}
        names[self.node.identity.node_id] = self.node.config.name
        return await gather_trace(self.asker, ctx, key, names, self.wait_s)

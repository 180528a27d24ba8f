"""Who may run what: the caller's signature, freshness and permission in a context.

One check for the supervisor (outgoing) and the consumer (incoming). Actors and contexts come
from the node's short-lived cache; any refusal is re-checked against Redis before it stands, so
a key or permission granted a moment ago is never refused because of the cache.
"""

from __future__ import annotations

from bus.ids import now
from bus.models import Message
from bus.verify import judge
from node.routing.messages import Rejected
from node.state import NodeState


async def authorise_caller(node: NodeState, ctx: int, message: Message) -> None:
    """Raise Rejected (unknown_signer, bad_signature, expired, from_future, unknown_context,
    permission_denied) unless ``message``'s caller signed it and may execute in ``ctx``."""
    try:
        await _check(node, ctx, message, fresh=False)
    except Rejected:
        node.forget_registry()
        await _check(node, ctx, message, fresh=True)


async def _check(node: NodeState, ctx: int, message: Message, *, fresh: bool) -> None:
    caller = message.caller_id
    actor = await (node.store.get_actor(caller) if fresh else node.actor(caller))
    verdict = judge(message, actor.pubkey if actor else None, now=now(), freshness=node.freshness)
    if not verdict.ok:
        raise Rejected(verdict.reason, f"actor {caller}: {verdict.detail}")
    context = await (node.store.get_context(ctx) if fresh else node.context(ctx))
    if context is None:
        raise Rejected("unknown_context", f"context {ctx} does not exist on this node")
    if not context.may_execute(caller):
        raise Rejected(
            "permission_denied", f"actor {caller} is not admin/executor of context {ctx}"
        )

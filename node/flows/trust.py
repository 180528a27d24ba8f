"""Who may run a flow job: the checks on actor-signed flow documents and node-signed flow jobs.

See bus/core/flows.py for the trust design. :func:`check_flow_doc` is shared by the origin's flow
engine (once per evaluation) and by :func:`authorise_flow_job`, which the consumer runs on every
incoming ``flow_job`` message before materialising it. Both raise
:class:`node.errors.Rejected` with a reason token.
"""

from __future__ import annotations

from bus.core.dag import FlowError, validate_flow
from bus.core.flows import FlowDoc, FlowJobPayload, verify_flow
from bus.core.ids import now
from bus.core.models import Message
from bus.core.reasons import Reason
from bus.core.verify import judge, permission_problem
from bus.errors import ModelError
from bus.store import records
from node.errors import Rejected
from node.state import NodeState

# a flow refused for its key or signature algorithm says so, as a message would
_KEY_REASONS = (
    Reason.WRONG_ALGORITHM,
    Reason.MALFORMED_KEY,
    Reason.UNCOMPRESSED_KEY,
    Reason.INVALID_POINT,
    Reason.HIGH_S,
)


async def check_flow_doc(node: NodeState, doc_dict: object, signatures: object) -> FlowDoc:
    """Parse the document and check the actor's signature against its key registered here,
    its DAG and its validity period. Raises Rejected (malformed, unknown_signer,
    bad_signature, wrong_signer, expired, from_future, invalid_flow)."""
    try:
        doc = FlowDoc.from_dict(doc_dict)
    except (FlowError, ModelError) as exc:
        raise Rejected(Reason.MALFORMED, f"flow document: {exc}") from None
    actor = await node.store.get_actor(doc.caller_id)
    if actor is None:
        raise Rejected(Reason.UNKNOWN_SIGNER, f"actor {doc.caller_id} is not registered here")
    assert isinstance(doc_dict, dict)  # from_dict accepted it
    accepted = node.identity.algorithms.accepted(doc.context_id)
    verdict = verify_flow(doc_dict, signatures, actor.pubkey, actor.algorithm, accepted)
    if not verdict.ok:
        precise = verdict.reason in (Reason.WRONG_SIGNER, *_KEY_REASONS)
        reason = Reason(verdict.reason) if precise else Reason.BAD_SIGNATURE
        raise Rejected(reason, f"flow {doc.id} of actor {doc.caller_id}: {verdict.detail}")
    stamp = now()
    if stamp > doc.expires_at:
        raise Rejected(Reason.EXPIRED, f"flow {doc.id} expired {stamp - doc.expires_at} s ago")
    if doc.created_at - stamp > node.identity.freshness.max_skew_s:
        raise Rejected(
            Reason.FROM_FUTURE, f"flow {doc.id} is dated {doc.created_at - stamp} s ahead"
        )
    try:
        validate_flow(doc.spec)
    except FlowError as exc:
        raise Rejected(Reason.INVALID_FLOW, str(exc)) from None
    return doc


async def check_may_execute(node: NodeState, ctx: int, actor_id: int) -> None:
    """Rejected('permission_denied'/'unknown_context') unless the actor may execute in ctx
    (the rule actors' messages are admitted by: bus.core.verify.permission_problem)."""
    denied = permission_problem(await node.store.get_context(ctx), ctx, actor_id)
    if denied is not None:
        raise Rejected.by_verdict(denied)


async def authorise_flow_job(node: NodeState, ctx: int, message: Message) -> None:
    """Check an incoming ``flow_job`` message (see bus/core/flows.py); Rejected if it may not run.

    Order: origin node's signature and freshness, payload shape, the actor-signed document,
    that the document belongs to this origin and caller, that the job targets this node and
    context and is exactly the signed job with the node-signed inputs, the actor's permission
    here, and the once-only claim on the job key (``replay`` if another message claimed it).
    """
    signer = message.origin if node.peers.is_known_node(message.origin) else None
    verdict = judge(message, signer, now=now(), freshness=node.identity.freshness)
    if not verdict.ok:
        raise Rejected.by_verdict(verdict, "origin node")
    try:
        payload = FlowJobPayload.decode(message.message)
    except ModelError as exc:
        raise Rejected(Reason.MALFORMED, str(exc)) from None
    doc = await check_flow_doc(node, payload.flow, payload.flow_signatures)
    if doc.origin != message.origin or doc.caller_id != message.caller_id:
        raise Rejected(
            Reason.WRONG_SIGNER, f"flow {doc.id} was submitted elsewhere or by another actor"
        )
    _check_job(node, ctx, message, doc, payload)
    await check_may_execute(node, ctx, doc.caller_id)
    await _claim(node, ctx, message, doc)


def _check_job(
    node: NodeState, ctx: int, message: Message, doc: FlowDoc, payload: FlowJobPayload
) -> None:
    try:
        job = doc.job(payload.job)
    except FlowError as exc:
        raise Rejected(Reason.MALFORMED, str(exc)) from None
    if job.node != node.identity.node_id or job.context_id != ctx or message.context_id != ctx:
        raise Rejected(Reason.WRONG_DESTINATION, f"flow job {job.id} is not for this node/context")
    if set(payload.inputs) != set(job.depends):
        raise Rejected(
            Reason.MALFORMED, f"flow job {job.id}: inputs do not match its prerequisites"
        )
    expected = doc.runner_job(job.id, payload.inputs, 0).signed_dict()
    if [j.signed_dict() for j in message.job] != [expected]:
        raise Rejected(Reason.MALFORMED, f"flow job {job.id} differs from the actor-signed flow")


async def _claim(node: NodeState, ctx: int, message: Message, doc: FlowDoc) -> None:
    """Claim the job key for this message (TTL: until the flow expires, plus the window)."""
    job_key = message.job[0].key
    ttl_s = max(doc.expires_at - now(), 0) + node.identity.freshness.window_s
    holder = await records.claim_flow_job(node.store, ctx, job_key, message.key, ttl_s)
    if holder is not None:
        raise Rejected(Reason.REPLAY, f"flow job {job_key} was already released by {holder}")

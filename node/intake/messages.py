"""What follows a message's judgement, shared by the supervisor and the consumer, other than
materialising its jobs: refusing it (dead letter, its sender told) and results (built, queued,
recognised as signed here). The judgement itself is node/intake/admission.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from bus.core import keys
from bus.core.envelope import ResultBody, build_result, reply_text, sign_message
from bus.core.ids import now
from bus.core.models import JobStatus, Message, MessageStatus, MessageType, RunnerJob
from bus.core.reasons import Reason
from bus.core.text import printable
from bus.errors import StoreError
from bus.store import records
from bus.store.atomic import routing as atomic_routing
from node.errors import Rejected
from node.state import NodeState

log = logging.getLogger(__name__)


async def reject(
    node: NodeState,
    ctx: int,
    key: str,
    exc: Rejected,
    message: Message | None,
    service: str,
    *,
    queue: str = "",
) -> None:
    """Dead-letter a message with its reason, mark it failed, and tell its sender why.

    The sender is told through error results for each of its jobs (only for job messages whose
    origin is a node we know), so a client waiting on the reply list does not wait forever.
    """
    log.warning(
        "%s rejected %s (context %d): %s",
        service,
        printable(key),
        ctx,
        exc,
        extra={"message_key": printable(key), "ctx": ctx, "reason": str(exc.reason)},
    )
    node.counters.count(f"rejected_{exc.reason}")
    await node.store.dead_letter(ctx, key, exc.reason, exc.detail, queue=queue)
    if message is None and queue == keys.MSG_OUT:
        await _answer_unparsed(node, ctx, key, exc, service)
    if message is None or exc.reason == Reason.REPLAY:  # a replay's hash is the original's: keep it
        return
    try:
        await _mark_refused(node, ctx, key, exc, message)
    except StoreError:
        raise
    except Exception:  # the dead letter is written; a flaw in telling the sender stops nothing
        log.exception("%s could not tell the sender of %s why", service, printable(key))


async def _answer_unparsed(
    node: NodeState, ctx: int, key: str, exc: Rejected, service: str
) -> None:
    """A message of this node's own clients (``msg_out``) that cannot even be parsed (a
    negative timeout, say) gets no result message, which needs a parsed request: its waiting
    client is answered here, on its reply list, with one error per job the hash names (one
    without a job key if it names none), so that it stops waiting at once: the reply every
    other end writes (:func:`bus.core.envelope.reply_text`)."""
    why, error = f"{exc.reason}: {exc.detail}", JobStatus.ERROR.value
    try:
        jobs = _job_keys(await records.read_message(node.store, ctx, key)) or [""]
        replies = [reply_text(key, job, error, {}, why) for job in jobs]
        reply = keys.reply(key)
        await records.push_replies(node.store, ctx, reply, replies, node.config.reply_ttl_s)
    except StoreError:
        raise
    except Exception:  # the dead letter is written; a flaw in telling the client stops nothing
        log.exception("%s could not answer the client of %s", service, printable(key))


def _job_keys(fields: Mapping[str, str]) -> list[str]:
    """The job keys an unparsable message hash names, read leniently ([] if none can be)."""
    try:
        jobs = json.loads(fields.get("job") or "[]")
        return [keys.job(int(j["caller_id"]), int(j["id"])) for j in jobs]
    except (ValueError, TypeError, KeyError):
        return []


async def _mark_refused(
    node: NodeState, ctx: int, key: str, exc: Rejected, message: Message
) -> None:
    """The refused message's status, and its sender's error results (see :func:`reject`)."""
    await records.mark_message(
        node.store,
        ctx,
        key,
        {"status": MessageStatus.ERROR.value, "reason": exc.reason, "updated_at": str(now())},
    )
    if _should_notify(node, message, exc.reason):
        for job in message.job:
            body = ResultBody(key, job.key, JobStatus.ERROR, {}, f"{exc.reason}: {exc.detail}")
            await queue_result(node, message, body)


# Refusals of messages whose sender is not authenticated: the origin they name may never have
# sent them, so only this node's own clients are told.
UNAUTHENTICATED = frozenset(
    {
        Reason.BAD_SIGNATURE,
        Reason.UNKNOWN_SIGNER,
        Reason.MALFORMED,
        Reason.WRONG_SIGNER,
        Reason.MISSING_HASH,
        Reason.WRONG_CONTEXT,
    }
)


def _should_notify(node: NodeState, message: Message, reason: str) -> bool:
    """Whether the sender of a refused job message gets error results for its jobs.

    Never for a replay (the original was answered; answering again would let an attacker
    overwrite the origin's result); for unauthenticated messages only when they came from
    this node's own clients.
    """
    if (
        message.message_type not in (MessageType.JOB, MessageType.FLOW_JOB)
        or reason == Reason.REPLAY
    ):
        return False
    if reason in UNAUTHENTICATED:
        return message.origin == node.identity.node_id
    return node.peers.is_known_node(message.origin)


def signed_here(node: NodeState, message: Message) -> bool:
    """True once if this node signed ``message`` (same key, same signature) since it started:
    itself (:func:`result_message`), or its signer for a runner process (the signer's notices,
    node/host/signer.py): the supervisor's shortcut, see check_outgoing. Both are one memory,
    the state's ``recent.signed_results``; on a miss, the signer's notices that wait in their
    socket are taken into it (the supervisor is their one reader), and it is looked at again.
    Bounded: what fell out, or was signed before a restart, is verified like any other."""
    signature = node.recent.signed_results.take(message.key)
    signer = node.identity.signer
    if signature is None and signer is not None:
        signer.hear()  # a batch's notices all at once: its other results find theirs above
        signature = node.recent.signed_results.take(message.key)
    return signature is not None and message.signatures == [signature]


def result_message(node: NodeState, request: Message, body: ResultBody) -> Message:
    """A result message answering ``request`` (:func:`bus.core.envelope.build_result`), signed
    by this node, addressed to its origin."""
    msg = build_result(request, body, origin=node.identity.node_id)
    signed = sign_message(msg, node.identity.key)
    node.recent.signed_results.keep(signed.key, signed.signatures[0])
    return signed


async def queue_result(node: NodeState, request: Message, body: ResultBody) -> None:
    msg = result_message(node, request, body)
    await atomic_routing.queue_outgoing(node.store, request.context_id, msg)


async def answer_unrunnable(
    node: NodeState, ended: list[tuple[Message, RunnerJob, Rejected]], refused: set[str]
) -> None:
    """Answer each job materialised in error, as it would never run here (node/intake/admission.py:
    unrunnable), unless its message was ``refused``: its origin, and the client waiting there,
    learn why at once."""
    for message, job, why in ended:
        if message.key in refused:
            continue
        detail = f"{why.reason}: {why.detail}"
        log.warning(
            "job %s: %s",
            job.key,
            detail,
            extra={"job": job.key, "ctx": message.context_id, "reason": why.reason},
        )
        node.counters.count(f"unrunnable_{why.reason}")
        await queue_result(
            node, message, ResultBody(message.key, job.key, JobStatus.ERROR, {}, detail)
        )

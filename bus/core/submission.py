"""What a submission writes, decided once for both client flavours (pure, no I/O).

The trio client (bus/client/api.py) and the blocking one (bus/client/sync.py) build the same
signed messages and write them the same way: per chunk of :data:`WRITE_CHUNK` messages one
MULTI/EXEC transaction holding each message's hash and one LPUSH of their keys on ``msg_out``,
i.e. one round trip per submitted batch. Each flavour only runs the plan on its own Redis
client (httpcore's way: the plan is shared, never two hand-kept twins).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bus.core.envelope import signature_of
from bus.core.errors import ClientError
from bus.core.ids import new_id, new_nonce, now
from bus.core.models import Hash, Message, MessageType, RunnerJob
from crypto import Signer

WRITE_CHUNK = 512  # messages per transaction when a batch is large


@dataclass(frozen=True)
class Write:
    """One transaction: HSET each ``(key, hash)``, then LPUSH ``pushed`` on ``msg_out``."""

    hashes: list[tuple[str, Hash]]
    pushed: list[str]


def job_messages(
    signer: Signer,
    caller_id: int,
    *,
    origin: str,
    to: str,
    context_id: int,
    jobs: Iterable[RunnerJob | Sequence[RunnerJob]],
    timeout_s: int,
    timeout_ack_s: int,
    timeout_result_s: int,
    reply_to: str,
    traceparent: str = "",
    tracestate: str = "",
) -> list[Message]:
    """One signed job message per item of ``jobs`` (a job, or the jobs one message carries),
    each in the trace ``traceparent`` names (signed; "" : none). Raises ClientError for an
    item that carries no job."""
    messages = []
    for item in jobs:
        carried = [item] if isinstance(item, RunnerJob) else list(item)
        if not carried:
            raise ClientError("a job message must carry at least one job")
        stamp = now()
        signatures: list[dict[str, str]] = []
        message = Message(
            id=new_id(),
            caller_id=caller_id,
            context_id=context_id,
            message_type=MessageType.JOB,
            timeout=timeout_s,
            timeout_ack=timeout_ack_s,
            timeout_result=timeout_result_s,
            job=carried,
            created_at=stamp,
            updated_at=stamp,
            origin=origin,
            destination=to,
            nonce=new_nonce(),
            signatures=signatures,
            reply_to=reply_to,
            traceparent=traceparent,
            tracestate=tracestate,
        )
        # signed in place: the list is this call's own and the message not out yet; the
        # signature covers no signatures, so it is the one sign_message would add
        signatures.append(signature_of(message, signer))
        messages.append(message)
    return messages


def write_plan(messages: Sequence[Message]) -> list[Write]:
    """The transactions that queue ``messages`` (spec step 1), in order."""
    plan = []
    for start in range(0, len(messages), WRITE_CHUNK):
        chunk = messages[start : start + WRITE_CHUNK]
        plan.append(Write([(m.key, m.to_hash()) for m in chunk], [m.key for m in chunk]))
    return plan

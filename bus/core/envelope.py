"""Signing and verifying messages: pure functions over models, no I/O.

A job message is signed by the calling actor's key; a result message by the executing node's
key; a flow job message by the origin node's key (it carries the actor-signed flow, see
bus/core/flows.py). Each signs :meth:`Message.signed_content` under its own domain, so a signature
over one kind can never be replayed as another.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields
from operator import attrgetter

import msgspec

from bus.core.codecs import ascii_json
from bus.core.errors import ModelError
from bus.core.ids import new_id, new_nonce, now
from bus.core.models import JobStatus, Message, MessageType, dumps_json, loads_json, loads_text
from bus.core.tracecontext import inherited
from crypto import ALGORITHM_ED25519, Canonical, Signer, Verdict, sign_object, verify_object

DOMAIN_JOB = "message"
DOMAIN_RESULT = "result"
DOMAIN_STOP = "stop"
DOMAIN_FLOW_JOB = "flow-job"  # a flow job released by its origin node (see node/flows/trust.py)


def domain_for(message: Message) -> str:
    if message.message_type is MessageType.RESULT:
        return DOMAIN_RESULT
    if message.message_type is MessageType.FLOW_JOB:
        return DOMAIN_FLOW_JOB
    if message.message_type is MessageType.STOP:
        return DOMAIN_STOP
    return DOMAIN_JOB


def sign_message(message: Message, key: Signer) -> Message:
    """Return the message with ``key``'s signature over its immutable fields."""
    # every field as it is but the signatures, positionally: half the CPU of
    # dataclasses.replace (bench/HISTORY.md#submit-cpu)
    values = list(_MESSAGE_VALUES(message))
    values[_SIGNATURES_AT] = [signature_of(message, key)]
    return Message(*values)


def signature_of(message: Message, key: Signer) -> dict[str, str]:
    """``key``'s signature entry over ``message``'s immutable fields, as :func:`sign_message`
    adds it: for a builder that puts it in the signatures list of a message it has just built
    (a client's submission), which saves building the message a second time."""
    return sign_object(key, domain_for(message), Canonical(message.signed_json))


_MESSAGE_NAMES = [f.name for f in fields(Message)]
_MESSAGE_VALUES = attrgetter(*_MESSAGE_NAMES)
_SIGNATURES_AT = _MESSAGE_NAMES.index("signatures")


def verify_message(
    message: Message,
    expected_public_key: str,
    algorithm: str = ALGORITHM_ED25519,
    accepted: Collection[str] | None = None,
) -> Verdict:
    """Check that ``expected_public_key`` (a key of ``algorithm``, which must be in
    ``accepted`` when given) signed this message's immutable fields."""
    return verify_object(
        message.signatures,
        domain_for(message),
        Canonical(message.signed_json),
        expected_public_key=expected_public_key,
        expected_algorithm=algorithm,
        accepted=accepted,
    )


class ResultBody(msgspec.Struct, frozen=True):
    """What a result message says (its ``message`` field, JSON): how one job ended."""

    in_reply_to: str  # key of the job message this answers
    job_key: str
    status: JobStatus
    result: dict[str, str]
    reason: str = ""

    def encode(self) -> str:
        """Compact JSON, sorted keys, ASCII only: the bytes the result's signature covers."""
        body = {
            "in_reply_to": self.in_reply_to,
            "job_key": self.job_key,
            "status": self.status.value,
            "result": self.result,
            "reason": self.reason,
        }
        return ascii_json(body, sort_keys=True)

    def reply(self) -> str:
        """The reply a waiting client reads for this result (:func:`reply_text`)."""
        return reply_text(
            self.in_reply_to, self.job_key, self.status.value, self.result, self.reason
        )

    @classmethod
    def decode(cls, text: str) -> ResultBody:
        """The body ``text`` holds; ModelError (``malformed result body: ...``) if none."""
        body = _decoded_body(text)  # msgspec, exact or None
        if body is not None:
            return cls(body.in_reply_to, body.job_key, body.status, body.result, body.reason)
        return cls.parse(text)

    @classmethod
    def parse(cls, text: str) -> ResultBody:
        """The reference reader of a body (:meth:`decode`, naming what it refuses)."""
        try:
            d = loads_text(text, "result body")
            status = JobStatus(d["status"])
            result = d.get("result", {})
            if not isinstance(result, dict) or not all(isinstance(v, str) for v in result.values()):
                raise ModelError("result must map strings to strings")
            return cls(
                str(d["in_reply_to"]), str(d["job_key"]), status, result, str(d.get("reason", ""))
            )
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ModelError(f"malformed result body: {exc}") from None


class _Body(msgspec.Struct):
    """A result body as :meth:`ResultBody.decode` reads it where msgspec reads it exactly:
    every field of its type (a reason that is no str, say, goes the reference way, which
    prints it)."""

    in_reply_to: str
    job_key: str
    status: JobStatus
    result: dict[str, str] = {}
    reason: str = ""


_BODY = msgspec.json.Decoder(_Body)


def _decoded_body(text: str) -> _Body | None:
    try:
        return _BODY.decode(text)
    except (msgspec.MsgspecError, UnicodeError, RecursionError):
        return None


def build_result(request: Message, body: ResultBody, *, origin: str) -> Message:
    """The one builder of a result message: ``body`` answering ``request``, sent by ``origin``
    (the node that ran the job) to the request's origin. Unsigned: each caller signs it with
    what it holds (the node its key, node/intake/messages.py; a runner process the node's
    signer, node/host/signer.py). It carries the request's trace context, so the result's way
    back continues the request's trace (a value the node would drop is not signed again)."""
    stamp = now()
    traceparent, tracestate = inherited(request.traceparent, request.tracestate)
    return Message(
        id=new_id(),
        caller_id=request.caller_id,
        context_id=request.context_id,
        message=body.encode(),
        message_type=MessageType.RESULT,
        created_at=stamp,
        updated_at=stamp,
        origin=origin,
        destination=request.origin,
        nonce=new_nonce(),
        traceparent=traceparent,
        tracestate=tracestate,
    )


def reply_text(
    in_reply_to: str, job_key: str, status: str, result: Mapping[str, str], reason: str
) -> str:
    """The JSON a waiting client reads on its reply list (PROTOCOL.md section 8): compact, in
    the order in_reply_to, job_key, status, result, reason. The one writer of it for every way
    a job ends: a built-in runner's end (bus/store/atomic/runs.py finish_local_call), an
    external runner's answered job (node/runners/external.py) and a peer's result applied at
    the origin (node/intake/consumer.py result_write), so a client reads the same bytes
    whichever way its job ran."""
    answer = {
        "in_reply_to": in_reply_to,
        "job_key": job_key,
        "status": status,
        "result": result,
        "reason": reason,
    }
    return dumps_json(answer).decode()


@dataclass(frozen=True)
class JobResult:
    """The final state of one job, as a client reads it on its reply list
    (``Client.wait_results``): ``result`` holds ``stdout``, ``stderr`` and ``exit_code``;
    ``reason`` says why it failed."""

    job_key: str
    status: JobStatus
    result: dict[str, str]
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status is JobStatus.FINISHED

    @property
    def stdout(self) -> str:
        return self.result.get("stdout", "")


def parse_reply(raw: str | bytes) -> tuple[str, JobResult]:
    """``(request key, result)`` of one answer :func:`reply_text` wrote; ValueError if
    unreadable. Beside its writer: the client's one reader of the format."""
    try:
        d = loads_json(raw)
        result = JobResult(
            str(d["job_key"]), JobStatus(d["status"]), dict(d["result"]), str(d.get("reason", ""))
        )
        return str(d.get("in_reply_to", "")), result
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"unreadable reply: {exc!r}") from None

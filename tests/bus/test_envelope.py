"""Message signatures: any change to a signed field or to the signature fails verification."""

from __future__ import annotations

from dataclasses import fields, replace

from hypothesis import given
from hypothesis import strategies as st

from bus.core.envelope import sign_message, verify_message
from bus.core.models import (
    Context,
    Message,
    MessageFormat,
    MessageStatus,
    MessageType,
    RunnerJob,
)
from bus.core.reasons import Reason
from bus.core.verify import judge, permission_problem
from crypto import KeyPair

KEY = KeyPair.generate()


def make(script: str, env: dict[str, str]) -> Message:
    job = RunnerJob(5, 7, 1, script, "python", env_vars=env)
    msg = Message(
        9,
        7,
        1,
        message_type=MessageType.JOB,
        job=[job],
        created_at=1_700_000_000,
        origin="a" * 64,
        destination="b" * 64,
        nonce="c" * 32,
    )
    return sign_message(msg, KEY)


@given(
    st.text(min_size=1, max_size=50),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5)),
    st.data(),
)
def test_any_single_change_breaks_the_signature(script, env, data):
    msg = make(script, env)
    assert verify_message(msg, KEY.public_hex).ok
    sig = msg.signatures[0]["signature"]
    i = data.draw(st.integers(0, len(sig) - 1))
    flipped = sig[:i] + ("0" if sig[i] != "0" else "1") + sig[i + 1 :]
    bad_sig = replace(msg, signatures=[{**msg.signatures[0], "signature": flipped}])
    assert not verify_message(bad_sig, KEY.public_hex).ok
    j = data.draw(st.integers(0, len(script) - 1))
    changed = script[:j] + ("x" if script[j] != "x" else "y") + script[j + 1 :]
    tampered = replace(msg, job=[replace(msg.job[0], script=changed)])
    assert changed != script
    assert judge(tampered, KEY.public_hex).reason == "bad_signature"
    for field, value in [
        ("destination", "d" * 64),
        ("created_at", msg.created_at + 1),
        ("nonce", "e" * 32),
        ("caller_id", 8),
        ("timeout", 61),
    ]:
        assert not verify_message(replace(msg, **{field: value}), KEY.public_hex).ok


def test_unsigned_fields_may_change():
    msg = make("print(1)", {})
    for field, value in [("status", "processed"), ("updated_at", 5), ("logs", [{"x": 1}])]:
        assert verify_message(replace(msg, **{field: value}), KEY.public_hex).ok


def test_a_job_signature_is_no_result_signature():
    msg = make("print(1)", {})
    as_result = replace(msg, message_type=MessageType.RESULT)
    assert not verify_message(as_result, KEY.public_hex).ok


def test_signing_keeps_every_field_but_the_signatures():
    """sign_message copies the message field by field (positionally, for speed): every field
    set to a value of its own, nothing is lost, moved or defaulted on the way."""
    job = RunnerJob(5, 7, 1, "print(1)", "python", env_vars={"A": "b"}, retries=2)
    values = {
        "id": 9,
        "caller_id": 7,
        "context_id": 1,
        "message": "hello",
        "message_type": MessageType.JOB,
        "message_format_type": MessageFormat.MD,
        "timeout": 61,
        "timeout_ack": 31,
        "timeout_result": 3601,
        "job": [job],
        "logs": [{"at": 1}],
        "created_at": 1_700_000_000,
        "updated_at": 1_700_000_001,
        "status": MessageStatus.ACKNOWLEDGED,
        "origin": "a" * 64,
        "destination": "b" * 64,
        "nonce": "c" * 32,
        "signatures": [{"old": "one"}],
        "reason": "why",
        "reply_to": "inbox:x",
        "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
        "tracestate": "k=v",
    }
    assert set(values) == {f.name for f in fields(Message)}  # a new field is listed here too
    message = Message(**values)
    signed = sign_message(message, KEY)
    assert signed == replace(message, signatures=signed.signatures)
    assert signed.signatures != message.signatures
    assert verify_message(signed, KEY.public_hex).ok


def test_the_permission_verdict_names_an_unknown_context_and_a_denied_actor():
    """The one permission rule (admission and flows raise from it): an admin or an executor
    of the context may execute there; a reader, or anyone in a context the node lacks, not."""
    context = Context(3, admins=[1], readers=[2], executors=[4])
    assert permission_problem(context, 3, 1) is None
    assert permission_problem(context, 3, 4) is None
    denied = permission_problem(context, 3, 2)
    assert denied is not None
    assert denied.reason == Reason.PERMISSION_DENIED
    missing = permission_problem(None, 5, 1)
    assert missing is not None
    assert missing.reason == Reason.UNKNOWN_CONTEXT
    assert "context 5" in missing.detail

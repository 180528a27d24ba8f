"""The trace context of a message (bus/core/tracecontext.py): the W3C parser, judged as untrusted
input (property tests), and the fields signed with the message and the flow document."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus.core.envelope import sign_message, verify_message
from bus.core.flows import FlowDoc
from bus.core.models import Message, MessageType, RunnerJob
from bus.core.tracecontext import (
    MAX_TRACESTATE_BYTES,
    TraceContextError,
    TraceDrop,
    check_tracestate,
    inherited,
    message_trace,
    new_traceparent,
    parse_traceparent,
    well_formed,
)
from crypto import KeyPair

HEX = "0123456789abcdef"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
GOOD = f"00-{TRACE_ID}-{PARENT_ID}-01"


def _hex(n: int) -> st.SearchStrategy[str]:
    return st.text(HEX, min_size=n, max_size=n).filter(lambda s: set(s) != {"0"})


@given(_hex(32), _hex(16), st.integers(0, 255))
def test_every_valid_traceparent_parses_to_itself(trace_id: str, parent_id: str, flags: int):
    value = f"00-{trace_id}-{parent_id}-{flags:02x}"
    parsed = parse_traceparent(value)
    assert (parsed.trace_id, parsed.parent_id, parsed.flags) == (trace_id, parent_id, flags)
    assert parsed.header == value
    assert message_trace(value, "").traceparent == value
    assert well_formed(value)


@given(st.text(max_size=80))
def test_any_text_is_a_traceparent_or_a_reason_never_a_crash(value: str):
    try:
        parsed = parse_traceparent(value)
    except TraceContextError as exc:
        drop = exc.drop
    else:
        drop = None
        assert parsed.header == value
    assert drop in (None, TraceDrop.BAD_TRACEPARENT)
    assert well_formed(value) is (drop is None)  # the cheap check agrees with the parser


@given(_hex(32), _hex(16), st.integers(0, 54), st.characters())
def test_one_changed_character_is_caught_unless_it_stays_valid(trace_id, parent_id, at, char):
    value = f"00-{trace_id}-{parent_id}-01"
    changed = value[:at] + char + value[at + 1 :]
    try:
        parsed = parse_traceparent(changed)
    except TraceContextError:
        return
    assert parsed.header == changed  # a hex digit for a hex digit: another valid context


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (f"00-{'0' * 32}-{PARENT_ID}-01", "trace id is all zeros"),
        (f"00-{TRACE_ID}-{'0' * 16}-01", "parent id is all zeros"),
        (f"01-{TRACE_ID}-{PARENT_ID}-01", "not 00-"),
        (f"ff-{TRACE_ID}-{PARENT_ID}-01", "not 00-"),
        (GOOD.upper(), "not 00-"),
        (GOOD + "-extra", "characters"),
        (" " + GOOD[1:], "not 00-"),
        (f"00-{TRACE_ID}-{PARENT_ID}-1x", "not 00-"),
        ("", "characters"),
    ],
)
def test_a_bad_traceparent_is_named(value: str, why: str):
    with pytest.raises(TraceContextError, match=why):
        parse_traceparent(value)
    assert not well_formed(value)


_KEY = st.from_regex(r"[a-z][a-z0-9_\-*/]{0,20}", fullmatch=True)
_VALUE = st.from_regex(r"[\x21-\x2b\x2d-\x3c\x3e-\x7e]{1,20}", fullmatch=True)


@given(st.dictionaries(_KEY, _VALUE, max_size=32), st.sampled_from([",", ", ", " ,\t"]))
def test_a_well_formed_tracestate_within_bounds_is_kept(members: dict[str, str], sep: str):
    value = sep.join(f"{k}={v}" for k, v in members.items())
    if len(value.encode()) > MAX_TRACESTATE_BYTES:
        with pytest.raises(TraceContextError, match="bytes"):
            check_tracestate(value)
    else:
        assert check_tracestate(value) == value
        assert message_trace(GOOD, value).tracestate == value


@given(st.text(max_size=600))
def test_any_text_is_a_tracestate_or_a_reason_never_a_crash(value: str):
    try:
        drop = None
        assert check_tracestate(value) == value
    except TraceContextError as exc:
        drop = exc.drop
    assert drop in (None, TraceDrop.BAD_TRACESTATE)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("a=1,a=2", "twice"),
        (",".join(f"k{i}=v" for i in range(33)), "33 members"),
        ("k=" + "v" * 600, "bytes"),
        ("Key=1", "key=value"),
        ("k=va=lue", "key=value"),
        ("k=", "key=value"),
        ("k", "key=value"),
        ("k=v,é=1", "key=value"),
    ],
)
def test_a_bad_tracestate_is_named(value: str, why: str):
    with pytest.raises(TraceContextError, match=why):
        check_tracestate(value)


def test_a_bad_traceparent_drops_its_tracestate_and_a_bad_tracestate_only_itself():
    bad_parent = message_trace("00-xyz", "k=v")
    assert (bad_parent.parent, bad_parent.tracestate) == (None, "")
    assert [d.drop for d in bad_parent.dropped] == [TraceDrop.BAD_TRACEPARENT]
    bad_state = message_trace(GOOD, "a=1,a=2")
    assert bad_state.traceparent == GOOD
    assert bad_state.tracestate == ""
    assert [d.drop for d in bad_state.dropped] == [TraceDrop.BAD_TRACESTATE]
    lone = message_trace("", "k=v")
    assert lone.parent is None
    assert [d.drop for d in lone.dropped] == [TraceDrop.BAD_TRACESTATE]
    assert message_trace("", "").dropped == ()
    assert inherited("00-xyz", "k=v") == ("", "")
    assert inherited(GOOD, "k=v") == (GOOD, "k=v")


def test_a_new_traceparent_starts_a_valid_unsampled_trace():
    parsed = parse_traceparent(new_traceparent())
    assert not parsed.sampled
    assert new_traceparent() != new_traceparent()


def _message(**fields: str) -> Message:
    job = RunnerJob(id=2, caller_id=7, context_id=1, script="print(1)", script_type="python")
    return Message(
        id=1,
        caller_id=7,
        context_id=1,
        message_type=MessageType.JOB,
        job=[job],
        created_at=1_700_000_000,
        origin="a" * 64,
        destination="b" * 64,
        nonce="n",
        **fields,  # type: ignore[arg-type]
    )


def test_the_trace_context_is_signed_and_survives_the_hash():
    key = KeyPair.generate()
    signed = sign_message(_message(traceparent=GOOD, tracestate="k=v"), key)
    assert signed.signed_content()["traceparent"] == GOOD
    assert signed.signed_content()["tracestate"] == "k=v"
    back = Message.from_hash(signed.to_hash())
    assert (back.traceparent, back.tracestate) == (GOOD, "k=v")
    assert verify_message(back, key.public_hex).ok
    other = f"00-{TRACE_ID}-{'1' * 16}-01"
    assert not verify_message(replace(back, traceparent=other), key.public_hex).ok
    assert not verify_message(replace(back, tracestate="k=w"), key.public_hex).ok
    assert not verify_message(replace(back, traceparent=""), key.public_hex).ok


def test_a_message_without_trace_context_signs_what_it_always_did():
    plain = _message()
    assert "traceparent" not in plain.signed_content()
    assert "tracestate" not in plain.signed_content()
    assert "traceparent" not in plain.to_hash()
    assert "tracestate" not in plain.to_hash()
    key = KeyPair.generate()
    assert verify_message(Message.from_hash(sign_message(plain, key).to_hash()), key.public_hex).ok


def test_a_malformed_signed_traceparent_still_verifies():
    # the signature covers what the actor wrote; dropping it is the tracer's business, not
    # admission's: the message stays valid
    key = KeyPair.generate()
    signed = sign_message(_message(traceparent="not a traceparent"), key)
    assert verify_message(Message.from_hash(signed.to_hash()), key.public_hex).ok


def test_the_flow_document_signs_its_trace_context_only_when_set():
    doc = FlowDoc.from_dict(
        {
            "id": 1,
            "caller_id": 7,
            "context_id": 1,
            "origin": "a" * 64,
            "created_at": 1,
            "expires_at": 2,
            "nonce": "n",
            "jobs": [
                {
                    "id": "a",
                    "job_id": 3,
                    "node": "a" * 64,
                    "context_id": 1,
                    "script_type": "python",
                    "script": "1",
                }
            ],
        }
    )
    assert "traceparent" not in doc.to_dict()
    traced = replace(doc, traceparent=GOOD, tracestate="k=v")
    again = FlowDoc.from_dict(traced.to_dict())
    assert (again.traceparent, again.tracestate) == (GOOD, "k=v")
    with pytest.raises(Exception, match="strings"):
        FlowDoc.from_dict(traced.to_dict() | {"traceparent": 5})


def test_a_result_continues_its_requests_trace_and_drops_a_bad_one():
    """The one result builder carries the request's trace context (the result's way back is
    part of the request's trace), and never signs again a value a node would drop."""
    import dataclasses

    from bus.core.envelope import ResultBody, build_result
    from bus.core.models import JobStatus, Message, MessageType

    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    request = Message(
        id="m1",
        caller_id=1,
        context_id=1,
        message_type=MessageType.JOB,
        origin="a" * 64,
        destination="b" * 64,
        traceparent=tp,
        tracestate="vendor=x",
    )
    body = ResultBody(request.key, "job:1:1", JobStatus.FINISHED, {}, "")
    result = build_result(request, body, origin="b" * 64)
    assert (result.traceparent, result.tracestate) == (tp, "vendor=x")
    bad = build_result(
        dataclasses.replace(request, traceparent="00-" + "0" * 32 + "-00f067aa0ba902b7-01"),
        body,
        origin="b" * 64,
    )
    assert (bad.traceparent, bad.tracestate) == ("", "")

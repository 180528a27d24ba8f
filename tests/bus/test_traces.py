"""Trace asks and answers (bus/core/traces.py): what an answering node refuses, and what an
answer may hold. Pure: no Redis, no link."""

from __future__ import annotations

import pytest

from bus.core.errors import FrameError
from bus.core.frames import decode_frame
from bus.core.traces import (
    JOB_FIELDS,
    MAX_KEYS,
    MAX_VALUE_CHARS,
    Ask,
    AskRefused,
    actor_problem,
    ask_problem,
    parse_ask,
    parse_tell,
    told_attempts,
    told_fields,
)
from bus.core.verify import Freshness
from crypto import KeyPair

ACTOR = KeyPair.generate()
ASKER, ANSWERER = "a" * 64, "b" * 64
NOW = 1_800_000_000


def ask(**changes: object) -> Ask:
    fields: dict = dict(
        id=7, caller_id=1, context_id=1, node=ASKER, target=ANSWERER,
        keys=("job:1:2", "flow:3"), created_at=NOW, nonce="0" * 32,
    )  # fmt: skip
    return Ask(**(fields | changes)).signed(ACTOR)


def problem(a: Ask, *, peer: str = ASKER, now: int = NOW) -> str | None:
    found = ask_problem(a, link_peer=peer, own_id=ANSWERER, now=now, freshness=Freshness(60, 10))
    return None if found is None else found.reason


def test_a_signed_ask_round_trips_and_passes():
    a = parse_ask(ask().to_dict())
    assert problem(a) is None
    assert actor_problem(a, ACTOR.public_hex, "ed25519", [1]) is None


@pytest.mark.parametrize(
    ("peer", "now", "target", "reason"),
    [
        ("c" * 64, NOW, ANSWERER, "wrong_origin"),  # the link is another node's
        (ASKER, NOW, "c" * 64, "wrong_destination"),
        (ASKER, NOW + 61, ANSWERER, "expired"),
        (ASKER, NOW - 11, ANSWERER, "from_future"),
    ],
)
def test_link_target_and_clock_refusals(peer, now, target, reason):
    assert problem(ask(target=target), peer=peer, now=now) == reason


def test_registry_refusals():
    a = ask()
    assert actor_problem(a, ACTOR.public_hex, "ed25519", None).reason == "unknown_context"
    assert actor_problem(a, None, "", [1]).reason == "unknown_signer"
    other = KeyPair.generate().public_hex
    assert actor_problem(a, other, "ed25519", [1]).reason == "wrong_signer"
    denied = actor_problem(a, ACTOR.public_hex, "ed25519", [2, 3])
    assert denied.reason == "permission_denied"
    assert "may not read context 1" in denied.detail


def test_an_altered_ask_does_not_verify():
    wire = ask().to_dict()
    wire["keys"] = ["job:1:99"]  # asking for another job than the actor signed
    refused = actor_problem(parse_ask(wire), ACTOR.public_hex, "ed25519", [1])
    assert refused is not None
    assert refused.reason == "bad_signature"


@pytest.mark.parametrize(
    "change",
    [
        {"keys": []},
        {"keys": [f"job:1:{i}" for i in range(MAX_KEYS + 1)]},
        {"keys": ["actor:1"]},  # only jobs, messages and flows are asked for
        {"keys": ["job:1:2\nflushall"]},
        {"context_id": "1"},
        {"id": True},
        {"node": "x"},
        {"signatures": "none"},
    ],
)
def test_malformed_asks_are_refused_with_a_reason(change):
    with pytest.raises(AskRefused) as refused:
        parse_ask(ask().to_dict() | change)
    assert refused.value.reason == "malformed"


def test_an_answer_holds_only_the_timeline_fields_cut_short():
    job = {"status": "error", "reason": "x" * 2000, "script": "secret()", "env_vars": "{}",
           "result": '{"stdout": "private"}'}  # fmt: skip
    told = told_fields(job, JOB_FIELDS)
    assert set(told) == {"status", "reason"}
    assert len(told["reason"]) == MAX_VALUE_CHARS
    attempts = told_attempts([{"attempt": i, "status": "error", "stdout": "x"} for i in range(40)])
    assert len(attempts) == 32
    assert attempts[-1] == {"attempt": 39, "status": "error"}


def test_tells_are_checked():
    record = {"fields": {"status": "finished"}, "attempts": [{"attempt": 1, "ended_at": None}],
              "dag": [{"id": "A", "job_id": 5, "node": ANSWERER, "depends": []}]}  # fmt: skip
    assert parse_tell({"ask": 1, "node": ANSWERER, "records": {"job:1:2": record}}).records
    for bad in ({"ask": "1", "node": ""}, {"ask": True, "node": ""}, []):
        with pytest.raises(AskRefused):
            parse_tell(bad)


@pytest.mark.parametrize(
    "record",
    [
        1,
        {"fields": "finished"},
        {"fields": {"status": 3}},
        {"attempts": {"attempt": 1}},
        {"attempts": [{"attempt": [1]}]},
        {"attempts": [{}] * 33},
        {"dag": [{"id": "A", "job_id": "5", "node": "", "depends": []}]},
        {"dag": [{"id": "A", "job_id": 5, "node": "", "depends": [1]}]},
        {"script": "x"},
    ],
)
def test_a_tell_whose_record_a_timeline_cannot_read_is_malformed(record):
    with pytest.raises(AskRefused) as refused:
        parse_tell({"ask": 1, "node": ANSWERER, "records": {"job:1:2": record}})
    assert refused.value.reason == "malformed"


def test_ask_and_tell_frames_decode_and_need_an_object():
    assert decode_frame('{"t":"ask","ask":{"id":1}}').type == "ask"
    assert decode_frame('{"t":"tell","tell":{}}').type == "tell"
    with pytest.raises(FrameError):
        decode_frame('{"t":"ask","ask":[1]}')

"""The two ask vectors of PROTOCOL.md section 13 (tests/vectors/ed25519-trace-ask.json,
ed25519-summary-ask.json) through the checks a node runs: the frames decode, the asks parse and
pass the answering node's checks, a changed ask is refused, and the answers are ones the asking
node reads. (tests/bus/test_protocol_vectors.py checks their bytes and signatures.)"""

from __future__ import annotations

import json
from pathlib import Path

from bus.core.frames import decode_frame
from bus.core.summaries import parse_summary_ask, summary_ask_problem, summary_problem
from bus.core.traces import actor_problem, ask_problem, parse_ask, parse_tell
from bus.core.verify import Freshness

VECTORS = Path(__file__).resolve().parents[1] / "vectors"


def load(name: str) -> dict:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def test_the_trace_ask_vector_is_answered_and_a_changed_one_refused():
    v = load("ed25519-trace-ask.json")
    frame = decode_frame(json.dumps(v["frame"]))
    ask = parse_ask(frame.body["ask"])
    assert ask.signed_dict() == v["object"]
    me, fresh = ask.target, Freshness(max_age_s=300, max_skew_s=30)
    at = v["object"]["created_at"]
    assert ask_problem(ask, link_peer=ask.node, own_id=me, now=at, freshness=fresh) is None
    public = v["key"]["public"]
    assert actor_problem(ask, public, "ed25519", readers=[7]) is None
    assert actor_problem(ask, public, "ed25519", readers=[8]).reason == "permission_denied"
    changed = parse_ask(frame.body["ask"] | {"keys": ["flow:1"]})
    assert actor_problem(changed, public, "ed25519", readers=[7]).reason == "bad_signature"
    tell = parse_tell(decode_frame(json.dumps(v["answer"])).body["tell"])
    assert (tell.ask, tell.reason) == (ask.id, "")
    assert set(tell.records) == {"job:7:4001"}


def test_the_summary_ask_vector_is_answered_and_a_changed_one_refused():
    v = load("ed25519-summary-ask.json")
    frame = decode_frame(json.dumps(v["frame"]))
    assert frame.body["of"] == "summary"
    ask = parse_summary_ask(frame.body["ask"])
    assert ask.signed_dict() == v["object"]
    at = v["object"]["created_at"]

    def problem(raw: dict, link_peer: str = ask.node) -> str:
        refused = summary_ask_problem(
            parse_summary_ask(raw), link_peer=link_peer, own_id=ask.target, now=at,
            max_age_s=300, max_skew_s=30,
        )  # fmt: skip
        return "" if refused is None else refused.reason

    assert problem(frame.body["ask"]) == ""
    assert problem(frame.body["ask"], link_peer=ask.target) == "wrong_origin"
    assert problem(frame.body["ask"] | {"id": ask.id + 1}) == "bad_signature"
    answer = decode_frame(json.dumps(v["answer"])).body
    assert (answer["of"], answer["tell"]["ask"]) == ("summary", ask.id)
    assert summary_problem(answer["tell"]["summary"]) == ""

"""Write (or check) the conformance vectors of PROTOCOL.md: one ``ed25519-<domain>.json`` per
signing domain, each a worked example made with the implementation itself.

    python -m tests.vectors.make           # rewrite the files
    python -m tests.vectors.make --check   # exit 1 if a file differs from what the code makes

Every input is fixed (ids, times, nonces) and Ed25519 is deterministic, so the files only
change when the protocol does; tests/bus/test_protocol_vectors.py checks them against the code.
The key is RFC 8032 section 7.1 TEST 1, used for every signer (actor and node alike).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from bus.core.dag import parse_flow
from bus.core.envelope import ResultBody, domain_for, sign_message
from bus.core.flows import DOMAIN_FLOW, FlowDoc, FlowJobPayload, sign_flow
from bus.core.handshake import DOMAIN as DOMAIN_HANDSHAKE
from bus.core.handshake import Session, sign_transcript
from bus.core.models import Flow, JobStatus, Message, MessageType, RunnerJob
from bus.core.summaries import DOMAIN_SUMMARY, SummaryAsk, summarise
from bus.core.traces import DOMAIN_ASK, Ask, Tell
from crypto import KeyPair, sign_envelope
from crypto.signing import canonical_json, signing_input

HERE = Path(__file__).resolve().parent
ALGORITHM = "ed25519"
SECRET_HEX = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"
PUBLIC_HEX = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
KEY = KeyPair.from_seed(bytes.fromhex(SECRET_HEX))

# A second node id for the other end (any valid Ed25519 public key: RFC 8032 TEST 2's).
OTHER_NODE = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"
CREATED_AT = 1767225600  # 2026-01-01T00:00:00Z
CALLER, CONTEXT = 7, 1

Vector = dict[str, object]


def _vector(domain: str, obj: object, note: str, stored: dict[str, str] | None) -> Vector:
    """The worked example of signing ``obj`` under ``domain`` with the test key."""
    canonical = canonical_json(obj)
    data = signing_input(domain, obj)
    signature = KEY.sign(data).hex()
    return {
        "domain": domain,
        "algorithm": ALGORITHM,
        "note": note,
        "key": {"secret": SECRET_HEX, "public": PUBLIC_HEX},
        "object": obj,
        "canonical": canonical.decode("utf-8"),
        "canonical_hex": canonical.hex(),
        "signing_input_hex": data.hex(),
        "signature": signature,
        "signatures": [{"algorithm": ALGORITHM, "public_key": PUBLIC_HEX, "signature": signature}],
        "stored_hash": stored,
    }


def _message_vector(message: Message, note: str) -> Vector:
    signed = sign_message(message, KEY)
    return _vector(domain_for(signed), signed.signed_content(), note, signed.to_hash())


def job_message() -> Message:
    plain = RunnerJob(
        id=4001, caller_id=CALLER, context_id=CONTEXT, script="print(6*7)", script_type="python"
    )
    targeted = RunnerJob(
        id=4002,
        caller_id=CALLER,
        context_id=CONTEXT,
        script="echo $GREETING",
        script_type="sh",
        timeout=30,
        retries=2,
        env_vars={"GREETING": "héllo"},
        priority="high",
        group="gpu",
    )
    return Message(
        id=3001,
        caller_id=CALLER,
        context_id=CONTEXT,
        message_type=MessageType.JOB,
        timeout=60,
        timeout_ack=120,
        timeout_result=3600,
        job=[plain, targeted],
        created_at=CREATED_AT,
        updated_at=CREATED_AT,
        origin=PUBLIC_HEX,
        destination=OTHER_NODE,
        nonce="00112233445566778899aabbccddeeff",
    )


def message() -> Vector:
    return _message_vector(
        job_message(),
        "A job message of actor 7 carrying two jobs: one with every default (timeout 60, "
        "retries 0, empty env_vars/prerequisites/depends: signed, but left out of the stored "
        "job entry), one targeted (group, priority: signed only because non-empty).",
    )


def result() -> Vector:
    request = job_message()
    body = ResultBody(
        in_reply_to=request.key,
        job_key="job:7:4001",
        status=JobStatus.FINISHED,
        result={"stdout": "42\n", "stderr": "", "exit_code": "0", "attempts": "1"},
    )
    answer = Message(
        id=3002,
        caller_id=CALLER,
        context_id=CONTEXT,
        message=body.encode(),
        message_type=MessageType.RESULT,
        created_at=CREATED_AT + 2,
        updated_at=CREATED_AT + 2,
        origin=OTHER_NODE,
        destination=PUBLIC_HEX,
        nonce="ffeeddccbbaa99887766554433221100",
    )
    return _message_vector(
        answer,
        "A result message answering job:7:4001, signed by the node that ran it. Here the test "
        "key stands for that node's key: a real result verifies against its origin's node id.",
    )


def stop() -> Vector:
    body = json.dumps({"job_key": "job:7:4001", "request": "message:7:3001"})
    request = Message(
        id=3003,
        caller_id=CALLER,
        context_id=CONTEXT,
        message=body,
        message_type=MessageType.STOP,
        created_at=CREATED_AT + 5,
        updated_at=CREATED_AT + 5,
        origin=PUBLIC_HEX,
        destination=OTHER_NODE,
        nonce="0123456789abcdef0123456789abcdef",
    )
    return _message_vector(request, "Actor 7 asks the node running job:7:4001 to stop it.")


def flow_doc() -> FlowDoc:
    spec = parse_flow(
        {
            "name": "pair",
            "env_vars": {"GREETING": "hi"},
            "jobs": [
                {
                    "id": "A",
                    "node": PUBLIC_HEX,
                    "context": CONTEXT,
                    "type": "python",
                    "script": "print(6)",
                },
                {
                    "id": "B",
                    "node": OTHER_NODE,
                    "context": CONTEXT,
                    "type": "sh",
                    "script": "echo $((HERO_DEP_A_STDOUT * 7))",
                    "depends": ["A"],
                    "timeout": 30,
                },
            ],
        }
    )
    return FlowDoc(
        id=5001,
        caller_id=CALLER,
        context_id=CONTEXT,
        origin=PUBLIC_HEX,
        created_at=CREATED_AT,
        expires_at=CREATED_AT + 24 * 3600,
        nonce="a0a1a2a3a4a5a6a7a8a9aaabacadaeaf",
        spec=spec,
        job_ids={"A": 6001, "B": 6002},
    )


def flow_hash(doc: FlowDoc, signatures: list[dict[str, str]]) -> dict[str, str]:
    """``flow:<id>`` as a client stores it (bus/client/api.py ``Client._store_flow``)."""
    flow = Flow(
        id=doc.id,
        caller_id=doc.caller_id,
        context_id=doc.context_id,
        jobs=[doc.job_ids[j.id] for j in doc.spec.jobs],
        env_vars=dict(doc.spec.env_vars),
        created_at=doc.created_at,
        updated_at=doc.created_at,
    )
    extra = {
        "name": doc.spec.name,
        "origin": doc.origin,
        "doc": json.dumps(doc.to_dict(), separators=(",", ":")),
        "signatures": json.dumps(signatures),
        "reason": "",
    }
    return flow.to_hash() | extra


def flow() -> Vector:
    doc = flow_doc()
    obj = doc.to_dict()
    note = (
        "A flow document signed once by actor 7: job A on the origin node, B on another node "
        "after A. Stored in flow:5001 (the document as JSON text in 'doc')."
    )
    vector = _vector(DOMAIN_FLOW, obj, note, None)
    vector["stored_hash"] = flow_hash(doc, sign_flow(doc, KEY))
    return vector


def flow_job() -> Vector:
    doc = flow_doc()
    inputs = {"A": {"stdout": "6\n", "stderr": "", "exit_code": "0", "attempts": "1"}}
    payload = FlowJobPayload(doc.to_dict(), sign_flow(doc, KEY), "B", inputs)
    released = Message(
        id=3004,
        caller_id=CALLER,
        context_id=CONTEXT,
        message=payload.encode(),
        message_type=MessageType.FLOW_JOB,
        job=[doc.runner_job("B", inputs, CREATED_AT + 10)],
        created_at=CREATED_AT + 10,
        updated_at=CREATED_AT + 10,
        origin=PUBLIC_HEX,
        destination=OTHER_NODE,
        nonce="b0b1b2b3b4b5b6b7b8b9babbbcbdbebf",
    )
    return _message_vector(
        released,
        "The origin node releases job B of flow 5001 once A finished: a flow_job message "
        "signed by the origin node's key, carrying the actor-signed flow and A's result.",
    )


def handshake() -> Vector:
    session = Session(
        initiator=PUBLIC_HEX,
        responder=OTHER_NODE,
        nonce_initiator="11" * 32,
        nonce_responder="22" * 32,
    )
    obj = session.transcript("initiator")
    vector = _vector(
        DOMAIN_HANDSHAKE,
        obj,
        "The initiator's transcript of a plain ws:// link (tls empty); its signature is the "
        "'sig' of the auth frame. The responder signs the same with role 'responder'.",
        None,
    )
    assert vector["signature"] == sign_transcript(KEY, "initiator", session)
    return vector


def envelope() -> Vector:
    payload = {"job": "job:7:4001", "count": 3, "tags": ["a", "b"]}
    vector = _vector(
        "envelope",
        payload,
        "hero-verify sign's default domain; the whole envelope is in 'envelope'.",
        None,
    )
    vector["envelope"] = sign_envelope(KEY, payload)
    return vector


def trace_ask() -> Vector:
    ask = Ask(
        id=7001,
        caller_id=CALLER,
        context_id=CONTEXT,
        node=OTHER_NODE,
        target=PUBLIC_HEX,
        keys=("job:7:4001", "message:7:3001"),
        created_at=CREATED_AT + 60,
        nonce="c0c1c2c3c4c5c6c7c8c9cacbcccdcecf",
    ).signed(KEY)
    vector = _vector(
        DOMAIN_ASK,
        ask.signed_dict(),
        "Actor 7, through node OTHER_NODE, asks node PUBLIC_HEX for its records of a job and "
        "its message (hero-node job trace); the actor signs. 'frame' is the ask frame as "
        "carried, 'answer' a tell of the job's record (no script, no output).",
        None,
    )
    assert vector["signatures"] == [dict(s) for s in ask.signatures]
    record = {
        "fields": {"id": "4001", "status": "finished", "attempt": "1", "origin": OTHER_NODE},
        "attempts": [],
    }
    tell = Tell(ask.id, PUBLIC_HEX, {"job:7:4001": record})
    vector["frame"] = {"t": "ask", "ask": ask.to_dict()}
    vector["answer"] = {"t": "tell", "tell": tell.to_dict()}
    return vector


def summary_ask() -> Vector:
    ask = SummaryAsk(
        id=7002,
        node=PUBLIC_HEX,
        target=OTHER_NODE,
        created_at=CREATED_AT + 60,
        nonce="d0d1d2d3d4d5d6d7d8d9dadbdcdddedf",
    ).signed(KEY)
    vector = _vector(
        DOMAIN_SUMMARY,
        ask.signed_dict(),
        "Node PUBLIC_HEX asks its peer OTHER_NODE for its summary (the console's grid); the "
        "asking node signs with its own key. 'frame' is the ask frame as carried, 'answer' "
        "the peer's tell: totals over all its contexts, two points of its charts.",
        None,
    )
    assert vector["signatures"] == [dict(s) for s in ask.signatures]
    charts = {
        "every_s": 5.0,
        "at": [CREATED_AT + 55.0, CREATED_AT + 60.0],
        "rates": {"finished": [1.2, 0.8], "failed": [0.0, 0.0]},
        "latency_ms": {"roundtrip_p50": [31.5, None], "roundtrip_p99": [120.0, None]},
        "depths": {"msg_in": [0, 2], "queue:python": [1, 3]},
    }
    depths = {"msg_out": 0, "msg_in": 2, "queue:python": 3, "dlq": 1, "outbox": 0}
    summary = summarise(depths, {"python": (2, 1)}, {"delivered": 12}, {"up": 1, "down": 0}, charts)
    told = {"ask": ask.id, "node": OTHER_NODE, "summary": summary}
    vector["frame"] = {"t": "ask", "ask": ask.to_dict(), "of": "summary"}
    vector["answer"] = {"t": "tell", "tell": told, "of": "summary"}
    return vector


MAKERS: dict[str, Callable[[], Vector]] = {
    "message": message,
    "result": result,
    "stop": stop,
    "flow": flow,
    "flow-job": flow_job,
    "handshake": handshake,
    "envelope": envelope,
    "trace-ask": trace_ask,
    "summary-ask": summary_ask,
}


def path_of(domain: str) -> Path:
    return HERE / f"{ALGORITHM}-{domain}.json"


def render(vector: Vector) -> str:
    return json.dumps(vector, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for domain, make in MAKERS.items():
        text, path = render(make()), path_of(domain)
        if check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python -m tests.vectors.make)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The conformance vectors of PROTOCOL.md (tests/vectors/ed25519-*.json) against the code.

For each signing domain: the canonical bytes, the signing input, the signature and the stored
hash written in the file are what the implementation makes and accepts, and the files are what
``python -m tests.vectors.make`` writes today (so a protocol change cannot leave them stale).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bus.core import envelope as bus_envelope
from bus.core import flows, handshake, summaries, traces
from bus.core.models import Flow, Message
from bus.errors import HandshakeError
from crypto import KeyPair, verify_envelope, verify_object
from crypto.signing import DOMAIN_PREFIX, canonical_json, signing_input
from tests.vectors import make

VECTORS = Path(__file__).resolve().parents[1] / "vectors"
FILES = sorted(VECTORS.glob("ed25519-*.json"))
MESSAGE_DOMAINS = {"message", "result", "stop", "flow-job"}


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_one_file_per_signing_domain_of_the_code() -> None:
    domains = {_load(p)["domain"] for p in FILES}
    code = {
        bus_envelope.DOMAIN_JOB,
        bus_envelope.DOMAIN_RESULT,
        bus_envelope.DOMAIN_STOP,
        bus_envelope.DOMAIN_FLOW_JOB,
        flows.DOMAIN_FLOW,
        handshake.DOMAIN,
        "envelope",
        traces.DOMAIN_ASK,
        summaries.DOMAIN_SUMMARY,
    }
    assert domains == code
    assert [p.name for p in FILES] == sorted(f"ed25519-{d}.json" for d in code)


def test_the_files_are_what_the_generator_writes() -> None:
    assert make.main(["--check"]) == 0


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_bytes_and_signature(path: Path) -> None:
    v = _load(path)
    key = KeyPair.from_seed(bytes.fromhex(v["key"]["secret"]))
    assert key.public_hex == v["key"]["public"]
    canonical = canonical_json(v["object"])
    assert canonical.decode("utf-8") == v["canonical"]
    assert canonical.hex() == v["canonical_hex"]
    data = signing_input(v["domain"], v["object"])
    assert data == f"{DOMAIN_PREFIX}{v['domain']}\n".encode() + canonical
    assert data.hex() == v["signing_input_hex"]
    assert key.sign(data).hex() == v["signature"]
    entry = {"algorithm": "ed25519", "public_key": v["key"]["public"], "signature": v["signature"]}
    assert v["signatures"] == [entry]
    verdict = verify_object(
        v["signatures"], v["domain"], v["object"], expected_public_key=key.public_hex
    )
    assert verdict.ok, verdict


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_changed_object_or_domain_does_not_verify(path: Path) -> None:
    v = _load(path)
    tampered = copy.deepcopy(v["object"])
    first = next(iter(tampered))
    tampered[first] = tampered[first] + 1 if isinstance(tampered[first], int) else "x"
    assert not verify_object(v["signatures"], v["domain"], tampered).ok
    other = "envelope" if v["domain"] != "envelope" else "message"
    assert not verify_object(v["signatures"], other, v["object"]).ok


@pytest.mark.parametrize("domain", sorted(MESSAGE_DOMAINS))
def test_a_stored_message_hash_parses_back_to_the_signed_object(domain: str) -> None:
    v = _load(VECTORS / f"ed25519-{domain}.json")
    stored = v["stored_hash"]
    assert all(isinstance(k, str) and isinstance(s, str) for k, s in stored.items())
    message = Message.from_hash(stored)
    assert bus_envelope.domain_for(message) == domain
    assert message.signed_content() == v["object"]
    assert json.loads(stored["signatures"]) == v["signatures"]
    assert bus_envelope.verify_message(message, v["key"]["public"]).ok
    assert message.to_hash() == stored


def test_defaults_are_signed_but_not_stored() -> None:
    v = _load(VECTORS / "ed25519-message.json")
    plain = json.loads(v["stored_hash"]["job"])[0]
    assert set(plain) == {"id", "caller_id", "context_id", "script", "script_type"}
    signed = v["object"]["job"][0]
    assert signed["timeout"] == 60
    assert signed["retries"] == 0
    assert signed["env_vars"] == {}
    assert "group" not in signed
    assert v["object"]["job"][1]["group"] == "gpu"
    assert v["stored_hash"]["created_at"] == str(v["object"]["created_at"])


def test_the_stored_flow_hash_holds_the_signed_document() -> None:
    v = _load(VECTORS / "ed25519-flow.json")
    stored = v["stored_hash"]
    doc = json.loads(stored["doc"])
    assert flows.FlowDoc.from_dict(doc).to_dict() == v["object"] == doc
    assert flows.verify_flow(doc, json.loads(stored["signatures"]), v["key"]["public"]).ok
    flow = Flow.from_hash(stored)
    assert (flow.id, flow.caller_id, flow.context_id) == (
        doc["id"],
        doc["caller_id"],
        doc["context_id"],
    )
    assert flow.jobs == [j["job_id"] for j in doc["jobs"]]


def test_the_flow_job_carries_the_actor_signed_flow() -> None:
    flow_v = _load(VECTORS / "ed25519-flow.json")
    v = _load(VECTORS / "ed25519-flow-job.json")
    payload = flows.FlowJobPayload.decode(v["object"]["message"])
    assert payload.flow == flow_v["object"]
    assert payload.flow_signatures == flow_v["signatures"]
    doc = flows.FlowDoc.from_dict(payload.flow)
    expected = doc.runner_job(payload.job, payload.inputs, 0).signed_dict()
    assert v["object"]["job"] == [expected]


def test_the_handshake_transcript_is_the_auth_signature() -> None:
    v = _load(VECTORS / "ed25519-handshake.json")
    o = v["object"]
    session = handshake.Session(
        o["initiator"], o["responder"], o["nonce_initiator"], o["nonce_responder"], o["tls"]
    )
    assert o["v"] == handshake.PROTOCOL_VERSION
    assert o["role"] == "initiator"
    handshake.verify_transcript(v["signature"], o["initiator"], "initiator", session)
    with pytest.raises(HandshakeError):
        handshake.verify_transcript(v["signature"], o["initiator"], "responder", session)


def test_the_envelope_verifies_with_hero_verify_s_function() -> None:
    v = _load(VECTORS / "ed25519-envelope.json")
    assert v["envelope"]["payload"] == v["object"]
    assert v["envelope"]["signatures"] == v["signatures"]
    assert verify_envelope(v["envelope"], v["key"]["public"]).ok

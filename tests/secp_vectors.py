"""Conformance vectors for secp256k1 actor signatures: ``tests/vectors/secp256k1-<domain>.json``.

One worked example per domain an actor signs (message, stop, flow, envelope; results, flow jobs
and handshakes are signed by nodes, whose keys are Ed25519): the key, the object signed, its
canonical bytes, the signing input (``hero-bus/v1/<domain>`` + newline + canonical bytes), the
signature (ECDSA over SHA-256 of the signing input, RFC 6979 deterministic, low S, ``r || s``)
and, for messages, the hash a node stores. ``python -m tests.secp_vectors`` rewrites the files;
tests/crypto/test_secp_vectors.py checks them against the implementation.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from bus.core.dag import parse_flow
from bus.core.envelope import domain_for, sign_message
from bus.core.flows import FlowDoc, sign_flow
from bus.core.models import Message, MessageType, RunnerJob
from crypto import Secp256k1KeyPair, canonical_json, sign_envelope, signing_input

VECTORS = Path(__file__).resolve().parent / "vectors"
# the private key of RFC 6979 A.2.5, used here as a secp256k1 scalar: a published number, so
# that another implementation can derive the same public key and signatures
SECRET_HEX = "c9afa9d845ba75166b5c215767b1d6934e50c3db36e89b127b8a622b120f6721"
NODE_A = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
NODE_B = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"
CALLER = 7
CREATED_AT = 1_767_225_600  # 2026-01-01T00:00:00Z


def key() -> Secp256k1KeyPair:
    return Secp256k1KeyPair.from_seed(bytes.fromhex(SECRET_HEX))


def _job_message() -> Message:
    job = RunnerJob(
        id=4_503_599_627_370_495,
        caller_id=CALLER,
        context_id=1,
        script="print(6*7)",
        script_type="python",
        created_at=CREATED_AT,
    )
    return Message(
        id=1_125_899_906_842_624,
        caller_id=CALLER,
        context_id=1,
        message_type=MessageType.JOB,
        job=[job],
        created_at=CREATED_AT,
        updated_at=CREATED_AT,
        origin=NODE_A,
        destination=NODE_B,
        nonce="00112233445566778899aabbccddeeff",
    )


def _stop_message() -> Message:
    body = json.dumps(
        {"job_key": "job:7:4503599627370495", "request": "message:7:1125899906842624"}
    )
    return Message(
        id=2_251_799_813_685_248,
        caller_id=CALLER,
        context_id=1,
        message=body,
        message_type=MessageType.STOP,
        created_at=CREATED_AT + 5,
        updated_at=CREATED_AT + 5,
        origin=NODE_A,
        destination=NODE_B,
        nonce="ffeeddccbbaa99887766554433221100",
    )


def _vector(domain: str, value: object, signature: dict[str, str]) -> dict[str, object]:
    canonical = canonical_json(value)
    data = signing_input(domain, value)
    return {
        "algorithm": "secp256k1",
        "domain": domain,
        "secret_key": SECRET_HEX,
        "public_key": key().public_hex,
        "object": value,
        "canonical_hex": canonical.hex(),
        "signing_input_hex": data.hex(),
        "sha256_hex": hashlib.sha256(data).hexdigest(),
        "signature_hex": signature["signature"],
        "signatures": [signature],
    }


def _message_vector(message: Message) -> dict[str, object]:
    signed = sign_message(message, key())
    vector = _vector(domain_for(signed), signed.signed_content(), signed.signatures[0])
    vector["stored_hash"] = signed.to_hash()
    return vector


def _flow_vector() -> dict[str, object]:
    spec = parse_flow(
        {
            "name": "hello",
            "jobs": [{"id": "A", "node": NODE_B, "context": 1, "type": "sh", "script": "echo a"}],
        }
    )
    doc = FlowDoc(
        id=3_377_699_720_527_872,
        caller_id=CALLER,
        context_id=1,
        origin=NODE_A,
        created_at=CREATED_AT,
        expires_at=CREATED_AT + 3600,
        nonce="0123456789abcdef0123456789abcdef",
        spec=spec,
        job_ids={"A": 5_629_499_534_213_120},
    )
    [signature] = sign_flow(doc, key())
    return _vector("flow", doc.to_dict(), signature)


def _envelope_vector() -> dict[str, object]:
    payload = {"job": "render", "frames": [1, 2, 3], "owner": {"id": 7}}
    envelope = sign_envelope(key(), payload)
    vector = _vector("envelope", payload, envelope["signatures"][0])  # type: ignore[index]
    vector["envelope"] = envelope
    return vector


def build() -> dict[str, dict[str, object]]:
    """Every vector, by domain."""
    return {
        "message": _message_vector(_job_message()),
        "stop": _message_vector(_stop_message()),
        "flow": _flow_vector(),
        "envelope": _envelope_vector(),
    }


def path(domain: str) -> Path:
    return VECTORS / f"secp256k1-{domain}.json"


def render(vector: dict[str, object]) -> str:
    return json.dumps(vector, indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    VECTORS.mkdir(exist_ok=True)
    for domain, vector in build().items():
        path(domain).write_text(render(vector), encoding="utf-8")
        print(path(domain))

"""The secp256k1 conformance vectors (tests/vectors/secp256k1-*.json) against the code: each
step another implementation has to reproduce, checked on its own."""

from __future__ import annotations

import hashlib
import json

import pytest

from bus.core.models import Message
from bus.core.verify import judge
from crypto import Secp256k1KeyPair, canonical_json, signing_input, verify_envelope, verify_object
from crypto.secp256k1 import CURVE_ORDER, verify_secp256k1
from tests import secp_vectors

DOMAINS = ["message", "stop", "flow", "envelope"]

# secp256k1 by hand (SEC 2 section 2.4.1), so the vectors are checked by plain textbook ECDSA
# too and not only by the library that made them
P = 2**256 - 2**32 - 977
G = (
    0x79BE667EF9DCBBAC55A06295CE870B07029BFCDB2DCE28D959F2815B16F81798,
    0x483ADA7726A3C4655DA4FBFC0E1108A8FD17B448A68554199C47D08FFB10D4B8,
)
Point = tuple[int, int] | None


def _add(a: Point, b: Point) -> Point:
    if a is None or b is None:
        return a or b
    if a[0] == b[0] and (a[1] + b[1]) % P == 0:
        return None
    if a == b:
        slope = 3 * a[0] * a[0] * pow(2 * a[1], -1, P)
    else:
        slope = (b[1] - a[1]) * pow(b[0] - a[0], -1, P)
    x = (slope * slope - a[0] - b[0]) % P
    return x, (slope * (a[0] - x) - a[1]) % P


def _mul(k: int, point: Point) -> Point:
    result: Point = None
    while k:
        if k & 1:
            result = _add(result, point)
        point, k = _add(point, point), k >> 1
    return result


def _decompress(public: bytes) -> Point:
    x = int.from_bytes(public[1:], "big")
    y = pow((x**3 + 7) % P, (P + 1) // 4, P)
    return x, y if y % 2 == public[0] % 2 else P - y


def textbook_verify(public: bytes, data: bytes, signature: bytes) -> bool:
    r, s = int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
    e = int.from_bytes(hashlib.sha256(data).digest(), "big")
    w = pow(s, -1, CURVE_ORDER)
    point = _add(_mul(e * w % CURVE_ORDER, G), _mul(r * w % CURVE_ORDER, _decompress(public)))
    return point is not None and point[0] % CURVE_ORDER == r


def load(domain: str) -> dict:
    return json.loads(secp_vectors.path(domain).read_text(encoding="utf-8"))


@pytest.mark.parametrize("domain", DOMAINS)
def test_each_step_of_the_vector_is_what_the_code_computes(domain):
    vector = load(domain)
    assert vector["domain"] == domain
    key = Secp256k1KeyPair.from_seed(bytes.fromhex(vector["secret_key"]))
    assert key.public_hex == vector["public_key"]
    canonical = canonical_json(vector["object"])
    assert canonical.hex() == vector["canonical_hex"]
    data = signing_input(domain, vector["object"])
    assert data == f"hero-bus/v1/{domain}\n".encode() + canonical
    assert data.hex() == vector["signing_input_hex"]
    assert hashlib.sha256(data).hexdigest() == vector["sha256_hex"]
    signature = bytes.fromhex(vector["signature_hex"])
    assert int.from_bytes(signature[32:], "big") <= CURVE_ORDER // 2
    assert verify_secp256k1(key.public_bytes, data, signature)
    assert textbook_verify(key.public_bytes, data, signature)
    assert not textbook_verify(key.public_bytes, data + b" ", signature)
    assert _mul(int(vector["secret_key"], 16), G) == _decompress(key.public_bytes)
    assert key.sign(data) == signature  # RFC 6979: the vector's exact signature
    [entry] = vector["signatures"]
    assert entry == {
        "algorithm": "secp256k1",
        "public_key": key.public_hex,
        "signature": vector["signature_hex"],
    }
    verdict = verify_object(
        [entry],
        domain,
        vector["object"],
        expected_public_key=key.public_hex,
        expected_algorithm="secp256k1",
    )
    assert verdict.ok, verdict


@pytest.mark.parametrize("domain", ["message", "stop"])
def test_the_stored_hash_reads_back_as_the_signed_message(domain):
    vector = load(domain)
    message = Message.from_hash(vector["stored_hash"])
    assert message.signed_content() == vector["object"]
    assert json.loads(vector["stored_hash"]["signatures"]) == vector["signatures"]
    assert judge(message, vector["public_key"], algorithm="secp256k1").ok
    assert judge(message, vector["public_key"]).reason == "wrong_signer"  # not an ed25519 key


def test_the_envelope_vector_verifies_as_hero_verify_does():
    vector = load("envelope")
    assert verify_envelope(vector["envelope"], None).ok


@pytest.mark.parametrize("domain", DOMAINS)
def test_the_files_are_what_the_builder_writes(domain):
    """A change to the encoding, the signing input or the signature shows up here as a diff of
    the committed vector, not silently as a new one."""
    assert secp_vectors.path(domain).read_text(encoding="utf-8") == secp_vectors.render(
        secp_vectors.build()[domain]
    )

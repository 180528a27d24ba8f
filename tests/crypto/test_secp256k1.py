"""secp256k1 actor keys: ECDSA over SHA-256, compressed keys, low S, key files, the verdicts."""

from __future__ import annotations

import json

import nacl.pwhash.argon2id as argon2id
import pytest

from crypto import (
    KeyPair,
    Secp256k1KeyPair,
    read_key_file,
    read_signing_key_file,
    sign_object,
    signing_input,
    verify_object,
    write_key_file,
)
from crypto.errors import KeyFileError, KeyFormatError
from crypto.secp256k1 import (
    CURVE_ORDER,
    InvalidPointError,
    UncompressedKeyError,
    parse_secp256k1_public_key,
    verify_secp256k1,
)
from crypto.signing import verify_raw

OPS_MIN, MEM_MIN = argon2id.OPSLIMIT_MIN, argon2id.MEMLIMIT_MIN
FIELD_P = 2**256 - 2**32 - 977
# the generator G: the public key of the secret scalar 1 (SEC 2, section 2.4.1)
G_COMPRESSED = "0279be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798"
G_UNCOMPRESSED = (
    "0479be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798"
    "483ada7726a3c4655da4fbfc0e1108a8fd17b448a68554199c47d08ffb10d4b8"
)
VALUE = {"id": 7, "note": "héro"}


def _off_curve_x() -> int:
    """The smallest x for which x^3 + 7 has no square root mod p: no point has it."""
    x = 1
    while pow((x**3 + 7) % FIELD_P, (FIELD_P - 1) // 2, FIELD_P) != FIELD_P - 1:
        x += 1
    return x


def _high_s(signature_hex: str) -> str:
    r, s = signature_hex[:64], int(signature_hex[64:], 16)
    return r + (CURVE_ORDER - s).to_bytes(32, "big").hex()


def _entry(key: Secp256k1KeyPair, **changes: str) -> dict[str, str]:
    return {**sign_object(key, "message", VALUE), **changes}


def _verdict(entry: object, key: str, algorithm: str = "secp256k1", **kw: object):
    return verify_object(
        [entry], "message", VALUE, expected_public_key=key, expected_algorithm=algorithm, **kw
    )


def test_the_secret_one_has_the_generator_as_public_key():
    key = Secp256k1KeyPair.from_seed((1).to_bytes(32, "big"))
    assert key.public_hex == G_COMPRESSED
    assert key.algorithm == "secp256k1"
    assert repr(key) == f"Secp256k1KeyPair(public_hex={G_COMPRESSED!r})"


def test_signatures_are_deterministic_low_s_and_verify():
    key = Secp256k1KeyPair.generate()
    data = signing_input("message", VALUE)
    for n in range(32):  # about half of raw ECDSA signatures have a high S before normalising
        message = data + bytes([n])
        signature = key.sign(message)
        assert signature == key.sign(message)
        assert int.from_bytes(signature[32:], "big") <= CURVE_ORDER // 2
        assert verify_secp256k1(key.public_bytes, message, signature)
        assert verify_raw(key.public_bytes, message, signature, "secp256k1")
        assert not verify_raw(key.public_bytes, message + b"x", signature, "secp256k1")
    assert not verify_raw(key.public_bytes, data, key.sign(data), "ed25519")


def test_a_secp256k1_entry_verifies_against_its_registered_key():
    key = Secp256k1KeyPair.generate()
    entry = _entry(key)
    assert entry["algorithm"] == "secp256k1"
    assert len(entry["public_key"]) == 66
    assert len(entry["signature"]) == 128
    verdict = _verdict(entry, key.public_hex)
    assert verdict.ok
    assert verdict.signer == key.public_hex
    other = Secp256k1KeyPair.generate()
    assert _verdict(entry, other.public_hex).reason == "wrong_signer"
    changed = verify_object(
        [entry],
        "message",
        {**VALUE, "id": 8},
        expected_public_key=key.public_hex,
        expected_algorithm="secp256k1",
    )
    assert changed.reason == "bad_signature"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda e: {**e, "signature": _high_s(e["signature"])}, "high_s"),
        (lambda e: {**e, "public_key": G_UNCOMPRESSED}, "uncompressed_key"),
        (
            lambda e: {**e, "public_key": "02" + _off_curve_x().to_bytes(32, "big").hex()},
            "invalid_point",
        ),
        (lambda e: {**e, "public_key": "05" + e["public_key"][2:]}, "malformed_key"),
        (lambda e: {**e, "public_key": e["public_key"][:-2]}, "malformed_key"),
        (lambda e: {**e, "public_key": "zz" + e["public_key"][2:]}, "malformed_key"),
        (lambda e: {**e, "signature": "00" * 64}, "malformed_signature"),
        (lambda e: {**e, "algorithm": "ed25519"}, "wrong_algorithm"),
        (lambda e: {**e, "algorithm": "rsa"}, "unsupported_algorithm"),
    ],
)
def test_each_bad_entry_gets_its_own_reason(change, reason):
    key = Secp256k1KeyPair.generate()
    verdict = _verdict(change(_entry(key)), key.public_hex)
    assert not verdict.ok
    assert verdict.reason == reason, verdict


def test_a_high_s_twin_is_a_valid_ecdsa_signature_that_we_refuse():
    key = Secp256k1KeyPair.generate()
    data = signing_input("message", VALUE)
    twin = bytes.fromhex(_high_s(key.sign(data).hex()))
    assert not verify_secp256k1(key.public_bytes, data, twin)


def test_algorithms_not_accepted_and_mismatched_are_wrong_algorithm():
    secp, ed = Secp256k1KeyPair.generate(), KeyPair.generate()
    verdict = _verdict(_entry(secp), secp.public_hex, accepted=("ed25519",))
    assert (verdict.reason, verdict.ok) == ("wrong_algorithm", False)
    assert "not accepted" in verdict.detail
    # an Ed25519 actor's message carrying a secp256k1 signature
    verdict = _verdict(_entry(secp), ed.public_hex, algorithm="ed25519")
    assert verdict.reason == "wrong_algorithm"
    ed_entry = sign_object(ed, "message", VALUE)
    assert _verdict(ed_entry, ed.public_hex, algorithm="ed25519").ok
    assert _verdict(ed_entry, ed.public_hex, "ed25519", accepted=("secp256k1",)).reason == (
        "wrong_algorithm"
    )


def test_public_key_parsing_errors_are_typed():
    assert parse_secp256k1_public_key(G_COMPRESSED).hex() == G_COMPRESSED
    with pytest.raises(UncompressedKeyError):
        parse_secp256k1_public_key(G_UNCOMPRESSED)
    with pytest.raises(InvalidPointError):
        parse_secp256k1_public_key("03" + _off_curve_x().to_bytes(32, "big").hex())
    with pytest.raises(InvalidPointError):  # x >= p
        parse_secp256k1_public_key("02" + "ff" * 32)
    with pytest.raises(KeyFormatError):
        Secp256k1KeyPair.from_seed(CURVE_ORDER.to_bytes(32, "big"))
    with pytest.raises(KeyFormatError):
        Secp256k1KeyPair.from_seed(bytes(32))


@pytest.mark.parametrize("passphrase", [None, b"correct horse"])
def test_key_files_round_trip_and_node_keys_stay_ed25519(tmp_path, passphrase):
    key = Secp256k1KeyPair.generate()
    path = tmp_path / "actor.key"
    write_key_file(path, key, passphrase=passphrase, opslimit=OPS_MIN, memlimit=MEM_MIN)
    doc = json.loads(path.read_text())
    assert doc["kind"] == "hero-secp256k1-key"
    assert doc["public_key"] == key.public_hex
    loaded = read_signing_key_file(path, passphrase=passphrase)
    assert isinstance(loaded, Secp256k1KeyPair)
    assert loaded.seed == key.seed
    with pytest.raises(KeyFileError, match="holds a secp256k1 key; an Ed25519 key is needed"):
        read_key_file(path, passphrase=passphrase)
    ed_path = tmp_path / "ed.key"
    write_key_file(ed_path, KeyPair.generate())
    assert isinstance(read_signing_key_file(ed_path), KeyPair)


def test_a_key_file_whose_public_key_does_not_match_is_refused(tmp_path):
    key, other = Secp256k1KeyPair.generate(), Secp256k1KeyPair.generate()
    path = tmp_path / "actor.key"
    write_key_file(path, key)
    doc = json.loads(path.read_text())
    doc["public_key"] = other.public_hex
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    with pytest.raises(KeyFileError, match="does not match"):
        read_signing_key_file(path)

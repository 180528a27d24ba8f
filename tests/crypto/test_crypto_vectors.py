"""Conformance: Wycheproof Ed25519, RFC 8032 §7.1, and RFC 8785 (JCS) test data.

The third-party sets are in tests/vectors/conformance/ (its README names their sources and
licences), so a plain clone has them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crypto.signing import KeyPair, _jcs_bytes, verify_raw

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "conformance"
WYCHEPROOF = VECTORS / "ed25519_wycheproof.json"
JCS = VECTORS / "jcs"


def _require_vectors() -> None:
    if not WYCHEPROOF.is_file() or not (JCS / "input").is_dir():
        pytest.fail(
            f"conformance vectors not found at {VECTORS} (ed25519_wycheproof.json, jcs/): "
            "they are part of the repository",
            pytrace=False,
        )


def _wycheproof_cases() -> list[object]:
    if not WYCHEPROOF.is_file():
        # Collection must not crash; test_vectors_present reports the problem as a failure.
        return []
    data = json.loads(WYCHEPROOF.read_text(encoding="utf-8"))
    cases = []
    for group in data["testGroups"]:
        public_key = group["publicKey"]["pk"]
        for test in group["tests"]:
            case = (public_key, test["msg"], test["sig"], test["result"], test["flags"])
            cases.append(pytest.param(*case, id=f"tc{test['tcId']}-{test['result']}"))
    return cases


def _jcs_names() -> list[str]:
    return sorted(path.stem for path in (JCS / "input").glob("*.json")) if JCS.is_dir() else []


WYCHEPROOF_CASES = _wycheproof_cases()


def test_vectors_present():
    _require_vectors()
    data = json.loads(WYCHEPROOF.read_text(encoding="utf-8"))
    assert data["schema"] == "eddsa_verify_schema_v1.json"
    assert len(WYCHEPROOF_CASES) == data["numberOfTests"] == 151
    assert _jcs_names() == ["arrays", "french", "structures", "unicode", "values", "weird"]


@pytest.mark.parametrize(("pk", "msg", "sig", "result", "flags"), WYCHEPROOF_CASES)
def test_wycheproof_ed25519(pk, msg, sig, result, flags):
    # The file has only "valid" and "invalid" results (no "acceptable" cases); libsodium, via
    # PyNaCl, agrees with every one, including the non-canonical / malleable ones.
    assert result in ("valid", "invalid"), f"unexpected result {result!r} ({flags})"
    ok = verify_raw(bytes.fromhex(pk), bytes.fromhex(msg), bytes.fromhex(sig))
    assert ok is (result == "valid"), flags


# RFC 8032 §7.1 test vectors: (secret key, public key, message, signature), all hex.
RFC8032 = {
    "TEST 1": (
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        "",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
        "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    ),
    "TEST 2": (
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        "72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
        "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
    "TEST 3": (
        "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
        "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
        "af82",
        "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac"
        "18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
    ),
    "TEST SHA(abc)": (
        "833fe62409237b9d62ec77587520911e9a759cec1d19755b7da901b96dca3d42",
        "ec172b93ad5e563bf4932c70e1245034c35467ef2efd4d64ebf819683467e2bf",
        "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a"
        "2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f",
        "dc2a4459e7369633a52b1bf277839a00201009a3efbf3ecb69bea2186c26b589"
        "09351fc9ac90b3ecfdfbc7c66431e0303dca179c138ac17ad9bef1177331a704",
    ),
}


@pytest.mark.parametrize("name", list(RFC8032))
def test_rfc8032_sign_and_verify(name):
    secret, public, message, signature = (bytes.fromhex(h) for h in RFC8032[name])
    key = KeyPair.from_seed(secret)
    assert key.public_bytes == public
    assert key.public_hex == public.hex()
    assert key.seed == secret
    assert key.sign(message) == signature
    assert verify_raw(public, message, signature) is True
    assert verify_raw(public, message + b"\x00", signature) is False


def test_rfc8032_sha_abc_message_is_sha512_of_abc():
    import hashlib

    assert RFC8032["TEST SHA(abc)"][2] == hashlib.sha512(b"abc").hexdigest()


@pytest.mark.parametrize("name", _jcs_names() or ["<missing>"])
def test_rfc8785_jcs(name):
    _require_vectors()
    source = (JCS / "input" / f"{name}.json").read_text(encoding="utf-8")
    expected = (JCS / "output" / f"{name}.json").read_bytes()
    expected_hex = "".join((JCS / "outhex" / f"{name}.txt").read_text().split())
    canonical = _jcs_bytes(json.loads(source))
    assert canonical == expected
    assert canonical.hex() == expected_hex.lower()
    assert bytes.fromhex(expected_hex) == expected

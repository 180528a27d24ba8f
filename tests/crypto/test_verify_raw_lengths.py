"""verify_raw (crypto/signing.py) checks what the libsodium binding does not: an Ed25519 key of
32 bytes and a signature of 64; anything else is False, never an error nor a read past it."""

from __future__ import annotations

import pytest

from crypto import KeyPair
from crypto.signing import verify_raw

KEY = KeyPair.generate()
DATA = b"hero-bus/v1/message\n{}"
SIGNATURE = KEY.sign(DATA)


def test_a_good_signature_verifies() -> None:
    assert verify_raw(KEY.public_bytes, DATA, SIGNATURE) is True


@pytest.mark.parametrize("size", [0, 31, 33, 64])
def test_a_key_of_another_length_verifies_nothing(size: int) -> None:
    key = (KEY.public_bytes * 2)[:size]
    assert verify_raw(key, DATA, SIGNATURE) is False


@pytest.mark.parametrize("size", [0, 63, 65, 128])
def test_a_signature_of_another_length_verifies_nothing(size: int) -> None:
    signature = (SIGNATURE + DATA * 8)[:size]
    assert verify_raw(KEY.public_bytes, DATA, signature) is False


@pytest.mark.parametrize("bad", [None, "x", 3, bytearray(32)])
def test_what_is_not_bytes_verifies_nothing(bad: object) -> None:
    assert verify_raw(bad, DATA, SIGNATURE) is False  # type: ignore[arg-type]
    assert verify_raw(KEY.public_bytes, bad, SIGNATURE) is False  # type: ignore[arg-type]
    assert verify_raw(KEY.public_bytes, DATA, bad) is False  # type: ignore[arg-type]

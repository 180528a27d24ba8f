"""Which key algorithms an actor may have, and what a valid public key of each is.

Reached when a key is first seen (a key a client is given, a peer's key in a handshake): what
verifies signatures (crypto/signing.py) parses each distinct signer's key once and keeps its
bytes, so signing and verifying a warm job's messages never comes here.
"""

from __future__ import annotations

import nacl.bindings
import nacl.exceptions

from crypto.errors import KeyFormatError
from crypto.secp256k1 import ALGORITHM_SECP256K1, parse_secp256k1_public_key

__all__ = [
    "ALGORITHM_ED25519",
    "ALGORITHMS",
    "PUBLIC_KEY_BYTES",
    "parse_public_key",
    "parse_public_key_for",
]

ALGORITHM_ED25519 = "ed25519"
ALGORITHMS = (ALGORITHM_ED25519, ALGORITHM_SECP256K1)
"""Every key algorithm an actor may have; node keys are always Ed25519."""
PUBLIC_KEY_BYTES = 32
_FIELD_P = 2**255 - 19
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")

# The 8 points of order dividing 8 (the torsion subgroup), canonically encoded.
_SMALL_ORDER_POINTS = frozenset(
    bytes.fromhex(h)
    for h in (
        "0100000000000000000000000000000000000000000000000000000000000000",  # identity
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # order 2
        "0000000000000000000000000000000000000000000000000000000000000000",  # order 4
        "0000000000000000000000000000000000000000000000000000000000000080",  # order 4
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",  # order 8
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",  # order 8
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",  # order 8
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",  # order 8
    )
)
_BASE_POINT = bytes.fromhex("5866666666666666666666666666666666666666666666666666666666666666")


def _public_key_bytes(value: str | bytes) -> bytes:
    """Decode ``value`` (64 hex chars or 32 raw bytes) without any curve checks.

    Raises:
        KeyFormatError: wrong type, wrong length, or not hexadecimal.
    """
    if isinstance(value, str):
        if len(value) != 2 * PUBLIC_KEY_BYTES:
            raise KeyFormatError(
                f"public key must be {2 * PUBLIC_KEY_BYTES} hex characters, got {len(value)}"
            )
        if not _HEX_DIGITS.issuperset(value):
            raise KeyFormatError("public key is not hexadecimal")
        return bytes.fromhex(value)
    if isinstance(value, bytes):
        if len(value) != PUBLIC_KEY_BYTES:
            raise KeyFormatError(f"public key must be {PUBLIC_KEY_BYTES} bytes, got {len(value)}")
        return value
    raise KeyFormatError(f"public key must be hex str or bytes, not {type(value).__name__}")


def parse_public_key(value: str | bytes) -> bytes:
    """Parse and validate an Ed25519 public key; return its 32 bytes.

    Refuses non-canonical encodings (y >= 2**255 - 19, or x = 0 with the sign bit set),
    the 8 small-order points (including the identity), points not on the curve, and points
    outside the prime-order subgroup (libsodium ``crypto_core_ed25519_is_valid_point``).

    Raises:
        KeyFormatError: with the reason, for any of the above or a wrong length / non-hex input.
    """
    raw = _public_key_bytes(value)
    sign_bit = raw[31] >> 7
    y = int.from_bytes(raw, "little") & ~(1 << 255)
    if y >= _FIELD_P:
        raise KeyFormatError("public key is a non-canonical encoding (y >= 2**255 - 19)")
    if sign_bit and y in (1, _FIELD_P - 1):
        raise KeyFormatError("public key is a non-canonical encoding (x = 0 with sign bit set)")
    if raw in _SMALL_ORDER_POINTS:
        raise KeyFormatError("public key is a small-order point (weak key)")
    if not nacl.bindings.crypto_core_ed25519_is_valid_point(raw):
        raise KeyFormatError(f"public key is {_invalid_point_reason(raw)}")
    return raw


def parse_public_key_for(algorithm: str, value: str | bytes) -> bytes:
    """Parse and validate a public key of ``algorithm`` (``ed25519`` or ``secp256k1``).

    Raises:
        KeyFormatError: an unknown algorithm, or the key is invalid for it (the subclasses of
            crypto/secp256k1.py name the secp256k1 cases: uncompressed, invalid point).
    """
    if algorithm == ALGORITHM_ED25519:
        return parse_public_key(value)
    if algorithm == ALGORITHM_SECP256K1:
        return parse_secp256k1_public_key(value)
    shown = algorithm[:40] if isinstance(algorithm, str) else type(algorithm).__name__
    raise KeyFormatError(f"unknown key algorithm {shown!r} (known: {', '.join(ALGORITHMS)})")


def _invalid_point_reason(raw: bytes) -> str:
    """Explain why libsodium refused ``raw``: off the curve, or carrying a torsion component."""
    try:
        nacl.bindings.crypto_core_ed25519_add(raw, _BASE_POINT)
    except nacl.exceptions.CryptoError:
        return "not a point on the Ed25519 curve"
    return "not in the prime-order subgroup (has a small-order component)"

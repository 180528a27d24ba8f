"""secp256k1 actor keys and ECDSA signatures, as upstream Hero signs jobs.

A signature is ECDSA over SHA-256 of the signing input (``hero-bus/v1/<domain>`` + newline +
canonical JSON, the same bytes an Ed25519 key signs), encoded as 64 bytes ``r || s`` (big
endian, 32 bytes each), with ``s`` at most n/2 ("low S"). ECDSA accepts both ``(r, s)`` and
``(r, n - s)`` for one message, so anyone could turn a valid signature into a second valid one;
refusing the high form leaves exactly one signature per (key, nonce, message), which keeps the
signature bytes usable as an identity. Signing is deterministic (RFC 6979), so the conformance
vectors can state the exact signature.

Public keys are compressed SEC1 points only (33 bytes: ``02``/``03`` then x): one encoding
per key, so the registered key and the key in a signature entry compare as strings.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)

from crypto.errors import KeyFormatError

__all__ = [
    "ALGORITHM_SECP256K1",
    "CURVE_ORDER",
    "HighSError",
    "InvalidPointError",
    "Secp256k1KeyPair",
    "UncompressedKeyError",
    "parse_secp256k1_public_key",
    "verify_secp256k1",
]

ALGORITHM_SECP256K1 = "secp256k1"
CURVE_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
HALF_ORDER = CURVE_ORDER // 2
SECRET_BYTES = 32
PUBLIC_KEY_BYTES = 33
SIGNATURE_BYTES = 64
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
# RFC 6979: the same key and input always give the same signature (vectors, no RNG at sign time).
_ECDSA = ec.ECDSA(hashes.SHA256(), deterministic_signing=True)


class UncompressedKeyError(KeyFormatError):
    """A secp256k1 public key in the uncompressed SEC1 form (``04`` + x + y)."""

    token = "uncompressed_key"


class InvalidPointError(KeyFormatError):
    """A well-formed compressed key whose x gives no point on secp256k1."""

    token = "invalid_point"


class HighSError(KeyFormatError):
    """An ECDSA signature whose s is above n/2 (the malleable twin of a low-S signature)."""

    token = "high_s"


@dataclass(frozen=True)
class Secp256k1KeyPair:
    """A secp256k1 signing key. ``repr`` never shows the secret."""

    private_key: ec.EllipticCurvePrivateKey = field(repr=False)
    algorithm: str = field(default=ALGORITHM_SECP256K1, init=False)

    @classmethod
    def generate(cls) -> Secp256k1KeyPair:
        """Create a new random key (the OS CSPRNG, through OpenSSL)."""
        return cls(ec.generate_private_key(ec.SECP256K1()))

    @classmethod
    def from_seed(cls, seed: bytes) -> Secp256k1KeyPair:
        """Build a key from its 32-byte big-endian secret scalar (1 <= d < n).

        Raises:
            KeyFormatError: not 32 bytes, or the scalar is 0 or not below the curve order.
        """
        if not isinstance(seed, bytes) or len(seed) != SECRET_BYTES:
            raise KeyFormatError(f"a secp256k1 secret must be exactly {SECRET_BYTES} bytes")
        scalar = int.from_bytes(seed, "big")
        if not 0 < scalar < CURVE_ORDER:
            raise KeyFormatError("a secp256k1 secret must be in [1, n - 1]")
        return cls(ec.derive_private_key(scalar, ec.SECP256K1()))

    @property
    def seed(self) -> bytes:
        """The 32-byte secret scalar (the key file's ``seed``)."""
        return self.private_key.private_numbers().private_value.to_bytes(SECRET_BYTES, "big")

    @property
    def public_bytes(self) -> bytes:
        """The 33-byte compressed SEC1 public key."""
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint
        )

    @property
    def public_hex(self) -> str:
        """The public key as 66 lowercase hex characters."""
        return self.public_bytes.hex()

    def sign(self, data: bytes) -> bytes:
        """Return the 64-byte low-S ``r || s`` ECDSA signature of SHA-256(``data``)."""
        r, s = decode_dss_signature(self.private_key.sign(data, _ECDSA))
        if s > HALF_ORDER:
            s = CURVE_ORDER - s
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")

    def __repr__(self) -> str:
        return f"Secp256k1KeyPair(public_hex={self.public_hex!r})"


def parse_secp256k1_public_key(value: str | bytes) -> bytes:
    """Parse and validate a compressed secp256k1 public key; return its 33 bytes.

    Raises:
        UncompressedKeyError: the key is in the 65-byte ``04`` form.
        InvalidPointError: ``02``/``03`` + x where x is no point's coordinate (or x >= p).
        KeyFormatError: any other length, prefix, or non-hex input.
    """
    raw = _key_bytes(value)
    if len(raw) == 65 and raw[0] == 4:
        raise UncompressedKeyError(
            "secp256k1 public key is uncompressed (04 + x + y); give the 33-byte compressed "
            "form (02/03 + x)"
        )
    if len(raw) != PUBLIC_KEY_BYTES or raw[0] not in (2, 3):
        raise KeyFormatError(
            "secp256k1 public key must be 33 bytes (66 hex characters) starting with 02 or 03"
        )
    _public_key(raw)
    return raw


def _key_bytes(value: str | bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise KeyFormatError(f"public key must be hex str or bytes, not {type(value).__name__}")
    if len(value) % 2 or not _HEX_DIGITS.issuperset(value):
        raise KeyFormatError("secp256k1 public key is not hexadecimal")
    return bytes.fromhex(value)


@functools.lru_cache(maxsize=4096)
def _public_key(raw: bytes) -> ec.EllipticCurvePublicKey:
    """Decode (and check on the curve) once per distinct key: actors sign over and over."""
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256K1(), raw)
    except ValueError:
        raise InvalidPointError("secp256k1 public key is not a point on the curve") from None


def split_signature(signature: bytes) -> tuple[int, int]:
    """``(r, s)`` of a 64-byte signature, both in [1, n - 1] and s low.

    Raises:
        HighSError: s > n/2. KeyFormatError: wrong length, r or s out of range.
    """
    if not isinstance(signature, bytes) or len(signature) != SIGNATURE_BYTES:
        raise KeyFormatError(f"a secp256k1 signature must be {SIGNATURE_BYTES} bytes (r || s)")
    r, s = int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
    if not (0 < r < CURVE_ORDER and 0 < s < CURVE_ORDER):
        raise KeyFormatError("secp256k1 signature: r and s must be in [1, n - 1]")
    if s > HALF_ORDER:
        raise HighSError("secp256k1 signature has a high S (s > n/2); only low-S is accepted")
    return r, s


def verify_secp256k1(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True iff ``signature`` (low-S ``r || s``) signs SHA-256(``message``) under the compressed
    ``public_key``. Never raises: a bad key, a high S or a forged signature all give False."""
    try:
        r, s = split_signature(signature)
        key = _public_key(parse_secp256k1_public_key(public_key))
        key.verify(encode_dss_signature(r, s), message, ec.ECDSA(hashes.SHA256()))
    except (KeyFormatError, InvalidSignature, TypeError, ValueError):
        return False
    return True

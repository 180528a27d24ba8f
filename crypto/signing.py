"""Ed25519 keys, and detached Ed25519 and secp256k1 signatures over domain-separated canonical
JSON: what signs and verifies every message (the key files are crypto/keyfiles.py's).

A signature entry on the wire is ``{"algorithm": "ed25519", "public_key": <64 hex>,
"signature": <128 hex>}`` or ``{"algorithm": "secp256k1", "public_key": <66 hex, compressed>,
"signature": <128 hex, r || s, low S>}`` (crypto/secp256k1.py); an object carries a list of
them. :func:`verify_object` never raises
on wire input: every problem becomes a :class:`Verdict` with ``ok=False`` and a reason token.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from dataclasses import dataclass, field

import nacl.bindings
import nacl.exceptions
import nacl.signing
from nacl.bindings import crypto_sign_open, crypto_sign_PUBLICKEYBYTES

from crypto.canonical import signing_input
from crypto.errors import CanonicalError, KeyFormatError
from crypto.secp256k1 import (
    ALGORITHM_SECP256K1,
    HighSError,
    InvalidPointError,
    Secp256k1KeyPair,
    UncompressedKeyError,
    parse_secp256k1_public_key,
    split_signature,
    verify_secp256k1,
)

__all__ = [
    "ALGORITHM_ED25519",
    "ALGORITHM_SECP256K1",
    "ALGORITHMS",
    "MAX_SIGNATURES",
    "PUBLIC_KEY_BYTES",
    "SEED_BYTES",
    "VERDICT_REASONS",
    "KeyPair",
    "Signer",
    "Verdict",
    "parse_public_key",
    "parse_public_key_for",
    "sign_object",
    "verify_object",
    "verify_raw",
]

ALGORITHM_ED25519 = "ed25519"
ALGORITHMS = (ALGORITHM_ED25519, ALGORITHM_SECP256K1)
"""Every key algorithm an actor may have; node keys are always Ed25519."""
SEED_BYTES = 32
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


# -- keys ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyPair:
    """An Ed25519 signing key (and its public key). ``repr`` never shows the secret."""

    signing_key: nacl.signing.SigningKey = field(repr=False)
    algorithm: str = field(default=ALGORITHM_ED25519, init=False)

    @classmethod
    def generate(cls) -> KeyPair:
        """Create a new random key pair (libsodium's CSPRNG)."""
        return cls(nacl.signing.SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> KeyPair:
        """Build a key pair from its 32-byte secret seed (RFC 8032 "secret key").

        Raises:
            KeyFormatError: ``seed`` is not exactly 32 bytes.
        """
        if not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
            raise KeyFormatError(f"an Ed25519 seed must be exactly {SEED_BYTES} bytes")
        return cls(nacl.signing.SigningKey(seed))

    @property
    def seed(self) -> bytes:
        """The 32-byte secret seed."""
        return bytes(self.signing_key)

    @property
    def public_bytes(self) -> bytes:
        """The 32-byte public key."""
        return bytes(self.signing_key.verify_key)

    @functools.cached_property
    def public_hex(self) -> str:
        """The public key as 64 lowercase hex characters (formatted once: a node reads its
        own id several times for every message it admits)."""
        return self.public_bytes.hex()

    @functools.cached_property
    def _secret(self) -> bytes:
        """libsodium's 64-byte secret key (seed || public key), derived once."""
        return nacl.bindings.crypto_sign_seed_keypair(self.seed)[1]

    def sign(self, data: bytes) -> bytes:
        """Return the 64-byte detached Ed25519 signature of ``data``."""
        # the binding itself: SigningKey.sign wraps the same bytes in a SignedMessage and
        # its encoders, ~1 us of a client's per-message CPU
        return nacl.bindings.crypto_sign(data, self._secret)[: nacl.bindings.crypto_sign_BYTES]

    def __repr__(self) -> str:
        return f"KeyPair(public_hex={self.public_hex!r})"


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


Signer = KeyPair | Secp256k1KeyPair
"""A key that signs for an actor: Ed25519 or secp256k1 (``.algorithm`` says which)."""


def _invalid_point_reason(raw: bytes) -> str:
    """Explain why libsodium refused ``raw``: off the curve, or carrying a torsion component."""
    try:
        nacl.bindings.crypto_core_ed25519_add(raw, _BASE_POINT)
    except nacl.exceptions.CryptoError:
        return "not a point on the Ed25519 curve"
    return "not in the prime-order subgroup (has a small-order component)"


# -- signatures ---------------------------------------------------------------------------------

SIGNATURE_BYTES = 64
MAX_SIGNATURES = 16
"""Signature lists longer than this are refused (bounds the verification work per object)."""

VERDICT_REASONS = frozenset(
    {
        "ok",
        "no_signature",
        "malformed_signature",
        "unsupported_algorithm",
        "bad_signature",
        "wrong_signer",
        "malformed_content",
        "wrong_algorithm",
        "malformed_key",
        "uncompressed_key",
        "invalid_point",
        "high_s",
    }
)
# When no entry is accepted, the most informative failure wins (higher = more informative).
_FAILURE_RANK = {
    "no_signature": 0,
    "unsupported_algorithm": 1,
    "wrong_algorithm": 2,
    "malformed_signature": 3,
    "malformed_key": 3,
    "uncompressed_key": 3,
    "invalid_point": 3,
    "high_s": 4,
    "bad_signature": 4,
    "wrong_signer": 5,
}
# What a secp256k1 key or signature that cannot be parsed is refused as (Ed25519 entries keep
# malformed_signature for every such problem).
_SECP_TOKENS: dict[type[KeyFormatError], str] = {
    UncompressedKeyError: "uncompressed_key",
    InvalidPointError: "invalid_point",
    HighSError: "high_s",
}


@dataclass(frozen=True)
class Verdict:
    """Outcome of a verification.

    ``reason`` is a machine token from :data:`VERDICT_REASONS`; ``signer`` is the hex public
    key whose signature verified (also set for ``wrong_signer``); ``detail`` is human text.
    """

    ok: bool
    reason: str
    signer: str | None = None
    detail: str = ""


def verify_raw(
    public_key: bytes, message: bytes, signature: bytes, algorithm: str = ALGORITHM_ED25519
) -> bool:
    """Return True iff ``signature`` is a valid Ed25519 signature of ``message`` by ``public_key``.

    Never raises for bad input: wrong types or lengths, invalid keys and forged signatures all
    give False. (libsodium rejects non-canonical S, small-order R/A and non-canonical A.)
    With ``algorithm`` ``secp256k1``: ECDSA over SHA-256, compressed key, low-S ``r || s``.
    """
    # no generator and no VerifyKey: every message admitted is verified here, in a node
    # whose caches the other processes of a job's trip have just used
    if not (
        isinstance(public_key, bytes)
        and isinstance(message, bytes)
        and isinstance(signature, bytes)
    ):
        return False
    if algorithm == ALGORITHM_SECP256K1:
        return verify_secp256k1(public_key, message, signature)
    if algorithm != ALGORITHM_ED25519:
        return False
    # the lengths VerifyKey and its verify check, checked here: the binding checks none
    if len(public_key) != _ED25519_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        crypto_sign_open(signature + message, public_key)
    except (nacl.exceptions.CryptoError, ValueError, TypeError):
        return False
    return True


_ED25519_KEY_BYTES = crypto_sign_PUBLICKEYBYTES


@functools.lru_cache(maxsize=4096)
def _parse_public_key_cached(value: str, algorithm: str = ALGORITHM_ED25519) -> bytes:
    """parse_public_key (point validation included) once per distinct key; errors not cached."""
    return parse_public_key_for(algorithm, value)


def sign_object(key: Signer, domain: str, value: object) -> dict[str, str]:
    """Sign ``value`` under ``domain``; return a signature entry for the wire.

    Raises:
        CanonicalError: bad domain, or ``value`` cannot be canonicalised.
    """
    signature = key.sign(signing_input(domain, value))
    return {
        "algorithm": key.algorithm,
        "public_key": key.public_hex,
        "signature": signature.hex(),
    }


def _parse_entry(
    entry: object, expected_algorithm: str | None
) -> tuple[str, bytes, bytes] | Verdict:
    """Return ``(algorithm, public_key, signature)`` of a wire entry, or a failure Verdict.
    ``expected_algorithm``: the one algorithm the entry may have (None: any known one)."""
    if not isinstance(entry, dict):
        return Verdict(False, "malformed_signature", detail="signature entry is not an object")
    algorithm = entry.get("algorithm")
    if algorithm not in ALGORITHMS:
        return Verdict(
            False, "unsupported_algorithm", detail=f"unsupported algorithm {algorithm!r}"[:200]
        )
    if expected_algorithm is not None and algorithm != expected_algorithm:
        detail = f"a {algorithm} signature, but the signer's key is {expected_algorithm}"
        return Verdict(False, "wrong_algorithm", detail=detail)
    public_hex, signature_hex = entry.get("public_key"), entry.get("signature")
    if not isinstance(public_hex, str) or not isinstance(signature_hex, str):
        return Verdict(False, "malformed_signature", detail="public_key/signature missing")
    secp = algorithm == ALGORITHM_SECP256K1
    try:
        public_key = _parse_public_key_cached(public_hex, algorithm)
    except KeyFormatError as exc:
        token = _SECP_TOKENS.get(type(exc), "malformed_key") if secp else "malformed_signature"
        return Verdict(False, token, detail=str(exc))
    if len(signature_hex) != 2 * SIGNATURE_BYTES or not _is_hex(signature_hex):
        return Verdict(False, "malformed_signature", detail="signature is not 128 hex characters")
    signature = bytes.fromhex(signature_hex)
    if secp:
        try:
            split_signature(signature)
        except KeyFormatError as exc:
            return Verdict(False, _SECP_TOKENS.get(type(exc), "malformed_signature"), str(exc))
    return algorithm, public_key, signature


_HEX = re.compile(r"[0-9a-fA-F]*")


def _is_hex(text: str) -> bool:
    # a regex, not a per-character loop: this runs for every signature verified
    return _HEX.fullmatch(text) is not None


def _check_entry(
    entry: object, message: bytes, expected: bytes | None, expected_algorithm: str | None
) -> Verdict:
    parsed = _parse_entry(entry, expected_algorithm)
    if isinstance(parsed, Verdict):
        return parsed
    algorithm, public_key, signature = parsed
    signer = public_key.hex()
    if not verify_raw(public_key, message, signature, algorithm):
        return Verdict(False, "bad_signature", detail=f"signature by {signer} does not verify")
    if expected is not None and public_key != expected:
        return Verdict(
            False,
            "wrong_signer",
            signer=signer,
            detail=f"valid signature by {signer}, but the expected signer is {expected.hex()}",
        )
    return Verdict(True, "ok", signer=signer, detail=f"valid signature by {signer}")


def verify_object(
    signatures: object,
    domain: str,
    value: object,
    *,
    expected_public_key: str | None = None,
    expected_algorithm: str = ALGORITHM_ED25519,
    accepted: Collection[str] | None = None,
) -> Verdict:
    """Check the wire signature list ``signatures`` over ``value`` under ``domain``.

    Accepts if at least one entry verifies and, when ``expected_public_key`` is given, is by
    that key, of ``expected_algorithm`` (without one, an entry of any known algorithm may).
    Garbage input never raises; it yields ``ok=False`` with a reason: ``no_signature``,
    ``malformed_signature``, ``unsupported_algorithm``, ``bad_signature``, ``wrong_signer``
    (valid, but by another key), ``malformed_content``, ``wrong_algorithm`` (an entry of
    another algorithm than the signer's, or a signer whose algorithm is not in ``accepted``),
    and for secp256k1 entries
    ``malformed_key``, ``uncompressed_key``, ``invalid_point`` and ``high_s``.

    Never raises: an invalid ``expected_public_key`` (not a valid key of its algorithm) can
    match no signer, so it gives ``wrong_signer`` with a detail saying the expected key is
    invalid.
    """
    if accepted is not None and expected_algorithm not in accepted:
        detail = f"{expected_algorithm} keys are not accepted here (only {', '.join(accepted)})"
        return Verdict(False, "wrong_algorithm", detail=detail)
    expected: bytes | None = None
    if expected_public_key is not None:
        try:
            expected = _parse_public_key_cached(expected_public_key, expected_algorithm)
        except KeyFormatError as exc:
            detail = f"the expected public key is invalid: {exc}"
            return Verdict(False, "wrong_signer", detail=detail)
    if signatures is None or (isinstance(signatures, list) and not signatures):
        return Verdict(False, "no_signature", detail="the object carries no signature")
    if not isinstance(signatures, list):
        return Verdict(False, "malformed_signature", detail="signatures is not a list")
    if len(signatures) > MAX_SIGNATURES:
        return Verdict(
            False, "malformed_signature", detail=f"more than {MAX_SIGNATURES} signatures"
        )
    try:
        message = signing_input(domain, value)
    except CanonicalError as exc:
        return Verdict(False, "malformed_content", detail=str(exc))
    best = Verdict(False, "no_signature", detail="the object carries no signature")
    for entry in signatures:
        required = expected_algorithm if expected_public_key is not None else None
        verdict = _check_entry(entry, message, expected, required)
        if verdict.ok:
            return verdict
        if _FAILURE_RANK[verdict.reason] > _FAILURE_RANK[best.reason]:
            best = verdict
    return best

"""Detached Ed25519 and secp256k1 signatures over domain-separated canonical JSON.

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
from dataclasses import dataclass

import nacl.exceptions
from nacl.bindings import crypto_sign_open, crypto_sign_PUBLICKEYBYTES

from crypto.canonical import signing_input
from crypto.errors import CanonicalError, KeyFormatError
from crypto.keys import ALGORITHM_ED25519, ALGORITHMS, Signer, parse_public_key_for
from crypto.secp256k1 import (
    ALGORITHM_SECP256K1,
    HighSError,
    InvalidPointError,
    UncompressedKeyError,
    split_signature,
    verify_secp256k1,
)

__all__ = [
    "ALGORITHM_ED25519",
    "ALGORITHM_SECP256K1",
    "ALGORITHMS",
    "MAX_SIGNATURES",
    "VERDICT_REASONS",
    "Verdict",
    "sign_object",
    "verify_object",
    "verify_raw",
]

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

"""The bytes a signature covers and the signature over them: what signs and verifies every
message.

The signed bytes are ``hero-bus/v1/<domain>`` + newline + the RFC 8785 (JCS) canonical JSON of
the content, integer-only: ``None``, ``bool``, ``int`` (within the exact range of an IEEE
double, ``|n| <= 2**53 - 1``), ``str``, ``list``/``tuple`` and ``dict`` with ``str`` keys.
Floats are refused everywhere: two implementations can disagree on how to print them, and a
signature must never depend on that. The domain separates kinds of signed objects.

A signature entry on the wire is ``{"algorithm": "ed25519", "public_key": <64 hex>,
"signature": <128 hex>}`` or ``{"algorithm": "secp256k1", "public_key": <66 hex, compressed>,
"signature": <128 hex, r || s, low S>}`` (crypto/secp256k1.py); an object carries a list of
them. :func:`verify_object` never raises on wire input: every problem becomes a
:class:`Verdict` with ``ok=False`` and a reason token.

What a warm job's signing does not use lives beside: parsing and validating public keys
(crypto/public_keys.py, once per key), strict JSON reading (crypto/strict_json.py) and key
files (crypto/keyfiles.py).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import NoReturn

import msgspec
import nacl.bindings
import nacl.exceptions
import nacl.signing
import orjson
import rfc8785
from nacl.bindings import crypto_sign_open, crypto_sign_PUBLICKEYBYTES

from crypto.errors import CanonicalError, KeyFormatError
from crypto.public_keys import ALGORITHM_ED25519, ALGORITHMS, parse_public_key_for
from crypto.secp256k1 import (
    ALGORITHM_SECP256K1,
    HighSError,
    InvalidPointError,
    Secp256k1KeyPair,
    UncompressedKeyError,
    split_signature,
    verify_secp256k1,
)

__all__ = [
    "DOMAIN_PREFIX",
    "MAX_DEPTH",
    "MAX_SAFE_INTEGER",
    "MAX_SIGNATURES",
    "SEED_BYTES",
    "VERDICT_REASONS",
    "KeyPair",
    "Signer",
    "Verdict",
    "canonical_json",
    "check_canonical_value",
    "sign_object",
    "signing_input",
    "verify_object",
    "verify_raw",
]

# -- the signed bytes ---------------------------------------------------------------------------

DOMAIN_PREFIX = "hero-bus/v1/"
MAX_SAFE_INTEGER = 2**53 - 1
"""Largest integer JCS represents exactly (JavaScript Number.MAX_SAFE_INTEGER)."""
MAX_DEPTH = 128
"""Maximum nesting of arrays/objects accepted in canonical content."""

_DOMAIN_RE = re.compile(r"[a-z0-9_-]+")


def _jcs_bytes(value: object) -> bytes:
    """Serialise ``value`` with RFC 8785 (JCS) *allowing floats*; internal, used for conformance.

    Raises:
        CanonicalError: rfc8785 refused the value (NaN/Infinity, unsafe integer, lone surrogate,
            non-str key, unsupported type) or it is nested too deeply.
    """
    try:
        return rfc8785.dumps(value)  # type: ignore[arg-type]
    except RecursionError as exc:
        raise CanonicalError("content is nested too deeply to canonicalise") from exc
    except (ValueError, TypeError) as exc:  # rfc8785.CanonicalizationError is a ValueError
        raise CanonicalError(f"content cannot be canonicalised (RFC 8785): {exc}") from exc


def _fail(path: str, what: str) -> NoReturn:
    raise CanonicalError(f"{what} at {path}; signed content must be integer-only JSON")


def check_canonical_value(value: object, path: str, depth: int) -> None:
    """Walk ``value`` and refuse anything outside integer-only JSON, naming where.

    Raises:
        CanonicalError: float, unsafe integer, non-str key, unsupported type, or too deep.
    """
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            _fail(path, f"integer {value} is outside +/-(2**53 - 1) and cannot be represented")
        return
    if isinstance(value, float):
        _fail(path, f"float {value!r} is not allowed")
    if depth >= MAX_DEPTH:
        _fail(path, f"nesting deeper than {MAX_DEPTH} levels")
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if type(item) is not str:
                check_canonical_value(item, f"{path}[{index}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                _fail(path, f"object key {key!r} of type {type(key).__name__} is not a string")
            if type(item) is not str:
                check_canonical_value(item, f"{path}.{key}", depth + 1)
        return
    _fail(path, f"value of unsupported type {type(value).__name__}")


_ORJSON = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER


def _fast_admits(value: object, depth: int = 0) -> bool:
    """True if ``value`` is made only of the exact types None, bool, int (within the safe
    range), str, list, tuple and dict with str keys inside the BMP, at most :data:`MAX_DEPTH`
    deep: content for which orjson with sorted keys prints exactly the RFC 8785 bytes (integers
    print alike; orjson escapes strings as JCS does, ``\\uXXXX`` lowercase for the other control
    characters; sorted code points equal sorted UTF-16 code units inside the BMP). Anything else,
    subclasses included, goes the reference way. No paths are built: this runs per message."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER  # type: ignore[operator]
    if depth >= MAX_DEPTH:
        return False
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str or (not key.isascii() and max(key) > "\uffff"):
                return False
            # text and counts (most of a message) judged here, without a call of their own
            t = type(item)
            if t is int:
                if not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                    return False
            elif t is not str and not _fast_admits(item, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:  # type: ignore[attr-defined]
            t = type(item)
            if t is int:
                if not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                    return False
            elif t is not str and not _fast_admits(item, depth + 1):
                return False
        return True
    return False


def canonical_json(value: object) -> bytes:
    """Return the RFC 8785 (JCS) canonical bytes of an integer-only JSON value.

    Fast path: content :func:`_fast_admits` is printed by orjson with sorted keys (about 50
    times cheaper than the reference; tests/crypto/test_crypto_props.py checks both agree
    wherever the guard admits). Everything else (subclasses of the JSON types, keys outside the
    BMP, whose UTF-16 order differs, and anything to refuse) goes through
    :func:`check_canonical_value`, which names what is wrong, and the ``rfc8785`` reference
    implementation.

    Raises:
        CanonicalError: the value contains a float (anywhere), an integer outside
            ``+/-(2**53 - 1)``, a non-str dict key, a type other than
            None/bool/int/str/list/tuple/dict, a string that is not valid Unicode
            (lone surrogate), or is nested more than :data:`MAX_DEPTH` levels.
    """
    try:
        if _fast_admits(value):
            return orjson.dumps(value, option=_ORJSON)
    except orjson.JSONEncodeError:
        pass  # a lone surrogate: the reference path says so precisely
    except RecursionError as exc:
        raise CanonicalError("content is nested too deeply to canonicalise") from exc
    check_canonical_value(value, "$", 0)
    return _jcs_bytes(value)


class Canonical(msgspec.Struct, frozen=True):
    """Content that prints its own canonical JSON: ``encode()`` returns exactly the bytes
    :func:`canonical_json` gives for the content, or raises the CanonicalError it raises.

    For a model whose shape its owner knows (a message: bus/core/models.py), printed straight
    from its fields in C instead of through a dict :func:`canonical_json` first walks. Signing
    and verifying call ``encode`` where they would canonicalise, so a refusal comes at the same
    step with the same reason."""

    encode: Callable[[], bytes]


def signing_input(domain: str, value: object) -> bytes:
    """Return the exact bytes that get signed: ``hero-bus/v1/<domain>\\n<canonical JSON>``.

    The domain separates kinds of signed objects, so a signature over one kind can never be
    replayed as another. ``value`` may be a :class:`Canonical`, which prints itself.

    Raises:
        CanonicalError: ``domain`` is not a non-empty token of ``[a-z0-9_-]``, or ``value``
            cannot be canonicalised (see :func:`canonical_json`).
    """
    head = _HEADS.get(domain) if type(domain) is str else None
    if head is None:
        if not isinstance(domain, str) or not _DOMAIN_RE.fullmatch(domain):
            raise CanonicalError(
                f"invalid signing domain {domain!r}: must be a non-empty token of [a-z0-9_-]"
            )
        head = DOMAIN_PREFIX.encode("ascii") + domain.encode("ascii") + b"\n"
        if len(_HEADS) < _HEADS_MAX:
            _HEADS[domain] = head
    if type(value) is Canonical:
        return head + value.encode()
    return head + canonical_json(value)


# the checked prefix of each domain seen (a handful: one per kind of signed object), so that
# signing or verifying one object does not check and encode its domain again
_HEADS: dict[str, bytes] = {}
_HEADS_MAX = 64


# -- keys ---------------------------------------------------------------------------------------

SEED_BYTES = 32


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


Signer = KeyPair | Secp256k1KeyPair
"""A key that signs for an actor: Ed25519 or secp256k1 (``.algorithm`` says which)."""


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


class Verdict(msgspec.Struct, frozen=True):
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
    # the worst failure so far: none is made when the first entry verifies (most often)
    best: Verdict | None = None
    for entry in signatures:
        required = expected_algorithm if expected_public_key is not None else None
        verdict = _check_entry(entry, message, expected, required)
        if verdict.ok:
            return verdict
        if best is None or _FAILURE_RANK[verdict.reason] > _FAILURE_RANK[best.reason]:
            best = verdict
    return best or Verdict(False, "no_signature", detail="the object carries no signature")

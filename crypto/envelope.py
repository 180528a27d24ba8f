"""Signed envelopes as used by ``hero-verify``: ``{"domain", "payload", "signatures"}``.

The signature covers ``signing_input(domain, payload)``; other top-level keys of an envelope
are ignored (and therefore not authenticated).
"""

from __future__ import annotations

from crypto.errors import CanonicalError
from crypto.signing import Signer, Verdict, sign_object, signing_input, verify_object

__all__ = ["DEFAULT_DOMAIN", "check_envelope", "sign_envelope", "verify_envelope"]

DEFAULT_DOMAIN = "envelope"


def sign_envelope(key: Signer, payload: object, domain: str = DEFAULT_DOMAIN) -> dict[str, object]:
    """Return ``{"domain": domain, "payload": payload, "signatures": [<entry by key>]}``.

    Raises:
        CanonicalError: bad domain, or ``payload`` cannot be canonicalised (e.g. has a float).
    """
    return {"domain": domain, "payload": payload, "signatures": [sign_object(key, domain, payload)]}


def check_envelope(doc: object) -> tuple[str, object, object]:
    """Return ``(domain, payload, signatures)`` if ``doc`` has the shape of an envelope.

    Raises:
        CanonicalError: ``doc`` is not an object with a valid string ``domain``, a ``payload``
            and a ``signatures`` field.
    """
    if not isinstance(doc, dict):
        raise CanonicalError(f"not an envelope: expected a JSON object, got {type(doc).__name__}")
    missing = [name for name in ("domain", "payload", "signatures") if name not in doc]
    if missing:
        raise CanonicalError(f"not an envelope: missing field(s) {', '.join(missing)}")
    domain = doc["domain"]
    if not isinstance(domain, str):
        raise CanonicalError("not an envelope: 'domain' must be a string")
    try:
        signing_input(domain, None)
    except CanonicalError as exc:
        raise CanonicalError(f"not an envelope: {exc}") from exc
    return domain, doc["payload"], doc["signatures"]


def verify_envelope(doc: object, expected_public_key: str | None) -> Verdict:
    """Verify a parsed envelope; see :func:`crypto.signing.verify_object` for the verdicts.

    Raises:
        CanonicalError: ``doc`` does not have the shape of an envelope (see
            :func:`check_envelope`); everything about signatures/payload is a Verdict instead.
    """
    domain, payload, signatures = check_envelope(doc)
    return verify_object(signatures, domain, payload, expected_public_key=expected_public_key)

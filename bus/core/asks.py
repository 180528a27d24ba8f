"""What the two signed asks a node carries to a peer have in common: a trace ask
(bus/core/traces.py, signed by an actor) and a summary ask (bus/core/summaries.py, signed by
the asking node). Pure, no I/O.

Both are frozen records signed under their own domain over every field but their signatures,
in field order; both name the asking node, the answering node, a time and a nonce, and the
answering node checks those the same way. Written once so the two cannot drift apart: the
signed bytes of both are pinned by PROTOCOL.md's vectors (ed25519-trace-ask,
ed25519-summary-ask), which tests/bus/test_protocol_vectors.py and the JS actor check.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import Field, fields, replace
from typing import Any, ClassVar, Self

from bus.core.reasons import Reason
from bus.core.verify import Freshness
from crypto import Signer, sign_object, verify_object

MAX_SIGNATURES = 4

_HEX64 = re.compile(r"[0-9a-f]{64}")
_NONCE = re.compile(r"[0-9a-f]{16,64}")


class AskRefused(Exception):  # noqa: N818 - a refusal, not an error of the code
    """Why an ask is not answered: ``reason`` (a token) and ``detail`` (human text)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class SignedAsk:
    """A frozen dataclass's signed-ask methods. The dataclass declares ``signatures`` as its
    last field; :attr:`DOMAIN` names what its signature is for."""

    DOMAIN: ClassVar[str]
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]
    node: str  # the asking node: the answering node checks its link comes from there
    target: str  # the answering node
    created_at: int
    signatures: tuple[Mapping[str, str], ...]

    def signed_dict(self) -> dict[str, Any]:
        """Every field but the signatures, in field order; tuples as lists (JSON arrays)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name != "signatures":
                value = getattr(self, f.name)
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def to_dict(self) -> dict[str, Any]:
        return self.signed_dict() | {"signatures": [dict(s) for s in self.signatures]}

    def signed(self, signer: Signer) -> Self:
        sig = sign_object(signer, self.DOMAIN, self.signed_dict())
        return replace(self, signatures=(sig,))

    def signature_problem(self, public_key: str, algorithm: str) -> AskRefused | None:
        """None if the ask is signed under its domain by ``public_key``."""
        verdict = verify_object(
            list(self.signatures),
            self.DOMAIN,
            self.signed_dict(),
            expected_public_key=public_key,
            expected_algorithm=algorithm,
        )
        if verdict.ok:
            return None
        return AskRefused(verdict.reason, verdict.detail or "the ask's signature does not verify")


def checked_object(obj: object, what: str, ints: Sequence[str]) -> dict[str, Any]:
    """``obj`` if it is an ask's wire object whose ``ints`` are integers, whose ``node``,
    ``target`` and ``nonce`` are hex and whose ``signatures`` are a short list of objects;
    AskRefused(malformed) naming the first field that is not (``what``: "ask", "summary ask")."""
    if not isinstance(obj, dict):
        raise AskRefused(Reason.MALFORMED, f"{what} is not an object")
    for name in ints:
        value = obj.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
            raise AskRefused(Reason.MALFORMED, f"{what} field {name!r} missing or not an integer")
    for name, pattern in (("node", _HEX64), ("target", _HEX64), ("nonce", _NONCE)):
        value = obj.get(name)
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise AskRefused(Reason.MALFORMED, f"{what} field {name!r} missing or malformed")
    sigs = obj.get("signatures")
    if (
        not isinstance(sigs, list)
        or not all(isinstance(s, dict) for s in sigs)
        or len(sigs) > MAX_SIGNATURES
    ):
        raise AskRefused(
            Reason.MALFORMED, f"{what} signatures must be a list of up to {MAX_SIGNATURES} objects"
        )
    return obj


def route_problem(
    ask: SignedAsk, *, link_peer: str, own_id: str, now: int, freshness: Freshness
) -> AskRefused | None:
    """What the link and the clock refuse in an ask (None if nothing): it comes from the node
    it names, is for this node, and is fresh."""
    if ask.node != link_peer:
        return AskRefused(Reason.WRONG_ORIGIN, "the ask names another node than its link's")
    if ask.target != own_id:
        return AskRefused(Reason.WRONG_DESTINATION, "the ask is for another node")
    age = now - ask.created_at
    if age > freshness.max_age_s:
        return AskRefused(
            Reason.EXPIRED, f"asked {age} s ago; the limit is {freshness.max_age_s} s"
        )
    if -age > freshness.max_skew_s:
        return AskRefused(Reason.FROM_FUTURE, f"dated {-age} s ahead")
    return None

"""Mutual node authentication over fresh nonces. Pure functions; the transport does the I/O.

1. initiator -> ``hello {v, node: I, nonce: nI}``
2. responder checks I is a known peer, -> ``hello {v, node: R, nonce: nR}``
   and ``welcome`` is deferred until the initiator proves itself:
3. initiator checks R is the node it dialled, -> ``auth {sig: sign_I(transcript(initiator))}``
4. responder verifies, -> ``welcome {sig: sign_R(transcript(responder))}``
5. initiator verifies. Only now do data frames flow, in both directions.

The transcript binds the protocol version, both node ids and both nonces, and the signer's role,
so neither a replayed signature nor a reflected one (R's signature passed off as I's) verifies.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from bus.core.errors import HandshakeError
from bus.core.frames import Hello
from bus.core.reasons import Reason
from crypto import KeyPair, parse_public_key, sign_object, verify_object
from crypto.errors import KeyFormatError

# 2: data travels in batch frames (``msgs`` answered by ``acks``, see bus/core/frames.py), which a
# v1
# node would take for bad frames and never acknowledge: the versions refuse each other at once.
PROTOCOL_VERSION = 2
DOMAIN = "handshake"
NONCE_BYTES = 32
# what a refusal for a certificate mismatch says, in the log and in the close reason
CHANNEL_MISMATCH = "TLS certificate mismatch, a relay terminates TLS between us"


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


@dataclass(frozen=True)
class Session:
    """What both signatures of one handshake bind.

    ``tls`` is the SHA-256 (hex) of the responder's TLS certificate as each side knows it (its
    own, or the one it was shown), empty on plain ws://: a TLS man-in-the-middle who shows its
    own certificate makes the two transcripts differ, so the signatures do not verify. That
    binds the channel: only the holder of the responder's TLS key can show its certificate, and
    TLS 1.3 proves that possession in every session (CertificateVerify over the handshake), so
    an initiator whose signature verifies over the responder's certificate talks to the
    responder itself, not to a relay. The dialler needs no certificate of its own for this:
    its node-key signature over what it was shown is the check the responder makes.
    """

    initiator: str
    responder: str
    nonce_initiator: str
    nonce_responder: str
    tls: str = ""

    def transcript(self, role: str) -> dict[str, object]:
        return {
            "v": PROTOCOL_VERSION,
            "role": role,
            "initiator": self.initiator,
            "responder": self.responder,
            "nonce_initiator": self.nonce_initiator,
            "nonce_responder": self.nonce_responder,
            "tls": self.tls,
        }


def check_hello(
    hello: Hello, *, known: set[str] | None, expected: str | None = None
) -> tuple[str, str]:
    """Validate a peer's hello (its fields' types were checked when its frame was decoded,
    bus/core/frames.py); return its (node id, nonce) or raise HandshakeError."""
    version, node, nonce = hello.v, hello.node, hello.nonce
    if version != PROTOCOL_VERSION:
        raise HandshakeError(
            Reason.VERSION_MISMATCH, f"peer speaks v{version}, we speak v{PROTOCOL_VERSION}"
        )
    try:
        parse_public_key(node)
    except KeyFormatError as exc:
        raise HandshakeError(Reason.BAD_NODE_ID, str(exc)) from None
    if len(nonce) != 2 * NONCE_BYTES or not _is_hex(nonce):
        raise HandshakeError(Reason.BAD_NONCE)
    if expected is not None and node != expected:
        raise HandshakeError(
            Reason.UNEXPECTED_NODE, f"dialled {expected[:16]}…, answered {node[:16]}…"
        )
    if known is not None and node not in known:
        raise HandshakeError(Reason.UNKNOWN_NODE, node)
    return node, nonce


def check_channel(shown: str, ours: str) -> None:
    """Raise HandshakeError('bad_signature') when the initiator says it was shown another TLS
    certificate than the one we present: something between us terminated TLS (a relay with a
    certificate of its own), so its signature, over what it saw, cannot verify over ours. Said
    apart so that both logs name the relay, not only a bad signature."""
    if shown != ours:
        raise HandshakeError(
            Reason.BAD_SIGNATURE,
            f"{CHANNEL_MISMATCH}: the dialler was shown certificate {shown[:16] or 'none'}…, "
            f"we present {ours[:16] or 'none'}…",
        )


def sign_transcript(key: KeyPair, role: str, session: Session) -> str:
    return sign_object(key, DOMAIN, session.transcript(role))["signature"]


def verify_transcript(signature: object, signer: str, role: str, session: Session) -> None:
    """Raise HandshakeError('bad_signature') unless ``signer`` signed this role's transcript."""
    entry = [{"algorithm": "ed25519", "public_key": signer, "signature": signature}]
    verdict = verify_object(entry, DOMAIN, session.transcript(role), expected_public_key=signer)
    if not verdict.ok:
        raise HandshakeError(Reason.BAD_SIGNATURE, f"{role} signature: {verdict.reason}")


def _is_hex(s: str) -> bool:
    try:
        bytes.fromhex(s)
    except ValueError:
        return False
    return True

"""Link encryption, decided once: TLS 1.3 on every link unless ``link_encryption = "none"``.

The node serves wss:// with a self-signed certificate (made on first start, crypto/tls.py)
that the node handshake binds under both node keys (bus/core/handshake.py), and dials every
peer over TLS: a ``ws://`` address left by an older version in the home is rewritten to
``wss://`` at start, named in a WARNING, and one registered later is dialled as ``wss://``
all the same (bus/wire/transport.py ``dial_url``). Cleartext only by the explicit setting,
warned about at every start and shown beside each link (status, /metrics, the console).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Final

from bus.core.ids import now
from bus.core.models import Peer
from bus.store import records
from bus.store.connection import Store
from bus.wire.transport import TransportConfig
from crypto.tls import fingerprint, make_self_signed, server_context
from node.config import NodeConfig

log = logging.getLogger(__name__)

TLS: Final = "tls"
NONE: Final = "none"
# why a link is cleartext, beside it wherever links are shown
PLAINTEXT_WHY: Final = 'link_encryption = "none" in config.toml'


def encrypted(config: NodeConfig) -> bool:
    return config.link_encryption != NONE


def scheme(config: NodeConfig) -> str:
    """The scheme peers dial this node at."""
    return "wss" if encrypted(config) else "ws"


def with_encryption(base: TransportConfig, config: NodeConfig) -> TransportConfig:
    """``base`` serving and dialling TLS 1.3, the certificate made on first use; or, with
    ``link_encryption = "none"``, cleartext, with a WARNING (every start says it)."""
    if not encrypted(config):
        log.warning(
            "links are NOT encrypted (%s): anyone on the path between nodes reads every "
            "job's script, environment and output. Remove the setting to encrypt them",
            PLAINTEXT_WHY,
        )
        return replace(base, plaintext_why=PLAINTEXT_WHY)
    cert, key = config.home / "tls.crt", config.home / "tls.key"
    if not cert.exists() or not key.exists():
        make_self_signed(cert, key, f"hero-node {config.name}")
        log.info("created a self-signed TLS certificate %s", cert)
    return replace(
        base,
        ssl_server=server_context(cert, key),
        tls_fingerprint=fingerprint(cert),
        require_tls=True,
    )


def encryption_fields(config: NodeConfig) -> dict[str, str]:
    """What node:info says of link encryption (hero-node status, the console)."""
    if encrypted(config):
        return {"link_encryption": TLS, "link_encryption_why": ""}
    return {"link_encryption": NONE, "link_encryption_why": PLAINTEXT_WHY}


def warn_legacy(config: NodeConfig) -> None:
    """Say at start that config.toml still holds ``tls`` (written by every older ``init``)."""
    for setting in config.legacy_settings:
        log.warning(
            "config.toml: [node] %s is no longer read: links are %s (link_encryption = %r); "
            "remove the line",
            setting,
            "encrypted" if encrypted(config) else "NOT encrypted",
            config.link_encryption,
        )


async def migrate_peer_addresses(store: Store, config: NodeConfig) -> list[Peer]:
    """Rewrite every peer address ``ws://`` of this home to ``wss://`` when links are
    encrypted, each named in a WARNING; return the peers rewritten. Raises StoreError."""
    if not encrypted(config):
        return []
    moved = []
    for peer_id in sorted(await records.peer_ids(store)):
        h = await records.read_peer(store, peer_id)
        if not h or not h.get("address", "").startswith("ws://"):
            continue
        peer = Peer.from_hash(h)
        new = replace(peer, address="wss://" + peer.address.removeprefix("ws://"), updated_at=now())
        await records.put_peer(store, new)
        log.warning(
            "peer %s (%s…): address %s rewritten to %s: links are encrypted; that peer "
            "must run a hero-node with link encryption, or its links are refused",
            peer.name or "-",
            peer.id[:16],
            peer.address,
            new.address,
        )
        moved.append(new)
    return moved

"""``hero-node peer|actor|context ...``: who this node knows and lets run what."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from bus.core import ids
from bus.core.models import Actor
from bus.core.urls import check_link_url
from bus.errors import ModelError
from crypto.public_keys import ALGORITHM_ED25519, ALGORITHMS
from node.cli.common import UsageError, with_client
from node.cli.output import add_json, ago, print_json
from node.cli.parsing import hidden_alias

if TYPE_CHECKING:
    from bus.client.api import Client
    from bus.core.models import Context

RESTART_NOTE = "the running node keeps an open link to it until it restarts"


def ws_address(value: str) -> str:
    """A peer's address (bus/core/urls.py ``check_link_url``; "" for a peer that only dials us); an
    argparse type, so a wrong one is a usage error before anything is written."""
    try:
        return check_link_url(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_registry_commands(sub: Any) -> None:  # noqa: ANN401 (argparse's private type)
    """``peer``, ``actor`` and ``context`` with their actions."""
    _add_peer_commands(sub)
    _add_actor_commands(sub)
    _add_context_commands(sub)


def _add_peer_commands(sub: Any) -> None:  # noqa: ANN401
    peer = sub.add_parser("peer", help="manage peer nodes").add_subparsers(
        metavar="ACTION", help="what to do"
    )
    s = peer.add_parser("add", help="register a peer node (it may then link to us)")
    s.add_argument("node_id", help="the peer's node id (hex public key)")
    s.add_argument(
        "address", nargs="?", default="", type=ws_address, help="ws://host:port to dial (optional)"
    )
    s.add_argument("--name", default="", help="a short name, usable as --to")
    s.set_defaults(func=with_client(peer_add))
    s = peer.add_parser("list", help="list peers with their link state")
    add_json(s)
    s.set_defaults(func=with_client(peer_list))
    s = peer.add_parser("remove", help=f"forget a peer ({RESTART_NOTE})")
    s.add_argument("node", help="the peer's name, id or its first 8+ hex digits")
    s.set_defaults(func=with_client(peer_remove))


def _add_actor_commands(sub: Any) -> None:  # noqa: ANN401
    actor = sub.add_parser("actor", help="manage actors").add_subparsers(
        metavar="ACTION", help="what to do"
    )
    s = actor.add_parser("add", help="register an actor's public key")
    s.add_argument("--actor", type=int, default=None, dest="actor_id", help="the actor's id")
    hidden_alias(s, "--id", type=int, dest="actor_id")
    s.add_argument(
        "--pubkey",
        required=True,
        help="the actor's public key in hex (ed25519: 64 hex; secp256k1: 66 hex, compressed)",
    )
    s.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default=ALGORITHM_ED25519,
        help="the key's algorithm; the actor's signatures must be of it",
    )
    s.set_defaults(func=with_client(actor_add))
    s = actor.add_parser("list", help="list registered actors")
    add_json(s)
    s.set_defaults(func=with_client(actor_list))
    s = actor.add_parser("remove", help="forget an actor's key (its messages are then refused)")
    s.add_argument("actor_id", type=int, help="the actor's id")
    s.set_defaults(func=with_client(actor_remove))


def _add_context_commands(sub: Any) -> None:  # noqa: ANN401
    ctx = sub.add_parser("context", help="manage contexts").add_subparsers(
        metavar="ACTION", help="what to do"
    )
    s = ctx.add_parser("add", help="create or replace a context and its permission lists")
    s.add_argument("context_id", type=int, help="the context's id")
    s.add_argument("--admin", type=int, action="append", default=[], help="admin actor id (repeat)")
    many = "(repeat for more)"
    s.add_argument("--executor", type=int, action="append", default=[], help=f"executor {many}")
    s.add_argument("--reader", type=int, action="append", default=[], help=f"reader actor {many}")
    s.set_defaults(func=with_client(context_add))
    s = ctx.add_parser("list", help="list the contexts this node serves and who may do what")
    add_json(s)
    s.set_defaults(func=with_client(context_list))


# -- peers -------------------------------------------------------------------------------------


async def peer_add(client: Client, args: argparse.Namespace) -> int:
    if args.node_id.lower() == await client.node_id():
        raise UsageError("that is this node's own id: add the id of another node")
    peer = await client.add_peer(args.node_id, args.address, args.name)
    print(f"peer {peer.name or peer.id[:16]} added")
    return 0


async def peer_facts(client: Client) -> list[dict[str, object]]:
    """Every peer with its link (node/observe/linkinfo.py) and outbox length; the shape of
    ``peer list --json`` and of ``status --json``'s ``peers``."""
    from bus.store import records
    from node.links.peer_breakers import BREAKERS_FIELD
    from node.observe.linkinfo import read_links

    info = await records.node_info(client.store)
    links = read_links(info)
    breakers = _breakers(info.get(BREAKERS_FIELD, "{}"))
    out: list[dict[str, object]] = []
    for peer in await client.peers():
        link = links.get(peer.id, {})
        out.append(
            {
                "id": peer.id,
                "name": peer.name,
                "address": peer.address,
                "outbox": (await records.outbox_depths(client.store, peer.id))[0],
                "link": str(link.get("state", "unknown")),
                "since": link.get("since", 0),
                "last_seen": link.get("last_seen", 0),
                "rtt_ms": link.get("rtt_ms", -1),
                "error": link.get("error", ""),
                # what protects the link ("TLSv1.3 <cipher>"), or "" and why it is cleartext
                "encryption": link.get("encryption", ""),
                "plaintext": link.get("plaintext", ""),
                "breaker": breakers.get(peer.id, {"state": "closed", "failures": 0}),
            }
        )
    return out


def _breakers(published: str) -> dict[str, Any]:
    """The circuit breakers node:info holds, by peer id ({} if unreadable)."""
    try:
        value = json.loads(published)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def link_text(peer: dict[str, object], now: float) -> str:
    """``up 5m, seen 2s ago, rtt 0.4 ms`` or ``down since 3m ago: <why>``."""
    state = str(peer["link"])
    if state == "up":
        rtt = float(str(peer["rtt_ms"]))
        rtt_text = f"rtt {rtt:.1f} ms" if rtt >= 0 else "rtt ?"
        sealed = peer.get("encryption") or f"NOT ENCRYPTED ({peer.get('plaintext') or '?'})"
        return f"up, seen {ago(peer['last_seen'], now)}, {rtt_text}, {sealed}"
    if state == "down":
        return f"down since {ago(peer['since'], now)}: {peer['error'] or 'link closed'}"
    return "unknown (not dialled nor heard from since the node started)"


async def peer_list(client: Client, args: argparse.Namespace) -> int:
    facts = await peer_facts(client)
    if args.json:
        print_json(facts)
        return 0
    now = ids.now_ms() / 1000
    for p in facts:
        print(f"{p['id']}  {p['name'] or '-'}  {p['address'] or '(dials us)'}")
        print(f"    link {link_text(p, now)}; outbox {p['outbox']}")
    return 0


async def peer_remove(client: Client, args: argparse.Namespace) -> int:
    from bus.store import records

    node_id = await client.resolve_node(args.node)
    if node_id == await client.node_id():
        raise UsageError("that is this node itself, not a peer")
    await records.remove_peer(client.store, node_id)
    print(f"peer {node_id[:16]}… removed ({RESTART_NOTE})")
    return 0


# -- actors and contexts -----------------------------------------------------------------------


async def actor_add(client: Client, args: argparse.Namespace) -> int:
    if args.actor_id is None:
        raise UsageError("actor add: --actor ID is required")
    actor = await client.register_actor(args.actor_id, args.pubkey, algorithm=args.algorithm)
    print(f"actor {actor.id} registered")
    return 0


async def actors(client: Client) -> list[Actor]:
    from bus.store import records

    out = []
    for h in await records.actor_hashes(client.store):
        try:
            out.append(Actor.from_hash(h))
        except ModelError:  # not an actor the node could use either: not listed
            continue
    return sorted(out, key=lambda a: a.id)


async def actor_list(client: Client, args: argparse.Namespace) -> int:
    found = await actors(client)
    if args.json:
        print_json(
            [
                {
                    "id": a.id,
                    "pubkey": a.pubkey,
                    "algorithm": a.algorithm,
                    "created_at": a.created_at,
                }
                for a in found
            ]
        )
        return 0
    for a in found:
        print(f"actor {a.id}  {a.algorithm:<9}  {a.pubkey}")
    return 0


async def actor_remove(client: Client, args: argparse.Namespace) -> int:
    from bus.store import records

    if not await records.remove_actor(client.store, args.actor_id):
        print(f"hero-node: no actor {args.actor_id}", file=sys.stderr)
        return 1
    print(f"actor {args.actor_id} removed")
    return 0


async def context_add(client: Client, args: argparse.Namespace) -> int:
    ctx = await client.register_context(
        args.context_id, admins=args.admin, executors=args.executor, readers=args.reader
    )
    print(f"context {ctx.id}: admins {ctx.admins} executors {ctx.executors} readers {ctx.readers}")
    return 0


async def context_list(client: Client, args: argparse.Namespace) -> int:
    found: list[Context] = []
    for ctx in await client.store.context_ids():
        context = await client.store.get_context(ctx)
        if context is not None:
            found.append(context)
    if args.json:
        print_json(
            [
                {"id": c.id, "admins": c.admins, "executors": c.executors, "readers": c.readers}
                for c in found
            ]
        )
        return 0
    for c in found:
        print(f"context {c.id}: admins {c.admins} executors {c.executors} readers {c.readers}")
    return 0

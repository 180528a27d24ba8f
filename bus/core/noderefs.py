"""Which node a user means by ``--to b``: one rule for every command and the client API.

A reference is ``self`` (or ``local``), a node's full id, a node's name, or a prefix of its id.
Names and id prefixes share one namespace, and ids are random hex: a peer named ``b`` and a node
whose id happens to begin with ``b`` (one in 16) made ``--to b`` ambiguous at random. So an exact
name or full id wins over a prefix, and a prefix must have at least :data:`MIN_ID_PREFIX` hex
digits: 8 digits are 32 bits, so two of a thousand nodes share one with a chance of about 1 in
8,600, where one hex digit gave each other node 1 in 16.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from dataclasses import dataclass

from bus.core.errors import ClientError

MIN_ID_PREFIX = 8
SELF = ("self", "local")


@dataclass(frozen=True)
class KnownNode:
    """A node the reference may mean: this node or a peer (``name`` "" when it has none)."""

    id: str
    name: str = ""


def pick_node(ref: str, own: KnownNode, peers: Iterable[KnownNode]) -> str:
    """The id ``ref`` names among ``own`` and ``peers``, by rank: ``self``/``local``, then a full
    id or an exact name, then an id prefix of at least MIN_ID_PREFIX hex digits.

    Raises ClientError saying why otherwise: nothing matches (with a hint when ``ref`` is a
    short hex string), or the matches of the first rank that has any are several nodes."""
    if ref in SELF:
        return own.id
    nodes = [own, *peers]
    lowered = ref.lower()
    exact = {n.id for n in nodes if n.id == lowered or (n.name and n.name == ref)}
    if len(exact) == 1:
        return exact.pop()
    if exact:
        raise ClientError(
            f"node {ref!r} is ambiguous: {len(exact)} nodes are named so "
            f"({_listed(exact)}); give the id instead"
        )
    hex_ref = bool(ref) and all(c in string.hexdigits for c in ref)
    if not hex_ref:
        raise ClientError(f"unknown node {ref!r}: not this node, nor a peer's name or id")
    if len(ref) < MIN_ID_PREFIX:
        raise ClientError(
            f"unknown node {ref!r}: no node is named so, and an id prefix needs at least "
            f"{MIN_ID_PREFIX} hex digits (hero-node peer list shows names and ids)"
        )
    prefixed = {n.id for n in nodes if n.id.startswith(lowered)}
    if len(prefixed) == 1:
        return prefixed.pop()
    if not prefixed:
        raise ClientError(f"unknown node {ref!r}: no node's id begins so")
    raise ClientError(
        f"node {ref!r} is ambiguous: the id prefix matches {len(prefixed)} nodes "
        f"({_listed(prefixed)}); give more digits or a name"
    )


def _listed(ids: Iterable[str]) -> str:
    return ", ".join(f"{i[:16]}…" for i in sorted(ids))

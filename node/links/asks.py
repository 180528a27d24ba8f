"""Gathering one job's, message's or flow's trace: this node's records from its store, each other
node's part by a signed ask this node carries over its link (node/links/trace.py), assembled by
node/observe/trace.py. What ``hero-node job trace`` runs, and what a view of the grid can run.

The asks go one peer after another, each bounded by ``wait_s``: a peer that is down or slow costs
its bound once and is named with its reason; what the others told is still assembled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bus.core.ids import new_id, new_nonce, now
from bus.core.reasons import Reason
from bus.core.traces import MAX_KEYS, Ask, AskRefused, Tell, message_job_keys, parse_tell
from bus.store import records, traces
from bus.store.connection import Store
from crypto import Signer
from node.links.trace import read_told
from node.observe.trace import flow_trace, job_trace

Told = dict[str, dict[str, Any]]  # key -> record, as bus/core/traces.py tells it


@dataclass(frozen=True)
class Asker:
    """Who asks, from where: the actor's signer and id, and this node's id. Without a signer
    nobody is asked: each peer is named as not told, ``unasked`` saying why."""

    store: Store
    signer: Signer | None
    actor: int
    node: str
    unasked: str = ""


def subject(key: str) -> str:
    """``flow:<id>`` for a bare flow id, else the key as given."""
    return f"flow:{key}" if key.isdigit() else key


async def gather_trace(
    asker: Asker, ctx: int, key: str, names: Mapping[str, str], wait_s: float
) -> dict[str, Any] | None:
    """The trace document of ``key`` (node/cli/schemas/job-trace.json), None if this node holds
    no record of it. ``names``: node id -> name, for people. Raises StoreError."""
    store, own = asker.store, asker.node
    here = await read_told(store, ctx, [key])
    if key not in here:
        return None
    job_keys, dag = await _job_keys(store, ctx, key, here)
    here |= await read_told(store, ctx, [k for k in job_keys if k not in here])
    told: dict[str, Told] = {own: here}
    nodes: dict[str, dict[str, Any]] = {own: {"name": names.get(own, ""), "told": True}}
    for peer in sorted(_touched(here, dag) - {own}):
        tell = await _ask(asker, ctx, peer, job_keys or [key], wait_s)
        nodes[peer] = {"name": names.get(peer, ""), "told": not tell.reason}
        if tell.reason:
            nodes[peer] |= {"reason": tell.reason, "detail": tell.detail}
        else:
            told[peer] = {k: dict(v) for k, v in tell.records.items()}
    for state in nodes.values():
        state.setdefault("reason", "")
    return _document(key, ctx, own, nodes, told, dag)


async def _job_keys(
    store: Store, ctx: int, key: str, here: Told
) -> tuple[list[str], list[dict[str, Any]]]:
    """The jobs a key stands for (a flow's from its DAG, a message's from its job list)."""
    if key.startswith("flow:"):
        record = here[key]
        caller = record["fields"].get("caller_id", "0")
        dag = list(record.get("dag", []))
        return [f"job:{caller}:{j['job_id']}" for j in dag], dag
    if key.startswith("message:"):
        return message_job_keys(await records.read_message(store, ctx, key)), []
    return [key], []


def _touched(here: Told, dag: list[dict[str, Any]]) -> set[str]:
    """Every node this node's records say took part: origins, destinations, senders."""
    seen = {str(j.get("node", "")) for j in dag}
    for record in here.values():
        fields = record.get("fields", {})
        for name in ("node", "origin", "destination", "received_from"):
            seen.add(str(fields.get(name, "")))
    return {n for n in seen if len(n) == 64}


async def _ask(asker: Asker, ctx: int, peer: str, names: list[str], wait_s: float) -> Tell:
    """One peer's records of ``names``, asked in chunks of MAX_KEYS; the first refusal ends it."""
    if asker.signer is None:
        return Tell(0, peer, reason=Reason.UNKNOWN_SIGNER, detail=asker.unasked)
    found: dict[str, Any] = {}
    for start in range(0, len(names), MAX_KEYS):
        chunk = tuple(names[start : start + MAX_KEYS])
        ask = Ask(new_id(), asker.actor, ctx, asker.node, peer, chunk, now(), new_nonce())
        ask = ask.signed(asker.signer)
        await traces.hand_ask(asker.store, json.dumps(ask.to_dict()))
        text = await traces.wait_told(asker.store, ask.id, wait_s)
        if text is None:
            detail = f"no answer within {wait_s:g} s"
            return Tell(ask.id, peer, reason=Reason.PEER_UNAVAILABLE, detail=detail)
        try:
            tell = parse_tell(json.loads(text))
        except (ValueError, AskRefused) as exc:  # our node checked it; a bug, said, not raised
            return Tell(ask.id, peer, reason=Reason.MALFORMED, detail=str(exc))
        if tell.reason:
            return tell
        found |= tell.records
    return Tell(0, peer, found)


def _document(
    key: str,
    ctx: int,
    own: str,
    nodes: dict[str, dict[str, Any]],
    told: dict[str, Told],
    dag: list[dict[str, Any]],
) -> dict[str, Any]:
    kind = key.split(":", 1)[0]
    doc: dict[str, Any] = {"key": key, "kind": kind, "context": ctx, "node": own, "nodes": nodes}
    if kind == "flow":
        flow_fields = told[own][key]["fields"]
        caller = int(flow_fields.get("caller_id", "0") or 0)
        doc["flow"] = flow_trace(flow_fields, dag, caller, told)
        doc["jobs"] = doc["flow"].pop("jobs")
    else:
        doc["flow"] = None
        job_keys = [key] if kind == "job" else sorted(k for k in told[own] if k.startswith("job:"))
        doc["jobs"] = [job_trace(k, told).to_dict() for k in job_keys]
    return doc

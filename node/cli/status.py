"""``hero-node status``: the running node as its Redis shows it, as text or JSON.

It reads what the node publishes in DB 0 (``node:info``, with the node's counters: see
node/counters.py), the peers and their outboxes, and per context the message lists, the job
queues and the live runners.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bus import keys
from bus.client import Client
from bus.store import Store
from node import counters
from node.routing.peer_breakers import BREAKERS_FIELD


async def status(client: Client, args: argparse.Namespace) -> int:
    facts = await status_facts(client)
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    info = facts["node"]
    print(f"node {info.get('name', '?')}  id {info.get('id', '?')}")
    print(
        f"  listen {info.get('ws_url', '?')}  redis {info.get('redis_url', '?')}  "
        f"pid {info.get('pid', '?')}"
    )
    for peer in facts["peers"]:
        print(
            f"  peer {peer['name'] or '-':<10} {peer['id'][:16]}…  "
            f"{peer['address'] or '(dials us)'}  outbox {peer['outbox']}{_breaker(peer)}"
        )
    for ctx, lists in facts["contexts"].items():
        lens = [f"{name}={length}" for name, length in lists["lists"].items()]
        print(f"  context {ctx}: {' '.join(lens)}")
        for runner in lists["runners"]:
            where = "local" if runner["local"] else "external"
            state = f"busy {', '.join(runner['jobs'])}" if runner["jobs"] else "idle"
            print(f"    runner {runner['id']} ({runner['script_type']}, {where}): {state}")
    counted = facts["counters"]
    print(f"  counters {' '.join(f'{k}={v}' for k, v in counted.items()) or '(none yet)'}")
    return 0


async def status_facts(client: Client) -> dict[str, Any]:
    """What ``status`` shows: ``node`` (node:info), ``counters``, ``peers`` (with the length of
    their outbox) and ``contexts`` (list lengths and live runners, by context id)."""
    store = client.store
    info = await store.hgetall(0, keys.NODE_INFO)
    breakers = _breakers(info.pop(BREAKERS_FIELD, "{}"))
    peers = [
        {
            "id": peer.id,
            "name": peer.name,
            "address": peer.address,
            "outbox": await store.llen(0, keys.outbox(peer.id)),
            "breaker": breakers.get(peer.id, {"state": "closed", "failures": 0}),
        }
        for peer in await client.peers()
    ]
    contexts = {ctx: await _context_facts(store, ctx) for ctx in await store.context_ids()}
    return {
        "node": {k: v for k, v in info.items() if k != counters.COUNTERS_FIELD},
        "counters": counters.read(info),
        "peers": peers,
        "contexts": contexts,
    }


def _breakers(published: str) -> dict[str, Any]:
    """The circuit breakers node:info holds, by peer id ({} if unreadable)."""
    try:
        value = json.loads(published)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _breaker(peer: dict[str, Any]) -> str:
    """What the peer line says of its circuit breaker: nothing while it is closed."""
    b = peer["breaker"]
    if b.get("state") == "closed":
        return ""
    since = time.strftime("%H:%M:%S", time.localtime(int(b.get("opened_at") or 0)))
    return f"  breaker {b.get('state')} since {since} ({b.get('failures')} failures in a row)"


async def _context_facts(store: Store, ctx: int) -> dict[str, Any]:
    """The lengths of a context's message lists and job queues, and its live runners (those
    with a presence key): type, busy with which jobs."""
    from node.runners.presence import live_runners

    lens = {q: await store.llen(ctx, q) for q in (keys.MSG_OUT, keys.MSG_IN, keys.DLQ)}
    queues = await store.scan_keys(ctx, "queue:*")
    lens |= {q: await store.llen(ctx, q) for q in sorted(queues)}
    runners = [
        {"id": r.runner_id, "script_type": r.script_type, "local": r.local, "jobs": r.jobs}
        for r in await live_runners(store, ctx)
    ]
    return {"lists": lens, "runners": runners}

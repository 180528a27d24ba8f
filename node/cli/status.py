"""``hero-node status``: the running node as its Redis shows it, as text or JSON.

It reads what the node publishes in DB 0 (``node:info``, with the node's counters: see
node/observe/tallies.py, and its links: node/observe/linkinfo.py), the peers and their outboxes,
and per
context the message lists, the job queues and the live runners.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from bus.core import ids, keys
from bus.store.promise import ONE_REPLICA
from node.cli.common import with_client
from node.cli.output import node_facts, print_json
from node.cli.registry import link_text, peer_facts
from node.errors import NodeError

if TYPE_CHECKING:
    from bus.client.api import Client
    from bus.store.connection import Store

LINK_DOWN = 3  # exit code: the node runs, but a peer link is down (or no replica of its store)


def cmd_status(args: argparse.Namespace) -> int:
    """``status``: exit 0 when the node runs and every peer link is up, 1 when the node is not
    running (its home's lock is free, or no node ever ran on its Redis) or its Redis cannot
    be reached, 3 when a peer link is down or a replicated store has no replica up."""
    return with_client(status)(args)


async def status(client: Client, args: argparse.Namespace) -> int:
    facts = await status_facts(client)
    if not facts["node"].get("id"):
        raise NodeError("no hero-node has run on this Redis (no node:info)")
    facts["store"] = await client.store.topology()
    facts["disks"] = _disks(args, facts)
    down = [p for p in facts["peers"] if p["link"] != "up"]
    problems = [f"link to {p['name'] or p['id'][:16]} is {p['link']}" for p in down]
    problems += store_problems(facts["store"])
    facts["health"] = {"ok": not problems, "problems": problems}
    if args.json:
        print_json(facts)
    else:
        print_text(facts)
    return LINK_DOWN if problems else 0


def print_text(facts: dict[str, Any]) -> None:
    # here, not at the top: building the CLI's parser (--help, completion) imports no store
    # client, and these modules import the node's (tests/cli/test_cli_startup.py)
    from node.intake.pressure import HELD_FIELD
    from node.observe.quotas import quota_text

    info = facts["node"]
    print(f"node {info.get('name', '?')}  id {info.get('id', '?')}")
    print(
        f"  listen {info.get('ws_url', '?')}  redis {info.get('redis_url', '?')}  "
        f"pid {info.get('pid', '?')}"
    )
    mode = info.get("isolation", "?")
    loud = "  WARNING: jobs run WITHOUT a sandbox" if mode == "none" else ""
    loud = "  JOBS DO NOT RUN" if mode == "refused" else loud
    print(
        f"  isolation {mode} ({info.get('isolation_why', '')}); limits by "
        f"{info.get('limits', '?')}, cpu_s per {info.get('cpu_time', 'process')}{loud}"
    )
    if info.get("isolation_fix"):
        print(f"  to run jobs here: {info['isolation_fix']}")
    if info.get("bwrap"):
        print(f"  bwrap {info['bwrap']}")
    if info.get("link_encryption") == "none":
        print(f"  links NOT ENCRYPTED ({info.get('link_encryption_why', '')}): the path reads jobs")
    print_store(facts.get("store", {}))
    held = info.get(HELD_FIELD, "")
    print(f"  intake HELD, new jobs wait: {held}" if held else "  intake open")
    now = ids.now_ms() / 1000
    for peer in facts["peers"]:
        print(
            f"  peer {peer['name'] or '-':<10} {peer['id'][:16]}…  "
            f"{peer['address'] or '(dials us)'}  outbox {peer['outbox']}{_breaker(peer)}"
        )
        print(f"    link {link_text(peer, now)}")
    for ctx, of_ctx in facts["contexts"].items():
        lens = [f"{name}={length}" for name, length in of_ctx["lists"].items()]
        print(f"  context {ctx}: {' '.join(lens)}")
        ended = " ".join(f"{status}={n}" for status, n in of_ctx["ended"].items())
        print(f"    attempts ended here: {ended}")
        print(f"    {_disk_text(facts.get('disks', {}).get(str(ctx)))}")
        print(f"    {quota_text(of_ctx['quotas'])}")
        for runner in of_ctx["runners"]:
            where = "local" if runner["local"] else "external"
            state = f"busy {', '.join(runner['jobs'])}" if runner["jobs"] else "idle"
            print(f"    runner {runner['id']} ({runner['script_type']}, {where}): {state}")
        for script_type, breaker in of_ctx["type_breakers"].items():
            if breaker["state"] != "closed":
                print(f"    {_type_breaker(script_type, breaker)}")
    counted = facts["counters"]
    print(f"  counters {' '.join(f'{k}={v}' for k, v in counted.items()) or '(none yet)'}")
    for problem in facts["health"]["problems"]:
        print(f"  unhealthy: {problem}")


def _disks(args: argparse.Namespace, facts: dict[str, Any]) -> dict[str, Any]:
    """Each context's disk use against its quota (node/sandbox/disk.py), read through the
    node's mount namespace, where its contexts' disks are mounted."""
    from node.cli.common import config_of
    from node.sandbox.disk import context_disks, work_root_of

    config = config_of(args)
    pid = facts["node"].get("pid", "")
    root = f"/proc/{pid}/root" if str(pid).isdigit() else "/"
    return context_disks(work_root_of(config.home), list(facts["contexts"]), config.limits, root)


def _disk_text(disk: dict[str, Any] | None) -> str:
    if not disk:
        return "disk ?"
    if disk["enforced"] is None:
        return "disk: unknown here (the node's mounts are root's to look at)"
    if not disk["enforced"]:
        return f"disk: no quota in force (disk_mb {disk['quota_mb']})"
    used, size = disk["used_bytes"] / 2**20, disk["size_bytes"] / 2**20
    return f"disk {used:.1f} of {size:.0f} MiB used (quota {disk['quota_mb']} MiB)"


def print_store(topology: dict[str, Any]) -> None:
    """The replicated store's lines (none for the embedded single Valkey)."""
    if topology.get("mode") != "replicated":
        return
    print(
        f"  store {topology['service']}: primary {topology['primary']} "
        f"for {topology['primary_for_s']} s, "
        f"{topology['failovers']} failover(s) so far, {topology['sentinels']} sentinel(s) "
        f"(quorum {topology['quorum']})"
    )
    for r in topology["replicas"]:
        lag = "?" if r["lag_bytes"] is None else f"{r['lag_bytes']} bytes, {r['lag_s']} s"
        print(f"    replica {r['address']}  link {r['link']}  lag {lag}")
    promise = topology.get("promise", {})
    if promise:
        weak = "  WARNING: weaker than every-replica" if promise["name"] == ONE_REPLICA else ""
        print(
            f"    promise {promise['name']}: WAITAOF 1 {promise['replicas_wanted']}; "
            f"{promise['now']}{weak}"
        )


def store_problems(topology: dict[str, Any]) -> list[str]:
    """What makes a replicated store unhealthy: no replica up, or fewer than its promise
    waits for (promises then wait, and fail)."""
    if topology.get("mode") != "replicated":
        return []
    up = [r for r in topology["replicas"] if r["link"] == "up"]
    if not up:
        return [f"store {topology['service']}: no replica is up"]
    promise = topology.get("promise", {})
    if promise.get("refusing"):
        return [f"store {topology['service']}: promise {promise['name']}: {promise['now']}"]
    return []


async def status_facts(client: Client) -> dict[str, Any]:
    """What ``status`` shows: ``node`` (node:info), ``counters``, ``peers`` (with their link
    and the length of their outbox: see node/cli/registry.py ``peer_facts``) and ``contexts``
    (list lengths and live runners, by context id)."""
    from bus.store import records
    from node.intake.pressure import BOUNDS_FIELD, bounds_of
    from node.links.peer_breakers import BREAKERS_FIELD
    from node.observe import tallies
    from node.observe.linkinfo import LINKS_FIELD
    from node.observe.quotas import quota_facts

    store = client.store
    info = await records.node_info(store)
    contexts = {ctx: await _context_facts(store, ctx) for ctx in await store.context_ids()}
    for ctx, of_ctx in contexts.items():
        of_ctx["quotas"] = quota_facts(bounds_of(info, ctx), of_ctx["quotas"])
    published = (tallies.COUNTERS_FIELD, LINKS_FIELD, BREAKERS_FIELD, BOUNDS_FIELD)
    return {
        "node": node_facts({k: v for k, v in info.items() if k not in published}),
        "isolation": info.get("isolation", ""),
        "counters": tallies.read(info),
        "peers": await peer_facts(client),
        "contexts": contexts,
    }


def _breaker(peer: dict[str, Any]) -> str:
    """What the peer line says of its circuit breaker: nothing while it is closed."""
    b = peer["breaker"]
    if b.get("state") == "closed":
        return ""
    since = time.strftime("%H:%M:%S", time.localtime(int(b.get("opened_at") or 0)))
    return f"  breaker {b.get('state')} since {since} ({b.get('failures')} failures in a row)"


def _type_breaker(script_type: str, b: dict[str, Any]) -> str:
    """A script type's breaker that is not closed, on its context's lines."""
    since = time.strftime("%H:%M:%S", time.localtime(int(b.get("opened_at") or 0)))
    then = f"probes in {b['probe_in_s']} s" if b["state"] == "open" else "probing"
    return (
        f"breaker of {script_type} {b['state']} since {since} "
        f"({b['failures']} failures in a row; {then})"
    )


def _ended(stats: dict[str, str]) -> dict[str, int]:
    """How the attempts a context's job statistics count ended, as the console counts them
    (node/observe/sampler.py ``counts_of``), by the statistics' own names of the endings."""
    from node.observe.sampler import counts_of

    n = counts_of([stats])
    return {"finished": n["finished"], "error": n["failed"], "retry": n["retried"]}


async def _context_facts(store: Store, ctx: int) -> dict[str, Any]:
    """The lengths of a context's message lists and job queues, how the attempts its runners
    and node ended went (``ended``: finished, error, retry; the job statistics, which count
    every end in the script that records it), its live runners (those with a presence key:
    type, busy with which jobs) and its script types' circuit breakers
    (bus/store/atomic/type_breakers.py ``TypeBreaker.to_json``, by type)."""
    from bus.store import records
    from bus.store.atomic import type_breakers
    from bus.store.presence import live_runners

    names = [keys.MSG_OUT, keys.MSG_IN, keys.DLQ, *sorted(await records.queue_names(store, ctx))]
    lens = dict(zip(names, await records.depths(store, ctx, names), strict=True))
    held = await records.held_depth(store, ctx)
    if held:  # job messages a restart left unacknowledged (node/intake/held.py)
        lens[keys.MSG_HELD] = held
    runners = [
        {"id": r.runner_id, "script_type": r.script_type, "local": r.local, "jobs": r.jobs}
        for r in await live_runners(store, ctx)
    ]
    breakers = await type_breakers.read(store, ctx)
    return {
        "quotas": await records.quota_depths(store, ctx),  # with their bounds: status_facts
        "lists": lens,
        "ended": _ended(await records.job_stats(store, ctx)),
        "runners": runners,
        "type_breakers": {t: b.to_json() for t, b in breakers.items()},
    }

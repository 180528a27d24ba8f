"""``hero-node job trace KEY``: one job's, one message's or one flow's life across the nodes
it touched, from the nodes' own records (no tracing backend).

This node's records are read from its store; each other node the job or flow touched is asked
for its part by a signed ask (bus/core/traces.py) that this node carries over its link and the
peer checks against its own registry. A peer that cannot or will not tell is named with its
reason; what the others told is still shown.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from node.cli.common import config_of, context_of, with_client
from node.cli.output import add_json, print_json

# The parser and --help need none of the store, the links or trio: the command imports them.
if TYPE_CHECKING:
    from bus.client.api import Client
    from bus.core.traces import Tell
    from crypto import Signer

Told = dict[str, dict[str, Any]]


def add_job_trace(job: Any) -> None:  # noqa: ANN401 (argparse's private type)
    from node.cli.jobs import CONTEXT_HELP, add_signer

    s = job.add_parser(
        "trace", help="a job's, message's or flow's life across nodes: hops, attempts, DAG"
    )
    s.add_argument("key", help="job:<caller>:<id>, message:<caller>:<id>, or a flow id")
    s.add_argument("--context", type=int, default=None, help=CONTEXT_HELP)
    add_signer(s)
    s.add_argument(
        "--wait", type=float, default=10.0, metavar="S", help="seconds to wait for each peer"
    )
    add_json(s)
    s.set_defaults(func=with_client(job_trace_cmd))


def subject(key: str) -> str:
    """``flow:<id>`` for a bare flow id, else the key as given."""
    return f"flow:{key}" if key.isdigit() else key


async def job_trace_cmd(client: Client, args: argparse.Namespace) -> int:
    """Gather and print; exit 1 if this node holds no record of the key."""
    from crypto import load_signing_key_file
    from node.links.trace import read_told

    ctx, key = context_of(args), subject(args.key)
    own = await client.node_id()
    here = await read_told(client.store, ctx, [key])
    if key not in here:
        print(f"hero-node: no {key} in context {ctx} on this node", file=sys.stderr)
        return 1
    job_keys, dag = await _job_keys(client, ctx, key, here)
    if job_keys:
        here |= await read_told(client.store, ctx, [k for k in job_keys if k not in here])
    told: dict[str, Told] = {own: here}
    names = {p.id: p.name for p in await client.peers()} | {own: "this node"}
    nodes: dict[str, dict[str, Any]] = {own: {"name": names[own], "told": True, "reason": ""}}
    config = config_of(args)
    signer = load_signing_key_file(args.key_file or config.actor_key_path)
    actor = args.actor or config.actor_id
    for peer in sorted(_touched(here, dag) - {own}):
        ask = _AskFor(client, signer, actor, ctx, own, peer)
        tell = await ask.records(job_keys or [key], args.wait)
        nodes[peer] = {"name": names.get(peer, ""), "told": not tell.reason}
        nodes[peer] |= {"reason": tell.reason, "detail": tell.detail} if tell.reason else {}
        nodes[peer].setdefault("reason", "")
        if not tell.reason:
            told[peer] = {k: dict(v) for k, v in tell.records.items()}
    doc = _document(key, ctx, own, nodes, told, dag)
    if args.json:
        print_json(doc)
    else:
        print_text(doc)
    return 0


async def _job_keys(
    client: Client, ctx: int, key: str, here: Told
) -> tuple[list[str], list[dict[str, Any]]]:
    """The jobs a key stands for (a flow's from its DAG, a message's from its job list)."""
    from bus.store import records
    from node.observe.trace import message_job_keys

    if key.startswith("flow:"):
        record = here[key]
        caller = record["fields"].get("caller_id", "0")
        dag = list(record.get("dag", []))
        return [f"job:{caller}:{j['job_id']}" for j in dag], dag
    if key.startswith("message:"):
        return message_job_keys(await records.read_message(client.store, ctx, key)), []
    return [key], []


def _touched(here: Told, dag: list[dict[str, Any]]) -> set[str]:
    """Every node this node's records say took part: origins, destinations, senders."""
    seen = {str(j.get("node", "")) for j in dag}
    for record in here.values():
        fields = record.get("fields", {})
        for name in ("node", "origin", "destination", "received_from"):
            seen.add(str(fields.get(name, "")))
    return {n for n in seen if len(n) == 64}


class _AskFor:
    """One peer's part, asked through this node (in chunks of MAX_KEYS keys)."""

    def __init__(
        self, client: Client, signer: Signer, actor: int, ctx: int, own: str, peer: str
    ) -> None:
        self.client, self.signer, self.actor = client, signer, actor
        self.ctx, self.own, self.peer = ctx, own, peer

    async def records(self, names: list[str], wait_s: float) -> Tell:
        from bus.core.traces import MAX_KEYS, Tell

        found: dict[str, Any] = {}
        for start in range(0, len(names), MAX_KEYS):
            tell = await self._one(names[start : start + MAX_KEYS], wait_s)
            if tell.reason:
                return tell
            found |= tell.records
        return Tell(0, self.peer, found)

    async def _one(self, names: list[str], wait_s: float) -> Tell:
        from bus.core.ids import new_id, new_nonce, now
        from bus.core.reasons import Reason
        from bus.core.traces import Ask, Tell, parse_tell
        from bus.store import traces

        ask = Ask(
            new_id(), self.actor, self.ctx, self.own, self.peer, tuple(names), now(), new_nonce()
        ).signed(self.signer)
        await traces.hand_ask(self.client.store, json.dumps(ask.to_dict()))
        text = await traces.wait_told(self.client.store, ask.id, wait_s)
        if text is None:
            detail = f"no answer within {wait_s:g} s"
            return Tell(ask.id, self.peer, reason=Reason.PEER_UNAVAILABLE, detail=detail)
        return parse_tell(json.loads(text))


def _document(
    key: str,
    ctx: int,
    own: str,
    nodes: dict[str, dict[str, Any]],
    told: dict[str, Told],
    dag: list[dict[str, Any]],
) -> dict[str, Any]:
    from node.observe.trace import flow_trace, job_trace

    kind = key.split(":", 1)[0]
    doc: dict[str, Any] = {"key": key, "kind": kind, "context": ctx, "node": own, "nodes": nodes}
    if kind == "flow":
        flow_fields = told[own][key]["fields"]
        caller = int(flow_fields.get("caller_id", "0") or 0)
        doc["flow"] = flow_trace(flow_fields, dag, caller, told)
        doc["jobs"] = doc["flow"].pop("jobs")
    else:
        doc["flow"] = None
        job_keys = [key] if kind == "job" else sorted(_jobs_named(told[own]))
        doc["jobs"] = [job_trace(k, told).to_dict() for k in job_keys]
    return doc


def _jobs_named(here: Told) -> set[str]:
    return {k for k in here if k.startswith("job:")}


# -- text --------------------------------------------------------------------------------------


def _clock(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S.%f")[:-3]


def _who(doc: dict[str, Any], node: str) -> str:
    name = doc["nodes"].get(node, {}).get("name", "")
    return f"{name} ({node[:8]})" if name else node[:12] or "?"


def print_text(doc: dict[str, Any]) -> None:
    """The trace for people: the flow line, then each job with its node and its hops."""
    flow = doc["flow"]
    if flow:
        print(f"flow {flow['id']} {flow['name']!r}: {flow['status']} {flow['reason']}".rstrip())
    for job in doc["jobs"]:
        head = f"{job['flow_job']} " if job["flow_job"] else ""
        deps = f" after {','.join(job['depends'])}" if job["depends"] else ""
        print(
            f"{head}{job['key']} on {_who(doc, job['node'])}: {job['status']} {job['reason']}"
            f" ({job['attempts']} attempt{'s' if job['attempts'] != 1 else ''}){deps}"
        )
        for hop in job["hops"]:
            took = "" if hop["duration_s"] is None else f" +{hop['duration_s']:.3f}s"
            attempt = f" #{hop['attempt']}" if hop["attempt"] else ""
            outcome = f" {hop['outcome']}" if hop["outcome"] else ""
            said = hop.get("detail", "")
            said = _who(doc, said) if said in doc["nodes"] else said[:60]
            detail = f" ({said})" if said else ""
            print(
                f"  {_clock(hop['at'])}{took:>10}  {_who(doc, hop['node']):<20} "
                f"{hop['what']}{attempt}{outcome}{detail}"
            )
    for node, state in doc["nodes"].items():
        if not state["told"]:
            print(f"! {_who(doc, node)} told nothing: {state['reason']} {state.get('detail', '')}")

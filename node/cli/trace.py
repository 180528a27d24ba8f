"""``hero-node job trace KEY``: one job's, one message's or one flow's life across the nodes
it touched, from the nodes' own records (no tracing backend).

This node's records are read from its store; each other node the job or flow touched is asked
for its part by a signed ask (bus/core/traces.py) that this node carries over its link and the
peer checks against its own registry. A peer that cannot or will not tell is named with its
reason; what the others told is still shown.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from node.cli.common import config_of, context_of, with_client
from node.cli.output import add_json, print_json

# The parser and --help need none of the store, the links or trio: the command imports them.
if TYPE_CHECKING:
    from bus.client.api import Client


def add_job_trace(job: Any) -> None:  # noqa: ANN401 (argparse's private type)
    from node.cli.jobs import CONTEXT_HELP, add_signer

    s = job.add_parser(
        "trace", help="a job's, message's or flow's life across nodes: hops, attempts, DAG"
    )
    s.add_argument("key", help="job:<caller>:<id>, message:<caller>:<id>, or a flow id")
    s.add_argument("--context", type=int, default=None, help=CONTEXT_HELP)
    add_signer(s)
    s.add_argument(
        "--peer-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds to wait for each peer's answer",
    )
    add_json(s)
    s.set_defaults(func=with_client(job_trace_cmd))


async def job_trace_cmd(client: Client, args: argparse.Namespace) -> int:
    """Gather and print; exit 1 if this node holds no record of the key."""
    from bus.core.traces import is_traceable
    from crypto import load_signing_key_file
    from node.links.asks import Asker, gather_trace, subject

    ctx, key = context_of(args), subject(args.key)
    if not is_traceable(key):
        print(f"hero-node: {key[:80]!r} is not a job, message or flow key", file=sys.stderr)
        return 2
    config = config_of(args)
    signer = load_signing_key_file(args.key_file or config.actor_key_path)
    own = await client.node_id()
    names = {p.id: p.name for p in await client.peers()} | {own: "this node"}
    asker = Asker(client.store, signer, args.actor or config.actor_id, own)
    doc = await gather_trace(asker, ctx, key, names, args.peer_timeout)
    if doc is None:
        print(f"hero-node: no {key} in context {ctx} on this node", file=sys.stderr)
        return 1
    if args.json:
        print_json(doc)
    else:
        print_text(doc)
    return 0


# -- text --------------------------------------------------------------------------------------


def _clock(at: float | None) -> str:
    if at is None:
        return "-"
    try:
        return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S.%f")[:-3]
    except (OverflowError, ValueError, OSError):  # a peer's record past year 9999
        return "?"


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

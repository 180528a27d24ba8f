"""``hero-node flow ...``: submit a flow from a file, follow it live, show its state."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bus.core.dag import FlowError
from crypto import load_signing_key_file
from node.cli.common import config_of, unless_interrupted, with_client
from node.cli.jobs import add_signer
from node.cli.lists import add_flow_list
from node.cli.output import add_json, flow_results, job_result, print_json
from node.errors import NodeError

if TYPE_CHECKING:
    from bus.client.api import Client
    from bus.core.flows import FlowState

FILE_HELP = (
    "flow file: JSON (YAML too when PyYAML is installed) with 'name', 'env_vars' and 'jobs', "
    "each job {id, node, context, type, script, env, timeout, retries, depends}"
)
_STATUS_MARK = {
    "waiting_for_prerequisites": "..",
    "dispatched": "->",
    "started": ">>",
    "finished": "ok",
    "error": "!!",
}


def add_flow_commands(sub: Any) -> None:  # noqa: ANN401 (argparse's private subparsers type)
    """Add ``flow submit|status|show|list`` to the ``hero-node`` parser's subcommands."""

    flow = sub.add_parser("flow", help="DAGs of jobs across nodes").add_subparsers(
        metavar="ACTION", help="what to do"
    )
    s = flow.add_parser("submit", help="check, sign and submit a flow; --wait follows it live")
    s.add_argument("file", type=Path, help=FILE_HELP)
    s.add_argument("--context", type=int, default=None, help="context id (default: config)")
    s.add_argument("--wait", action="store_true", help="live table until the flow is final")
    s.add_argument("--timeout", type=float, default=3600, help="--wait gives up after this (s)")
    add_signer(s)
    s.add_argument(
        "--deadline",
        type=int,
        default=None,
        help="the flow ends in error if not over this long (s) after submission; signed "
        "(default: the node's flow_deadline_s)",
    )
    s.set_defaults(func=with_client(flow_submit))
    for name, fn, text in (
        ("status", flow_status, "a table of the flow's jobs: node, status, output"),
        ("show", flow_show, "the flow and its jobs as JSON"),
    ):
        s = flow.add_parser(name, help=text)
        s.add_argument("flow_id", type=int, help="the id `flow submit` printed")
        s.add_argument("--context", type=int, default=None, help="context id (default: config)")
        add_json(s)
        s.set_defaults(func=with_client(fn))
    add_flow_list(flow)


def read_flow_file(path: Path) -> object:
    """The parsed flow document; NodeError if unreadable or not JSON/YAML."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise NodeError(f"cannot read {path}: {exc}") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise NodeError("YAML flow files need PyYAML (pip install pyyaml); use JSON") from None
        return yaml.safe_load(text)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise NodeError(f"{path} is not valid JSON: {exc}") from None


def _context(args: argparse.Namespace) -> int:

    return int(args.context if args.context is not None else config_of(args).context_id)


async def flow_submit(client: Client, args: argparse.Namespace) -> int:

    config = config_of(args)
    doc = read_flow_file(args.file)
    if not isinstance(doc, dict):
        raise NodeError(f"{args.file}: a flow must be an object with a list of jobs")
    key = load_signing_key_file(args.key_file or config.actor_key_path)
    ctx = _context(args)
    try:
        flow_id = await client.submit_flow(
            key, args.actor or config.actor_id, doc, context_id=ctx, deadline_s=args.deadline
        )
    except FlowError as exc:
        print(f"hero-node: flow refused: {exc}", file=sys.stderr)
        return 1
    print(f"flow {flow_id} submitted", flush=True)
    return await _follow(client, args, flow_id, ctx) if args.wait else 0


async def _follow(client: Client, args: argparse.Namespace, flow_id: int, ctx: int) -> int:
    """The live table of ``--wait``; Ctrl-C stops following (exit 130), the flow goes on."""
    names = await _node_names(client)
    live = LiveTable(sys.stdout.isatty())
    state = await unless_interrupted(
        lambda: client.wait_flow(
            flow_id, ctx, args.timeout, on_change=lambda s: live.show(render(s, names))
        ),
        f"following flow {flow_id} (Ctrl-C stops following, not the flow)",
    )
    if state is None:
        print(
            f"hero-node: stopped following; flow {flow_id} goes on: "
            f"hero-node flow status {flow_id} --context {ctx}",
            file=sys.stderr,
        )
        return 130
    print()
    print("\n".join(render(state, names, summary=True)))
    return 0 if state.ok else 1


async def flow_status(client: Client, args: argparse.Namespace) -> int:
    """Exit 0 for a finished flow, 1 for any other status (running or failed)."""
    state = await client.flow_state(args.flow_id, _context(args))
    if args.json:
        print_json(state_json(state))
    else:
        print("\n".join(render(state, await _node_names(client), summary=True)))
    return 0 if state.ok else 1


def state_json(state: FlowState) -> dict[str, Any]:
    """A flow's state as ``flow status --json`` prints it."""
    return {
        "id": state.id,
        "name": state.name,
        "status": state.status.value,
        "reason": state.reason,
        "result": flow_results(state.result),
        "jobs": [
            {
                "id": j.id,
                "job_key": j.job_key,
                "node": j.node,
                "depends": list(j.depends),
                "status": j.status.value,
                "reason": j.reason,
                "result": job_result(j.result),
            }
            for j in state.jobs
        ],
    }


async def flow_show(client: Client, args: argparse.Namespace) -> int:
    from bus.store import records

    ctx = _context(args)
    state = await client.flow_state(args.flow_id, ctx)
    fields: dict[str, Any] = dict(await records.read_flow(client.store, ctx, args.flow_id))
    for name in ("doc", "signatures", "result", "env_vars", "jobs"):
        if name in fields:
            fields[name] = json.loads(fields[name] or "null")
    if isinstance(fields.get("result"), dict):
        fields["result"] = flow_results(fields["result"])
    fields["job_states"] = {
        j.id: {"job_key": j.job_key, "node": j.node, "status": j.status.value, "reason": j.reason}
        for j in state.jobs
    }
    print(json.dumps(fields, indent=2, sort_keys=args.json))
    return 0


async def _node_names(client: Client) -> dict[str, str]:
    from bus.store import records

    names = {p.id: p.name for p in await client.peers() if p.name}
    own = await records.node_info(client.store)
    if own.get("id"):
        names[own["id"]] = own.get("name") or "self"
    return names


def render(state: FlowState, names: dict[str, str], *, summary: bool = False) -> list[str]:
    """The flow as a table: one row per job (dependencies, node, status, output or reason)."""
    title = f"flow {state.id}" + (f" ({state.name})" if state.name else "")
    lines = [f"{title}: {state.status.value}" + (f" - {state.reason}" if state.reason else "")]
    lines.append(f"  {'job':<12} {'after':<14} {'node':<12} {'status':<28} output")
    for job in state.jobs:
        node = names.get(job.node, job.node[:12])
        status = f"{_STATUS_MARK.get(job.status.value, '  ')} {job.status.value}"
        out = job.stdout.strip().replace("\n", " | ") or job.reason
        if not summary:
            out = out[:40]
        after = ",".join(job.depends) or "-"
        lines.append(f"  {job.id:<12} {after:<14} {node:<12} {status:<28} {out}")
    return lines


class LiveTable:
    """Redraws a block of lines in place on a terminal (ANSI), else prints each version."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.height = 0

    def show(self, lines: list[str]) -> None:
        if self.tty and self.height:
            sys.stdout.write(f"\x1b[{self.height}F\x1b[J")
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
        self.height = len(lines)

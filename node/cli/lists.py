"""``hero-node job list`` and ``flow list``: what a context holds, newest first, filtered.

Both read every ``job:*`` (or ``flow:*``) hash of the context DB (SCAN, then pipelined reads),
so their cost grows with what the context keeps; ``--limit`` bounds what is printed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import TYPE_CHECKING, Any

from bus.core import ids, keys
from bus.core.models import FlowStatus, JobStatus
from node.cli.common import context_of, with_client
from node.cli.output import add_json, integer, print_json, stamp

if TYPE_CHECKING:
    from bus.client.api import Client

READ_CHUNK = 500  # hashes per pipelined read
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_time(value: str) -> int:
    """``--since``: a duration back from now (``30s``, ``10m``, ``2h``, ``7d``) or a unix time;
    returns the unix second it means (an argparse type)."""
    found = _DURATION.match(value)
    if found:
        return ids.now() - int(found[1]) * _UNIT_S[found[2]]
    if value.isdigit():
        return int(value)
    raise argparse.ArgumentTypeError(f"{value!r}: want 30s, 10m, 2h, 7d or a unix time")


def _add_filters(parser: argparse.ArgumentParser, statuses: list[str], what: str) -> None:
    parser.add_argument("--context", type=int, default=None, help="context id (default: config)")
    parser.add_argument("--status", choices=statuses, default=None, help=f"only {what} with it")
    parser.add_argument("--type", default=None, dest="script_type", help=f"only {what} of type")
    parser.add_argument("--caller", type=int, default=None, help=f"only {what} of this actor")
    parser.add_argument(
        "--since", type=since_time, default=None, help="only newer: 30s, 10m, 2h, 7d, unix time"
    )
    parser.add_argument("--limit", type=int, default=50, help="at most this many (0: all)")
    add_json(parser)


def add_job_list(job: Any) -> None:  # noqa: ANN401 (argparse's private type)
    s = job.add_parser("list", help="the jobs of a context, newest first (after routing)")
    _add_filters(s, [v.value for v in JobStatus], "jobs")
    s.set_defaults(func=with_client(job_list))


def add_flow_list(flow: Any) -> None:  # noqa: ANN401
    s = flow.add_parser("list", help="the flows of a context, newest first")
    _add_filters(s, [v.value for v in FlowStatus], "flows (with a job)")
    s.set_defaults(func=with_client(flow_list))


async def _hashes(client: Client, ctx: int, pattern: str) -> list[dict[str, str]]:
    from bus.store import records

    found = sorted(await records.find(client.store, ctx, pattern))
    out: list[dict[str, str]] = []
    for start in range(0, len(found), READ_CHUNK):
        chunk = found[start : start + READ_CHUNK]
        hashes = await records.read_many(client.store, ctx, chunk)
        out.extend(h | {"key": k} for k, h in zip(chunk, hashes, strict=True) if h)
    return out


def _int(fields: dict[str, str], name: str) -> int:
    try:
        return int(fields.get(name) or 0)
    except ValueError:
        return 0


def _kept(row: dict[str, Any], args: argparse.Namespace, types: set[str]) -> bool:
    return (
        (args.status is None or row["status"] == args.status)
        and (args.script_type is None or args.script_type in types)
        and (args.caller is None or row["caller_id"] == args.caller)
        and (args.since is None or row["created_at"] >= args.since)
    )


def _newest(rows: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    rows.sort(key=lambda r: (r["created_at"], r["key"]), reverse=True)
    return rows[:limit] if limit > 0 else rows


def job_row(fields: dict[str, str]) -> dict[str, Any]:
    """One job as ``job list --json`` prints it."""
    try:
        exit_code = integer(json.loads(fields.get("result") or "{}").get("exit_code", ""))
    except (ValueError, AttributeError):
        exit_code = None
    return {
        "key": fields["key"],
        "status": fields.get("status", ""),
        "script_type": fields.get("script_type", ""),
        "caller_id": _int(fields, "caller_id"),
        "created_at": _int(fields, "created_at"),
        "updated_at": _int(fields, "updated_at"),
        "reason": fields.get("reason", ""),
        "exit_code": exit_code,
        "message_key": fields.get("message_key", ""),
    }


async def job_list(client: Client, args: argparse.Namespace) -> int:
    ctx = context_of(args)
    rows = [job_row(h) for h in await _hashes(client, ctx, keys.JOB_PATTERN)]
    rows = _newest([r for r in rows if _kept(r, args, {r["script_type"]})], args.limit)
    if args.json:
        print_json(rows)
        return 0
    for r in rows:
        reason = f"  {r['reason']}" if r["reason"] else ""
        print(
            f"{r['key']:<28} {r['status']:<26} {r['script_type']:<8} "
            f"{stamp(r['created_at'])}{reason}"
        )
    print(f"{len(rows)} job(s) in context {ctx}", file=sys.stderr)
    return 0


def flow_row(fields: dict[str, str]) -> tuple[dict[str, Any], set[str]]:
    """One flow as ``flow list --json`` prints it, and the script types of its jobs."""
    try:
        jobs = json.loads(fields.get("doc") or "{}").get("jobs", [])
        types = {str(j.get("script_type", "")) for j in jobs if isinstance(j, dict)}
    except (ValueError, AttributeError):
        jobs, types = [], set()
    row = {
        "id": _int(fields, "id"),
        "key": fields["key"],
        "name": fields.get("name", ""),
        "status": fields.get("status", ""),
        "caller_id": _int(fields, "caller_id"),
        "created_at": _int(fields, "created_at"),
        "updated_at": _int(fields, "updated_at"),
        "jobs": len(jobs),
        "reason": fields.get("reason", ""),
    }
    return row, types


async def flow_list(client: Client, args: argparse.Namespace) -> int:
    ctx = context_of(args)
    rows = []
    for fields in await _hashes(client, ctx, keys.FLOW_PATTERN):
        row, types = flow_row(fields)
        if _kept(row, args, types):
            rows.append(row)
    rows = _newest(rows, args.limit)
    if args.json:
        print_json(rows)
        return 0
    for r in rows:
        reason = f"  {r['reason']}" if r["reason"] else ""
        print(
            f"flow {r['id']:<17} {r['name'] or '-':<14} {r['status']:<10} {r['jobs']} job(s)  "
            f"{stamp(r['created_at'])}{reason}"
        )
    print(f"{len(rows)} flow(s) in context {ctx}", file=sys.stderr)
    return 0

"""``hero-node dlq ...`` (dead letters: what was refused, and why) and ``msg status``."""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Any

from node.cli.common import context_of, with_client
from node.cli.output import add_json, print_json, stamp
from node.errors import NodeError

if TYPE_CHECKING:
    from bus.client.api import Client

CTX_HELP = "context id (default: config; 0: transport-level dead letters)"


def add_dlq_commands(sub: Any) -> None:  # noqa: ANN401 (argparse's private type)
    dlq = sub.add_parser("dlq", help="dead letters: what was refused, and why").add_subparsers(
        metavar="ACTION", help="what to do"
    )
    s = dlq.add_parser("list", help="one line per dead letter, newest first")
    s.add_argument("--context", type=int, default=None, help=CTX_HELP)
    add_json(s)
    s.set_defaults(func=with_client(dlq_list))
    s = dlq.add_parser("show", help="a dead letter and the message it refers to (JSON)")
    s.add_argument("key", help="the dead-lettered key (message:<caller>:<id>, ...)")
    s.add_argument("--context", type=int, default=None, help=CTX_HELP)
    add_json(s)
    s.set_defaults(func=with_client(dlq_show))
    s = dlq.add_parser("retry", help="queue a dead-lettered message again where it was refused")
    s.add_argument("key", nargs="?", help="the key to re-drive")
    s.add_argument("--all", action="store_true", help="re-drive every re-drivable dead letter")
    s.add_argument("--context", type=int, default=None, help=CTX_HELP)
    s.set_defaults(func=with_client(dlq_retry))
    s = dlq.add_parser("purge", help="delete dead letters")
    s.add_argument("key", nargs="?", help="only this key's dead letters")
    s.add_argument("--all", action="store_true", help="all of the context's dead letters")
    s.add_argument("--context", type=int, default=None, help=CTX_HELP)
    s.set_defaults(func=with_client(dlq_purge))


def add_msg_commands(sub: Any) -> None:  # noqa: ANN401
    msg = sub.add_parser("msg", help="inspect messages").add_subparsers(
        metavar="ACTION", help="what to do"
    )
    s = msg.add_parser("status", help="where a message is: pending, sent, acknowledged, ...")
    s.add_argument("key", help="message:<caller>:<id>")
    s.add_argument("--context", type=int, default=None, help="context id (default: config)")
    add_json(s)
    s.set_defaults(func=with_client(msg_status))


async def dlq_list(client: Client, args: argparse.Namespace) -> int:
    ctx = context_of(args)
    entries = await client.store.dead_letters(ctx)
    if args.json:
        print_json(entries)
        return 0
    for e in entries:
        print(
            f"{stamp(e.get('at', 0))}  {e.get('reason', '?'):<22} {e.get('key', '?')}  "
            f"{e.get('detail', '')}"
        )
    print(f"{len(entries)} dead letter(s) in context {ctx}", file=sys.stderr)
    return 0


async def dlq_show(client: Client, args: argparse.Namespace) -> int:
    """JSON with or without ``--json``: ``{"dead_letters": [...], "hash": {...}}``."""
    ctx = context_of(args)
    entries = [e for e in await client.store.dead_letters(ctx) if e.get("key") == args.key]
    if not entries:
        print(f"hero-node: no dead letter for {args.key} in context {ctx}", file=sys.stderr)
        return 1
    from bus.store import records

    fields = await records.read_record(client.store, ctx, args.key)
    print_json({"dead_letters": entries, "hash": fields})
    return 0


async def dlq_retry(client: Client, args: argparse.Namespace) -> int:
    ctx = context_of(args)
    if args.all == bool(args.key):
        raise NodeError("give a key or --all")
    targets = (
        [args.key]
        if args.key
        else sorted({e["key"] for e in await client.store.dead_letters(ctx) if e.get("queue")})
    )
    done = 0
    for key in targets:
        done += bool(await client.store.retry_dead_letter(ctx, key))
    print(f"re-drove {done} of {len(targets)} message(s)")
    return 0 if done == len(targets) else 1


async def dlq_purge(client: Client, args: argparse.Namespace) -> int:
    if args.all == bool(args.key):
        raise NodeError("give a key or --all")
    gone = await client.store.purge_dead_letters(context_of(args), args.key)
    print(f"purged {gone} dead letter(s)")
    return 0


async def message_report(client: Client, ctx: int, key: str) -> dict[str, str] | None:
    """Where the message is (``Client.delivery_status``), and, when this node refused it,
    ``state`` failed with the dead letter's ``reason`` and ``detail`` (a message refused
    before it could be parsed keeps its hash unchanged: the dlq says what happened)."""
    report = await client.delivery_status(ctx, key)
    if report is None:
        return None
    refused = [e for e in await client.store.dead_letters(ctx) if e.get("key") == key]
    if refused:
        newest = refused[0]
        report["state"] = "failed"
        report["reason"] = str(newest.get("reason", report.get("reason", "")))
        report["detail"] = str(newest.get("detail", ""))
    return report


async def msg_status(client: Client, args: argparse.Namespace) -> int:
    ctx = context_of(args)
    report = await message_report(client, ctx, args.key)
    if report is None:
        print(f"hero-node: no {args.key} in context {ctx}", file=sys.stderr)
        return 1
    if args.json:
        print_json({"key": args.key} | {k: _unix(k, v) for k, v in report.items()})
        return 0
    print(f"{args.key}: {report['state']}")
    for name, value in report.items():
        if name != "state":
            print(f"  {name:<14} {value}")
    return 0


def _unix(name: str, value: str) -> str | int:
    """A ``*_at`` field of the report as unix seconds (its text form ends in ``(<unix>)``)."""
    found = re.search(r"\((\d+)\)$", value) if name.endswith("_at") else None
    return int(found[1]) if found else value

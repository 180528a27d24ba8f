"""``hero-node job ...``: submit, wait for, list, stop and inspect jobs.

Option names follow one scheme across commands: ``--actor ID`` (the signing actor), ``--key
FILE`` (its key file, as ``hero-verify sign --key``), ``--context ID``. Older spellings
(``--key-file``) are still accepted, hidden from the help.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bus.core.models import Message
from crypto import load_signing_key_file
from node.cli.common import config_of, context_of, unless_interrupted, with_client
from node.cli.lists import add_job_list
from node.cli.output import add_json, print_json
from node.cli.parsing import hidden_alias
from node.cli.submit import job_submit, job_wait, positive_int
from node.cli.trace import add_job_trace

if TYPE_CHECKING:
    from bus.client.api import Client

CONTEXT_HELP = "context id (default: config)"
ACTOR_HELP = "the signing actor's id (default: config)"
KEY_HELP = "the signing actor's key file (default: the home's actor.key)"


def add_signer(parser: argparse.ArgumentParser) -> None:
    """``--actor`` and ``--key`` (old spelling ``--key-file``)."""
    parser.add_argument("--actor", type=int, default=None, help=ACTOR_HELP)
    parser.add_argument("--key", type=Path, default=None, dest="key_file", help=KEY_HELP)
    hidden_alias(parser, "--key-file", type=Path, dest="key_file")


def add_job_commands(sub: Any) -> None:  # noqa: ANN401 (argparse's private type)
    job = sub.add_parser("job", help="submit and inspect jobs").add_subparsers(
        metavar="ACTION", help="what to do"
    )
    _add_submit(job)
    s = job.add_parser("wait", help="re-attach to a job: its output, then its exit code")
    s.add_argument("key", help="job:<caller>:<id>")
    s.add_argument("--context", type=int, default=None, help=CONTEXT_HELP)
    s.set_defaults(func=with_client(job_wait))

    add_job_list(job)

    s = job.add_parser("stop", help="stop a job (signed; only its caller or a context admin)")
    s.add_argument("key", help="job:<caller>:<id>")
    s.add_argument("--context", type=int, default=None, help=CONTEXT_HELP)
    add_signer(s)
    s.add_argument("--wait", action="store_true", help="wait until the job has ended")
    s.set_defaults(func=with_client(job_stop))

    s = job.add_parser("logs", help="a job's output (stdout and stderr); --follow while it runs")
    s.add_argument("key", help="job:<caller>:<id> (on this node: where it runs, or ran)")
    s.add_argument("--context", type=int, default=None, help=CONTEXT_HELP)
    s.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    s.set_defaults(func=with_client(job_logs))

    s = job.add_parser("show", help="print a job or message hash as JSON")
    s.add_argument("key", help="job:<caller>:<id> or message:<caller>:<id>")
    s.add_argument("--context", type=int, default=None, help=CONTEXT_HELP)
    add_json(s)
    s.set_defaults(func=with_client(job_show))

    add_job_trace(job)


def _add_submit(job: Any) -> None:  # noqa: ANN401
    s = job.add_parser("submit", help="sign and submit a job; --wait follows it to its end")
    s.add_argument(
        "--to", default="self", help="node: 'self', a name, an id or its first 8+ hex digits"
    )
    s.add_argument("--context", type=int, default=None, help=CONTEXT_HELP)
    s.add_argument("--type", default="python", dest="script_type", help="script type")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--script", help="the script text")
    src.add_argument("--file", type=script_file, help="read the script from this file ('-': stdin)")
    s.add_argument("--env", action="append", default=[], metavar="K=V", help="env var for the job")
    s.add_argument("--timeout", type=positive_int, default=60, help="job timeout in seconds")
    s.add_argument(
        "--wait",
        action="store_true",
        help="print the job's output live and exit with its exit code",
    )
    add_signer(s)
    s.set_defaults(func=with_client(job_submit))


def script_file(value: str) -> Path:
    """``--file``'s path, refused at parse time (exit 2, no traceback) if it cannot be read."""
    path = Path(value)
    if value != "-" and (path.is_dir() or not os.access(path, os.R_OK)):
        raise argparse.ArgumentTypeError(f"cannot read {value}: no such readable file")
    return path


async def job_stop(client: Client, args: argparse.Namespace) -> int:
    from bus.store import records

    config = config_of(args)
    key = load_signing_key_file(args.key_file or config.actor_key_path)
    ctx = context_of(args)
    actor = args.actor or config.actor_id
    job = await client.job_fields(ctx, args.key)
    await client.stop_job(key, actor, args.key, ctx)
    print(f"stop requested for {args.key}")
    if args.wait and job.get("message_key"):
        request = await records.read_message(client.store, ctx, job["message_key"])
        message = Message.from_hash(request)
        [result] = await client.wait_results(replace(message, job=message.job[:1]), 60)
        print(f"{result.job_key}: {result.status.value} {result.reason}")
    return 0


async def job_logs(client: Client, args: argparse.Namespace) -> int:
    """A job's output; with ``--follow`` until it ends, Ctrl-C stopping the following (exit
    130) as it stops every other wait of the CLI: :func:`unless_interrupted`, not
    KeyboardInterrupt, which trio raises wherever the program is (and never, where the
    command was started with SIGINT ignored)."""

    async def printed() -> int:
        async for stream, text in client.job_logs(context_of(args), args.key, follow=args.follow):
            out = sys.stdout if stream == "stdout" else sys.stderr
            out.write(text)
            out.flush()
        return 0

    if not args.follow:
        return await printed()
    done = await unless_interrupted(
        printed, f"following {args.key} (Ctrl-C stops following, not the job)"
    )
    if done is None:
        print(f"hero-node: stopped following; {args.key} goes on", file=sys.stderr)
        return 130
    return done


async def job_show(client: Client, args: argparse.Namespace) -> int:
    """The hash, as JSON with or without ``--json`` (its fields as stored, all strings)."""
    from bus.store import records

    ctx = context_of(args)
    fields: dict[str, Any] = await records.read_record(client.store, ctx, args.key)
    if not fields and args.key.startswith("job:"):  # submitted, not routed yet: from its message
        fields = await client.job_fields(ctx, args.key)
    if not fields:
        print(f"hero-node: no {args.key} in context {ctx}", file=sys.stderr)
        return 1
    if args.json:
        print_json(fields)
    else:
        print(json.dumps(fields, indent=2))
    return 0

"""``hero-node``: initialise, run and operate a node of the signed job bus."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from bus.client import Client
from bus.errors import BusError
from bus.models import Message
from crypto import CryptoError, KeyPair, load_key_file, passphrase_from_env
from crypto.keys import ALGORITHM_ED25519, ALGORITHMS
from node.acl import CLIENT, RUNNER, reachable_url, role_url
from node.cli.common import config_of, context_of, home_of, unless_interrupted, with_client
from node.cli.flow import add_flow_commands
from node.cli.parsing import HOME_HELP, finish, package_version
from node.cli.status import status
from node.config import NodeConfig
from node.errors import NodeError
from node.launch import Ready, ready_line
from node.logs import FORMATS
from node.logs import configure as configure_logging

log = logging.getLogger("hero-node")

EPILOG = """\
Quick start (one node, embedded Valkey):
  hero-node init                      # creates ~/.hero-node (or $HERO_NODE_HOME)
  hero-node run &                     # starts Valkey, the listener and the runners
  hero-node job submit --to self --context 1 --type python --script 'print(6*7)' --wait

Two nodes: run `hero-node id` on each, then on each `hero-node peer add <other id> ws://host:port`,
and on the executing node `hero-node actor add --id N --pubkey <actor key>` and
`hero-node context add 1 --executor N`.
"""


def main(argv: list[str] | None = None) -> int:
    """Runs one command; a reader that went away (``| head``) ends it quietly, as it would end
    any Unix filter: exit 141, the shell's code for SIGPIPE."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # inside the try: buffered output fails here, not at exit
    except BrokenPipeError:
        # the interpreter flushes stdout again at exit: point it where that cannot fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, getattr(args, "log_format", "text"))
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        code: int = args.func(args)
        return code
    except (NodeError, BusError, CryptoError) as exc:
        print(f"hero-node: {exc}", file=sys.stderr)
        return _exit_code([exc])
    except BaseExceptionGroup as group:  # errors raised inside the node's nurseries
        if group.split(KeyboardInterrupt)[1] is None:  # Ctrl-C landed inside a nursery
            return 130
        expected, rest = group.split((NodeError, BusError, CryptoError))
        if rest is not None or expected is None:
            raise
        for leaf in _leaves(expected):
            print(f"hero-node: {leaf}", file=sys.stderr)
        return _exit_code(_leaves(expected))
    except KeyboardInterrupt:
        return 130


def _exit_code(errors: list[BaseException]) -> int:
    """1, or what an error asks for (2: another node holds the home)."""
    return max(int(getattr(exc, "exit_code", 1)) for exc in errors)


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hero-node",
        description="A node of the hero signed job bus.",
        epilog=EPILOG,
    )
    p.add_argument("--home", type=Path, default=None, help=HOME_HELP)
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="least severe log messages shown",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = p.add_subparsers(title="commands", metavar="COMMAND", help="run COMMAND -h for its help")

    s = sub.add_parser("init", help="create the home: node key, default actor key, config.toml")
    s.add_argument("--name", default="node", help="a short name for this node")
    s.add_argument("--listen-port", type=int, default=7700, help="websocket port (0: any free)")
    s.add_argument("--redis", default="", help="use this Redis URL instead of an embedded Valkey")
    s.add_argument(
        "--actor-id", type=int, default=1, help="id of this home's default actor (default 1)"
    )
    s.add_argument(
        "--tls",
        action="store_true",
        help="listen on wss:// (self-signed certificate, bound "
        "in the node handshake; peers then dial wss://host:port)",
    )
    s.add_argument(
        "--console",
        default=None,
        metavar="HOST:PORT",
        help='web console address ("" off; default 127.0.0.1 and the websocket port + 80)',
    )
    s.add_argument("--force", action="store_true", help="replace an existing home's keys/config")
    s.set_defaults(func=cmd_init)

    s = sub.add_parser("run", help="run the node until SIGINT/SIGTERM")
    s.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="text lines, or one JSON object per line (ts, level, logger, msg, job, ctx, "
        "reason, ...) for log shippers",
    )
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("id", help="print this node's id (its public key)")
    s.set_defaults(func=cmd_id)

    s = sub.add_parser(
        "credentials",
        help="print the Redis URL (with its password) a client or an external runner connects "
        "with to this node's embedded Valkey",
    )
    s.add_argument("role", choices=[CLIENT, RUNNER], help="who connects with it")
    s.set_defaults(func=cmd_credentials)

    s = sub.add_parser(
        "status", help="show the running node: id, peers, queues, runners, counters"
    )
    s.add_argument("--json", action="store_true", help="print it as one JSON object")
    s.set_defaults(func=with_client(status))

    peer = sub.add_parser("peer", help="manage peer nodes").add_subparsers(
        metavar="ACTION", help="what to do"
    )
    s = peer.add_parser("add", help="register a peer node (it may then link to us)")
    s.add_argument("node_id", help="the peer's node id (hex public key)")
    s.add_argument("address", nargs="?", default="", help="ws://host:port to dial (optional)")
    s.add_argument("--name", default="", help="a short name, usable as --to")
    s.set_defaults(func=with_client(peer_add))
    s = peer.add_parser("list", help="list peers")
    s.set_defaults(func=with_client(peer_list))

    actor = sub.add_parser("actor", help="manage actors").add_subparsers(
        metavar="ACTION", help="what to do"
    )
    s = actor.add_parser("add", help="register an actor's public key")
    s.add_argument("--id", type=int, required=True, dest="actor_id", help="the actor's id")
    s.add_argument(
        "--pubkey",
        required=True,
        help="the actor's public key in hex (ed25519: 64 hex; secp256k1: 66 hex, compressed)",
    )
    s.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default=ALGORITHM_ED25519,
        help="the key's algorithm; the actor's signatures must be of it (default: ed25519)",
    )
    s.set_defaults(func=with_client(actor_add))

    ctx = sub.add_parser("context", help="manage contexts").add_subparsers(
        metavar="ACTION", help="what to do"
    )
    s = ctx.add_parser("add", help="create or replace a context and its permission lists")
    s.add_argument("context_id", type=int, help="the context's id")
    s.add_argument("--admin", type=int, action="append", default=[], help="admin actor id (repeat)")
    many = "(repeat for more)"
    s.add_argument("--executor", type=int, action="append", default=[], help=f"executor {many}")
    s.add_argument("--reader", type=int, action="append", default=[], help=f"reader actor {many}")
    s.set_defaults(func=with_client(context_add))

    job = sub.add_parser("job", help="submit and inspect jobs").add_subparsers(
        metavar="ACTION", help="what to do"
    )
    s = job.add_parser("submit", help="sign and submit a job; --wait prints its output")
    s.add_argument("--to", default="self", help="node: 'self', a peer name, id or id prefix")
    s.add_argument("--context", type=int, default=None, help="context id (default: config)")
    s.add_argument("--type", default="python", dest="script_type", help="script type")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--script", help="the script text")
    src.add_argument("--file", type=script_file, help="read the script from this file ('-': stdin)")
    s.add_argument("--env", action="append", default=[], metavar="K=V", help="env var for the job")
    s.add_argument("--timeout", type=int, default=60, help="job timeout in seconds")
    s.add_argument("--wait", action="store_true", help="wait, print stdout, exit with its status")
    s.add_argument("--actor", type=int, default=None, help="actor id (default: config)")
    s.add_argument("--key", type=Path, default=None, help="actor key file (default: actor.key)")
    s.set_defaults(func=with_client(job_submit))
    s = job.add_parser("stop", help="stop a job (signed; only its caller or a context admin)")
    s.add_argument("key", help="job:<caller>:<id>")
    s.add_argument("--context", type=int, default=None, help="context id (default: config)")
    s.add_argument("--actor", type=int, default=None, help="actor id (default: config)")
    s.add_argument("--key-file", type=Path, default=None, help="actor key (default: actor.key)")
    s.add_argument("--wait", action="store_true", help="wait until the job has ended")
    s.set_defaults(func=with_client(job_stop))
    s = job.add_parser("logs", help="a job's output (stdout and stderr); --follow while it runs")
    s.add_argument("key", help="job:<caller>:<id> (on this node: where it runs, or ran)")
    s.add_argument("--context", type=int, default=None, help="context id (default: config)")
    s.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    s.set_defaults(func=with_client(job_logs))
    s = job.add_parser("show", help="print a job or message hash as JSON")
    s.add_argument("key", help="job:<caller>:<id> or message:<caller>:<id>")
    s.add_argument("--context", type=int, default=None, help="context id (default: config)")
    s.set_defaults(func=with_client(job_show))

    _add_dlq_commands(sub)
    add_flow_commands(sub)
    msg = sub.add_parser("msg", help="inspect messages").add_subparsers(
        metavar="ACTION", help="what to do"
    )
    s = msg.add_parser("status", help="where a message is: pending, sent, acknowledged, ...")
    s.add_argument("key", help="message:<caller>:<id>")
    s.add_argument("--context", type=int, default=None, help="context id (default: config)")
    s.set_defaults(func=with_client(msg_status))
    finish(p)
    return p


def _add_dlq_commands(sub: Any) -> None:  # noqa: ANN401
    dlq = sub.add_parser("dlq", help="dead letters: what was refused, and why").add_subparsers(
        metavar="ACTION", help="what to do"
    )
    ctx_help = "context id (default: config; 0: transport-level dead letters)"
    s = dlq.add_parser("list", help="one line per dead letter, newest first")
    s.add_argument("--context", type=int, default=None, help=ctx_help)
    s.set_defaults(func=with_client(dlq_list))
    s = dlq.add_parser("show", help="a dead letter and the message it refers to")
    s.add_argument("key", help="the dead-lettered key (message:<caller>:<id>, ...)")
    s.add_argument("--context", type=int, default=None, help=ctx_help)
    s.set_defaults(func=with_client(dlq_show))
    s = dlq.add_parser("retry", help="queue a dead-lettered message again where it was refused")
    s.add_argument("key", nargs="?", help="the key to re-drive")
    s.add_argument("--all", action="store_true", help="re-drive every re-drivable dead letter")
    s.add_argument("--context", type=int, default=None, help=ctx_help)
    s.set_defaults(func=with_client(dlq_retry))
    s = dlq.add_parser("purge", help="delete dead letters")
    s.add_argument("key", nargs="?", help="only this key's dead letters")
    s.add_argument("--all", action="store_true", help="all of the context's dead letters")
    s.add_argument("--context", type=int, default=None, help=ctx_help)
    s.set_defaults(func=with_client(dlq_purge))


# -- local commands ----------------------------------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    from node.home import init_home

    config = init_home(
        home_of(args),
        name=args.name,
        listen_port=args.listen_port,
        redis_url=args.redis,
        passphrase=passphrase_from_env(),
        force=args.force,
        actor_id=args.actor_id,
        tls=args.tls,
        console_listen=args.console,
    )
    node_key = load_key_file(config.node_key_path)
    actor_key = load_key_file(config.actor_key_path)
    print(f"initialised {config.home}")
    print(f"  node id:    {node_key.public_hex}")
    print(f"  actor {config.actor_id}:    {actor_key.public_hex}")
    scheme = "wss" if config.tls else "ws"
    print(f"  listen:     {scheme}://{config.listen_host}:{config.listen_port}")
    if not config.redis_url:
        print(f"  valkey:     {reachable_url(config)} (hero-node credentials client|runner)")
    if config.console.enabled:
        print(f"  console:    http://{config.console.listen} (read-only; README: Web console)")
    print("start it with: hero-node run" + (f" --home {config.home}" if args.home else ""))
    return 0


def cmd_id(args: argparse.Namespace) -> int:
    print(load_key_file(config_of(args).node_key_path).public_hex)
    return 0


def cmd_credentials(args: argparse.Namespace) -> int:
    """The URL of ``args.role``: over TCP when the config opens a Valkey port (what runners on
    other machines need), else the unix socket in run/."""
    config = config_of(args)
    if config.redis_url:
        raise NodeError(
            "this node uses the Redis of its redis_url setting: create the ACL users on that "
            "server yourself (README: Who may write the node's Valkey)"
        )
    print(role_url(config, reachable_url(config), args.role))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    config = config_of(args)
    key = load_key_file(config.node_key_path)  # before trio: may prompt for a passphrase
    trio.run(_run_until_signal, config, key)
    return 0


async def _run_until_signal(config: NodeConfig, key: KeyPair) -> None:
    from node.daemon import NodeInfo, run_node

    stop = trio.Event()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def node_then_exit(*, task_status: trio.TaskStatus[NodeInfo]) -> None:
                await run_node(config, key=key, stop=stop, task_status=task_status)
                nursery.cancel_scope.cancel()  # drained: stop listening for signals

            info = await nursery.start(node_then_exit)
            ready = Ready(info.node_id, info.ws_url, info.redis_url, info.console_url)
            print(ready_line(config.name, ready), flush=True)
            nursery.start_soon(_on_signals, signals, stop, nursery.cancel_scope)


async def _on_signals(
    signals: AsyncIterator[int], stop: trio.Event, everything: trio.CancelScope
) -> None:
    """First SIGINT/SIGTERM: graceful stop (run_node returns when drained). Second: now."""
    async for signum in signals:
        name = signal.Signals(signum).name
        if stop.is_set():
            log.warning("received %s again; stopping now", name)
            everything.cancel()
            return
        log.info("received %s; finishing running jobs (again to stop now)", name)
        stop.set()


# -- commands that talk to the node's Redis ----------------------------------------------------


async def peer_add(client: Client, args: argparse.Namespace) -> int:
    peer = await client.add_peer(args.node_id, args.address, args.name)
    print(f"peer {peer.name or peer.id[:16]} added")
    return 0


async def peer_list(client: Client, args: argparse.Namespace) -> int:
    for peer in await client.peers():
        print(f"{peer.id}  {peer.name or '-'}  {peer.address or '-'}")
    return 0


async def actor_add(client: Client, args: argparse.Namespace) -> int:
    actor = await client.register_actor(args.actor_id, args.pubkey, algorithm=args.algorithm)
    print(f"actor {actor.id} registered")
    return 0


async def context_add(client: Client, args: argparse.Namespace) -> int:
    ctx = await client.register_context(
        args.context_id, admins=args.admin, executors=args.executor, readers=args.reader
    )
    print(f"context {ctx.id}: admins {ctx.admins} executors {ctx.executors} readers {ctx.readers}")
    return 0


async def job_submit(client: Client, args: argparse.Namespace) -> int:
    config = config_of(args)
    script = args.script if args.script is not None else _read_script(args.file)
    env = dict(_parse_env(item) for item in args.env)
    key = load_key_file(args.key or config.actor_key_path)
    to = await client.resolve_node(args.to)
    context = args.context or config.context_id
    message = await client.submit_job(
        key,
        args.actor or config.actor_id,
        to=to,
        context_id=context,
        script_type=args.script_type,
        script=script,
        env_vars=env,
        timeout_s=args.timeout,
    )
    if not args.wait:
        print(message.job[0].key)
        return 0
    job_key = message.job[0].key
    results = await unless_interrupted(
        lambda: client.wait_results(message, timeout_s=args.timeout + 30),
        f"waiting for {job_key} (Ctrl-C stops waiting, not the job)",
    )
    if results is None:
        print(
            f"hero-node: stopped waiting; {job_key} goes on (message {message.key}): "
            f"hero-node job logs {job_key} --follow",
            file=sys.stderr,
        )
        return 130
    [result] = results
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.result.get("stderr", ""))
    if not result.ok:
        print(f"hero-node: job {result.job_key} failed: {result.reason}", file=sys.stderr)
        return 1
    return 0


def script_file(value: str) -> Path:
    """``--file``'s path, refused at parse time (exit 2, no traceback) if it cannot be read."""
    path = Path(value)
    if value != "-" and (path.is_dir() or not os.access(path, os.R_OK)):
        raise argparse.ArgumentTypeError(f"cannot read {value}: no such readable file")
    return path


def _read_script(path: Path) -> str:
    try:
        return sys.stdin.read() if str(path) == "-" else path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise NodeError(f"cannot read {path}: {exc}") from None


def _parse_env(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name:
        raise NodeError(f"--env wants NAME=VALUE, got {item!r}")
    return name, value


async def job_stop(client: Client, args: argparse.Namespace) -> int:
    config = config_of(args)
    key = load_key_file(args.key_file or config.actor_key_path)
    ctx = context_of(args)
    actor = args.actor or config.actor_id
    job = await client.job_fields(ctx, args.key)
    await client.stop_job(key, actor, args.key, ctx)
    print(f"stop requested for {args.key}")
    if args.wait and job.get("message_key"):
        request = await client.store.hgetall(ctx, job["message_key"])
        message = Message.from_hash(request)
        [result] = await client.wait_results(replace(message, job=message.job[:1]), 60)
        print(f"{result.job_key}: {result.status.value} {result.reason}")
    return 0


async def job_logs(client: Client, args: argparse.Namespace) -> int:
    async for stream, text in client.job_logs(context_of(args), args.key, follow=args.follow):
        out = sys.stdout if stream == "stdout" else sys.stderr
        out.write(text)
        out.flush()
    return 0


async def job_show(client: Client, args: argparse.Namespace) -> int:
    ctx = args.context or config_of(args).context_id
    fields: dict[str, Any] = await client.store.hgetall(ctx, args.key)
    if not fields and args.key.startswith("job:"):  # submitted, not routed yet: from its message
        fields = await client.job_fields(ctx, args.key)
    if not fields:
        print(f"hero-node: no {args.key} in context {ctx}", file=sys.stderr)
        return 1
    print(json.dumps(fields, indent=2))
    return 0


async def dlq_list(client: Client, args: argparse.Namespace) -> int:
    entries = await client.store.dead_letters(context_of(args))
    for e in entries:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.get("at", 0)))
        print(f"{stamp}  {e.get('reason', '?'):<22} {e.get('key', '?')}  {e.get('detail', '')}")
    print(f"{len(entries)} dead letter(s) in context {context_of(args)}", file=sys.stderr)
    return 0


async def dlq_show(client: Client, args: argparse.Namespace) -> int:
    ctx = context_of(args)
    entries = [e for e in await client.store.dead_letters(ctx) if e.get("key") == args.key]
    if not entries:
        print(f"hero-node: no dead letter for {args.key} in context {ctx}", file=sys.stderr)
        return 1
    fields = await client.store.hgetall(ctx, args.key)
    print(json.dumps({"dead_letters": entries, "hash": fields}, indent=2))
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


async def msg_status(client: Client, args: argparse.Namespace) -> int:
    ctx = context_of(args)
    report = await client.delivery_status(ctx, args.key)
    if report is None:
        print(f"hero-node: no {args.key} in context {ctx}", file=sys.stderr)
        return 1
    print(f"{args.key}: {report['state']}")
    for name, value in report.items():
        if name != "state":
            print(f"  {name:<14} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``hero-node``: initialise, run and operate a node of the signed job bus."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from bus.errors import BusError
from bus.store import CLIENT_LOGGER
from crypto import CryptoError, load_key_file, passphrase_from_env
from node.cli.common import config_of, home_of
from node.cli.completion import add_completion_command, complete
from node.cli.dlq import add_dlq_commands, add_msg_commands
from node.cli.flow import add_flow_commands
from node.cli.jobs import add_job_commands
from node.cli.output import add_json
from node.cli.parsing import HOME_HELP, VersionAction, finish, hidden_alias, home_dir
from node.cli.registry import add_registry_commands
from node.cli.status import cmd_status
from node.errors import NodeError
from node.host.acl import CLIENT, RUNNER, reachable_url, role_url
from node.observe.logs import FORMATS
from node.observe.logs import configure as configure_logging

# The parser, --help and shell completion (a run of this program on every TAB) need none of
# the node, its store client or trio: the commands that use them import them.
if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import trio

    from crypto import KeyPair
    from node.config import NodeConfig

log = logging.getLogger("hero-node")

EPILOG = """\
Quick start (one node, embedded Valkey):
  hero-node init                      # creates ~/.hero-node (or $HERO_NODE_HOME)
  hero-node run &                     # starts Valkey, the listener and the runners
  hero-node job submit --to self --context 1 --type python --script 'print(6*7)' --wait

Two nodes: run `hero-node id` on each, then on each `hero-node peer add <other id> ws://host:port`,
and on the executing node `hero-node actor add --actor N --pubkey <actor key>` and
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
    if argv is None:  # the shell asking for completions: answered from the parser, then exit
        complete(parser)
    args = parser.parse_args(argv)
    configure_logging(args.log_level, getattr(args, "log_format", "text"))
    if args.log_level != "debug" and getattr(args, "func", None) is not cmd_run:
        # a client command reports Redis errors itself; Ctrl-C during a connection attempt
        # makes the store's client log an ERROR with a traceback, which a user must not see
        logging.getLogger(CLIENT_LOGGER).setLevel(logging.CRITICAL)
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
            _say_what_stopped_it(group)
            raise
        for leaf in _leaves(expected):
            print(f"hero-node: {leaf}", file=sys.stderr)
        return _exit_code(_leaves(expected))
    except KeyboardInterrupt:
        return 130


def _say_what_stopped_it(group: BaseExceptionGroup[BaseException]) -> None:
    """One line per error before the traceback: a group's traceback nests every task's
    frames, the errors themselves come last, and a log cut short (a supervisor's SIGTERM, a
    full disk) loses exactly them."""
    for leaf in _leaves(group):
        frame = leaf.__traceback__
        while frame is not None and frame.tb_next is not None:
            frame = frame.tb_next
        where = f" at {frame.tb_frame.f_code.co_filename}:{frame.tb_lineno}" if frame else ""
        print(
            f"hero-node: stopped by an unexpected error, a bug{where}: "
            f"{type(leaf).__name__}: {leaf} (its traceback follows)",
            file=sys.stderr,
            flush=True,
        )


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
    p.add_argument("--home", type=home_dir, default=None, help=HOME_HELP)
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="least severe log messages shown",
    )
    p.add_argument("--version", action=VersionAction)
    sub = p.add_subparsers(title="commands", metavar="COMMAND", help="run COMMAND -h for its help")
    _add_local_commands(sub)
    s = sub.add_parser(
        "status",
        help="show the running node: id, peers and their links, queues, runners, counters; "
        "exit 1 if the node is down, 3 if a peer link is down (a health check)",
    )
    add_json(s)
    s.set_defaults(func=cmd_status)
    add_registry_commands(sub)
    add_job_commands(sub)
    add_flow_commands(sub)
    add_dlq_commands(sub)
    add_msg_commands(sub)
    add_completion_command(sub)
    finish(p)
    return p


def _add_local_commands(sub: Any) -> None:  # noqa: ANN401 (argparse's private type)
    """The commands that work on the home without a running node."""
    s = sub.add_parser("init", help="create the home: node key, default actor key, config.toml")
    s.add_argument("--name", default="node", help="a short name for this node")
    s.add_argument("--listen-port", type=int, default=7700, help="websocket port (0: any free)")
    s.add_argument("--redis", default="", help="use this Redis URL instead of an embedded Valkey")
    s.add_argument(
        "--sentinel",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a Sentinel of a replicated store (repeat for each): the node finds its primary "
        "through them and follows a failover ([store] in config.toml)",
    )
    s.add_argument("--service", default="hero", help="the Sentinels' name of the store's primary")
    s.add_argument(
        "--waitaof",
        default="1,1",
        metavar="L,R",
        help="with --sentinel: a promise waits until its writes are fsynced on the primary (L: "
        "0 or 1) and R replicas (default 1,1; 0,0: no wait)",
    )
    s.add_argument(
        "--promise",
        choices=("every-replica", "one-replica"),
        default="every-replica",
        help="with --sentinel: every-replica (R raised to every replica of the set: a failover "
        "loses no promise) or one-replica (R as given; weaker: docs/operate/promise.md)",
    )
    s.add_argument(
        "--actor", type=int, default=1, dest="actor_id", help="id of this home's default actor"
    )
    hidden_alias(s, "--actor-id", type=int, dest="actor_id")
    s.add_argument(
        "--link-encryption",
        choices=("tls", "none"),
        default="tls",
        help='links to peers: "tls" (the default: TLS 1.3, a self-signed certificate bound in '
        'the node handshake; peers dial wss://host:port) or "none" (cleartext: anyone on the '
        "path reads every job; warned about at every start)",
    )
    # links are TLS by default now: --tls asks for what is done anyway
    hidden_alias(s, "--tls", action="store_const", const="tls", dest="link_encryption")
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
        "store-acl",
        help="print what the servers of a replicated store ([store]) need: the ACL file of "
        "each data server (data), a replica's lines (replica) or a Sentinel's (sentinel)",
    )
    s.add_argument(
        "part",
        choices=["data", "replica", "sentinel"],
        help="data: every data server's ACL file; replica: its lines to sync from the primary; "
        "sentinel: each Sentinel's lines",
    )
    s.set_defaults(func=cmd_store_acl)


# -- local commands ----------------------------------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    from node.config.store import StoreConfig, parse_store
    from node.host.home import init_home

    store = None
    if args.sentinel:
        local, _, replicas = args.waitaof.partition(",")
        if not (local.isdigit() and replicas.isdigit()):
            raise NodeError(f"--waitaof wants L,R (e.g. 1,1), got {args.waitaof!r}")
        store = parse_store(
            {
                "sentinels": args.sentinel,
                "service": args.service,
                "waitaof_local": int(local),
                "waitaof_replicas": int(replicas),
                "waitaof_timeout_ms": StoreConfig().waitaof_timeout_ms,
                "promise": args.promise,
            }
        )
    config = init_home(
        home_of(args),
        name=args.name,
        listen_port=args.listen_port,
        redis_url=args.redis,
        passphrase=passphrase_from_env(),
        force=args.force,
        actor_id=args.actor_id,
        link_encryption=args.link_encryption,
        console_listen=args.console,
        store=store,
    )
    node_key = load_key_file(config.node_key_path)
    actor_key = load_key_file(config.actor_key_path)
    print(f"initialised {config.home}")
    print(f"  node id:    {node_key.public_hex}")
    print(f"  actor {config.actor_id}:    {actor_key.public_hex}")
    from node.links.encryption import PLAINTEXT_WHY, encrypted, scheme

    print(f"  listen:     {scheme(config)}://{config.listen_host}:{config.listen_port}")
    if encrypted(config):
        print("  links:      encrypted (TLS 1.3, certificate bound to the node key)")
    else:
        print(f"  links:      NOT ENCRYPTED ({PLAINTEXT_WHY}): the path reads every job")
    if config.store.replicated:
        print(f"  store:      {', '.join(config.store.sentinels)} ({config.store.service})")
        print("              its servers' ACL users: hero-node store-acl data|replica|sentinel")
    elif not config.redis_url:
        print(f"  valkey:     {reachable_url(config)} (hero-node credentials client|runner)")
    if config.console.enabled:
        print(f"  console:    http://{config.console.listen} (read-only; docs/operate/console.md)")
    # auto stays in config.toml (each start probes again); here is what it picks on this host
    from node.runners.sandboxes import explain, probe_config

    iso = probe_config(config)
    print(f"  isolation:  {config.isolation} -> {iso.mode} ({iso.why}; limits by {iso.limits})")
    print(f"              {explain(iso)}")
    if iso.fix:
        print(f"  to fix:     {iso.fix}")
    print(f"  bwrap:      {iso.bwrap_info}")
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
            "server yourself (docs/security/valkey.md)"
        )
    print(role_url(config, reachable_url(config), args.role))
    return 0


def cmd_store_acl(args: argparse.Namespace) -> int:
    """The users of a replicated store, with this home's passwords (made if missing)."""
    from node.host.acl import ensure_secrets
    from node.host.replicated import SET_ROLES, store_acl

    config = config_of(args)
    passwords = ensure_secrets(config.home, SET_ROLES)
    print(store_acl(args.part, passwords, config.store.service), end="")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import trio

    from node.host.hardening import not_dumpable
    from node.sandbox.disk import private_mounts

    config = config_of(args)
    # before the key is read: no process of this uid may read the node's memory or environment
    not_dumpable()
    key = load_key_file(config.node_key_path)  # before trio: may prompt for a passphrase
    private_mounts()  # before any thread: the context disks it mounts end with the node
    trio.run(_run_until_signal, config, key)
    return 0


async def _run_until_signal(config: NodeConfig, key: KeyPair) -> None:
    import trio

    from node.daemon import NodeInfo, run_node
    from node.host.heap import freeze_start_heap
    from node.host.launch import Ready, ready_line

    stop = trio.Event()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def node_then_exit(*, task_status: trio.TaskStatus[NodeInfo]) -> None:
                await run_node(config, key=key, stop=stop, task_status=task_status)
                nursery.cancel_scope.cancel()  # drained: stop listening for signals

            info = await nursery.start(node_then_exit)
            frozen = freeze_start_heap()
            logging.getLogger("node").info(
                "start-up heap frozen: %d objects out of the collector's full passes", frozen
            )
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


if __name__ == "__main__":
    raise SystemExit(main())

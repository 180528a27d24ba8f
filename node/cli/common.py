"""What every ``hero-node`` command shares: the home, its configuration, a client on the
node's Redis."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from node.cli.parsing import home_dir
from node.errors import NodeError
from node.host.acl import NODE, role_url
from node.host.homelock import holder

# Every command module imports this one to build its parser: trio, the store client and the
# configuration are imported where a command runs, so that --help and shell completion (a run
# on every TAB) do not load them.
if TYPE_CHECKING:
    from bus.client.api import Client
    from node.config import NodeConfig

T = TypeVar("T")


async def unless_interrupted(wait: Callable[[], Awaitable[T]], note: str) -> T | None:
    """``wait()``'s result, or None once Ctrl-C (SIGINT) arrives, the wait cancelled cleanly;
    ``note`` goes to stderr once Ctrl-C is caught here, so a user (or a test) who reacts to it
    is answered by this function. Waiting for KeyboardInterrupt instead is not enough: trio
    raises it wherever the program happens to be, which may be inside the Redis client, whose
    connection it then breaks (the command ends in a traceback, not in the message that says
    how to re-attach)."""
    import trio

    result: list[T] = []
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        print(note, file=sys.stderr, flush=True)
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                result.append(await wait())
                nursery.cancel_scope.cancel()

            async def watch() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel()

            nursery.start_soon(run)
            nursery.start_soon(watch)
    return result[0] if result else None


def home_of(args: argparse.Namespace) -> Path:
    """The home of this command, absolute: ``--home`` is made so as it is parsed, and the
    default (``$HERO_NODE_HOME``, else ``~/.hero-node``) by the same function."""
    from node.config import default_home

    home: Path = args.home if args.home else home_dir(str(default_home()))
    return home


def config_of(args: argparse.Namespace) -> NodeConfig:
    from node.config import load_config

    return load_config(home_of(args))


def with_client(
    fn: Callable[[Client, argparse.Namespace], Awaitable[int]],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        import trio

        from bus.client.api import open_client

        url = redis_url_of(config_of(args))

        async def go() -> int:
            async with open_client(url) as client:
                return await fn(client, args)

        return trio.run(go)

    return run


def redis_url_of(config: NodeConfig) -> str:
    if config.redis_url:
        return config.redis_url
    if config.store.replicated:  # the Sentinels know where the store is, running node or not
        return role_url(config, "", NODE)
    info = config.run_dir / "node.json"
    # node.json outlives its node: only the home's lock says whether a node runs there
    if holder(config.run_dir) is None or not info.exists():
        raise NodeError(f"{config.home}: the node is not running (start it with: hero-node run)")
    # node.json names the socket, not the password: that is read from the home's secrets/
    return role_url(config, str(json.loads(info.read_text())["redis_url"]), NODE)


def context_of(args: argparse.Namespace) -> int:
    return int(config_of(args).context_id if args.context is None else args.context)


class UsageError(NodeError):
    """A mistake in what the user asked (exit 2, as argparse's own usage errors)."""

    exit_code = 2

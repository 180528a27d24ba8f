"""What every ``hero-node`` command shares: the home, its configuration, a client on the
node's Redis."""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from bus.client import Client, open_client
from node.acl import NODE, role_url
from node.config import NodeConfig, default_home, load_config
from node.errors import NodeError
from node.homelock import holder


def home_of(args: argparse.Namespace) -> Path:
    return Path(args.home) if args.home else default_home()


def config_of(args: argparse.Namespace) -> NodeConfig:
    return load_config(home_of(args))


def with_client(
    fn: Callable[[Client, argparse.Namespace], Awaitable[int]],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        url = redis_url_of(config_of(args))

        async def go() -> int:
            async with open_client(url) as client:
                return await fn(client, args)

        return trio.run(go)

    return run


def redis_url_of(config: NodeConfig) -> str:
    if config.redis_url:
        return config.redis_url
    info = config.run_dir / "node.json"
    # node.json outlives its node: only the home's lock says whether a node runs there
    if holder(config.run_dir) is None or not info.exists():
        raise NodeError(f"{config.home}: the node is not running (start it with: hero-node run)")
    # node.json names the socket, not the password: that is read from the home's secrets/
    return role_url(config, str(json.loads(info.read_text())["redis_url"]), NODE)


def context_of(args: argparse.Namespace) -> int:
    return int(config_of(args).context_id if args.context is None else args.context)

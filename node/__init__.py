"""A hero-bus node: :func:`run_node` runs one from its :class:`NodeConfig` until cancelled.

Embedding a node in a trio program::

    config = init_home(Path("alice"), name="alice")  # or load_config(home) for an existing one
    async with trio.open_nursery() as nursery:
        info = await nursery.start(run_node, config)  # NodeInfo: id, redis_url, ws_url

The names below are imported on first use (PEP 562), so that a process which needs one small
module of ``node`` (a warm python worker imports ``node.slot.outcomes``) does not load the
whole node.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from node.config import NodeConfig, default_home, load_config
    from node.daemon import NodeInfo, run_node
    from node.errors import ConfigError, NodeError
    from node.host.home import init_home
    from node.host.homelock import HomeInUse
    from node.host.valkey import ValkeyError

__all__ = [
    "ConfigError",
    "HomeInUse",
    "NodeConfig",
    "NodeError",
    "NodeInfo",
    "ValkeyError",
    "default_home",
    "init_home",
    "load_config",
    "run_node",
]

_HOMES = {
    "ConfigError": "node.errors",
    "HomeInUse": "node.errors",
    "NodeConfig": "node.config",
    "NodeError": "node.errors",
    "NodeInfo": "node.daemon",
    "ValkeyError": "node.errors",
    "default_home": "node.config",
    "init_home": "node.host.home",
    "load_config": "node.config",
    "run_node": "node.daemon",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'node' has no attribute {name!r}")
    return getattr(import_module(home), name)

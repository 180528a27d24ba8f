"""The ``[console]`` table of config.toml: where the web console listens, who may act.

Kept apart from the console's code so that reading a configuration never imports the web
stack.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import tomli_w

from node.errors import ConfigError

# ``hero-node init`` puts a node's console this far above its websocket port (7700 -> 7780),
# so that nodes initialised with their own ports on one machine get their own consoles too.
CONSOLE_PORT_OFFSET: Final = 80
LOOPBACK_NAMES: Final = frozenset({"localhost"})


@dataclass(frozen=True)
class ConsoleConfig:
    """``listen``: "host:port" ("" keeps the console off; port 0 takes a free port);
    ``allow_remote``: the explicit opt-in a non-loopback host needs; ``token``: enables the
    operator actions (dlq retry/purge) for whoever presents it ("" : read-only);
    ``chart_every_s``: the charts' resolution (they keep 120 points: 10 min at 5 s)."""

    listen: str = ""
    allow_remote: bool = False
    token: str = ""
    chart_every_s: float = 5.0

    @property
    def enabled(self) -> bool:
        return bool(self.listen)

    def address(self) -> tuple[str, int]:
        """(host, port) of ``listen``; ConfigError if it is not "host:port"."""
        host, sep, port = self.listen.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ConfigError(
                f'[console] listen wants "host:port" (e.g. "127.0.0.1:7780"), got {self.listen!r}'
            )
        return host, int(port)


def default_listen(listen_port: int) -> str:
    """The console address ``hero-node init`` writes for a node listening on ``listen_port``
    (a free port when that one is chosen by the system too)."""
    port = listen_port + CONSOLE_PORT_OFFSET if listen_port else 0
    return f"127.0.0.1:{port}"


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_TYPES: Final[dict[str, type | tuple[type, ...]]] = {
    "listen": str,
    "allow_remote": bool,
    "token": str,
    "chart_every_s": (int, float),
}
# the charts' resolution: finer reads stats:jobs more often, coarser shows little
CHART_EVERY_S: Final = (0.5, 60.0)


def parse_console(raw: object) -> ConsoleConfig:
    """The ``[console]`` table as a ConsoleConfig; ConfigError names what is wrong (an unknown
    or mistyped setting, a malformed address, a non-loopback host without ``allow_remote``)."""
    if not isinstance(raw, Mapping):
        raise ConfigError("[console] must be a table")
    unknown = set(raw) - set(_TYPES)
    if unknown:
        raise ConfigError(f"unknown [console] setting(s): {', '.join(sorted(unknown))}")
    for name, kind in _TYPES.items():
        if name in raw and not isinstance(raw[name], kind):
            raise ConfigError(f"[console] {name} has the wrong type ({raw[name]!r})")
    console = ConsoleConfig(**raw)
    check_console(console)
    return console


def check_console(console: ConsoleConfig) -> None:
    """ConfigError unless ``console`` may be served as configured."""
    if not console.enabled:
        return
    low, high = CHART_EVERY_S
    every = console.chart_every_s
    if isinstance(every, bool) or not low <= every <= high:
        raise ConfigError(f"[console] chart_every_s wants seconds from {low} to {high}: {every!r}")
    host, _port = console.address()
    if not is_loopback(host) and not console.allow_remote:
        raise ConfigError(
            f"[console] listen {console.listen} is not a loopback address: the console shows "
            "the node's jobs and their output to whoever reaches it; set allow_remote = true "
            "in [console] to serve it there anyway"
        )


def render_console(console: ConsoleConfig) -> str:
    """The ``[console]`` table ``hero-node init`` writes, commented."""
    table = {"listen": console.listen, "allow_remote": console.allow_remote}
    return (
        "# the web console (http://<listen>/): live view of this node, its peers, queues, jobs,\n"
        '# flows and dlq. listen = "" turns it off; a non-loopback host needs allow_remote =\n'
        '# true; token = "<a long random string>" enables dlq retry/purge for whoever gives it\n'
        + tomli_w.dumps({"console": table | ({"token": console.token} if console.token else {})})
    )

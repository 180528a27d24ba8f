"""The node's HTTP server: hypercorn's trio worker serving the console app (console.py) on a
socket bound here, so that a port in use is one clear error and port 0 reports the port taken.
"""

from __future__ import annotations

import logging
import socket
from typing import Any, Final

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from bus.wire.transport import Transport
from node.config.console import ConsoleConfig
from node.errors import ListenError
from node.host.ports import cannot_listen
from node.links.summary import SummaryDesk
from node.observe.sampler import Sampler, node_reader
from node.state import NodeState
from node.web.console import LOOPBACK_HOSTS, Console, build_app
from node.web.feed import Feed
from node.web.grid import Grid
from node.web.timeline import Tracer

log = logging.getLogger(__name__)

# hypercorn's own log: its errors (a failing request) reach the node's log, its banner
# ("Running on ..., CTRL + C to quit") does not, as the node says where its console is
HTTP_LOG: Final = logging.getLogger("node.web.http")
HTTP_LOG.setLevel(logging.WARNING)
BACKLOG: Final = 64  # a console has a few readers, not a crowd
GRACEFUL_S: Final = 1.0  # open feeds are streams that never end by themselves
GRID_WAIT_S: Final = 3.0  # a peer's summary later than this waits for the next round
TRACE_WAIT_S: Final = 5.0  # a peer's part of a timeline later than this is named as missing


class ConsoleError(ListenError):
    """The console cannot be served (its address cannot be bound)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); ConsoleError says why not, in one line."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, address = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ConsoleError(f"console: cannot listen on {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        what, setting = "console:", "[console] listen"
        raise ConsoleError(cannot_listen(what, host, port, setting, exc.errno)) from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def run_console(
    node: NodeState,
    transport: Transport,
    summaries: SummaryDesk,
    config: ConsoleConfig,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the console, sample the node for its charts and ask its peers for their summaries
    (``summaries``: the link handler's desk, which also tells peers this node's charts), until
    cancelled; reports its URL (``http://host:port``) once it is bound and listening. Raises
    ConsoleError if the address cannot be bound."""
    host, port = config.address()
    sock = bind(host, port)
    url = url_of(sock)
    hypercorn = HypercornConfig()
    hypercorn.accesslog = None
    hypercorn.errorlog = HTTP_LOG
    hypercorn.graceful_timeout = GRACEFUL_S
    hosts = None if config.allow_remote else LOOPBACK_HOSTS | {host.lower()}
    sampler = Sampler(node_reader(node), config.chart_every_s)
    summaries.sampler = sampler
    grid = Grid(summaries, transport, config.chart_every_s, GRID_WAIT_S)
    tracer = Tracer.of_home(node, TRACE_WAIT_S)
    console = Console(Feed(node, transport, sampler, grid), config.token, hosts, tracer)
    starlette: Any = build_app(console)  # an ASGI app
    app = wrap_app(starlette, 0, "asgi")
    with sock:
        async with trio.open_nursery() as nursery:
            await nursery.start(sampler.run)
            await nursery.start(grid.run)
            # worker_serve (what hypercorn.trio.serve runs) takes sockets bound beforehand:
            # serve() binds its own, and would report a port in use as a traceback
            await nursery.start(
                lambda task_status: worker_serve(
                    app, hypercorn, sockets=Sockets([], [sock], []), task_status=task_status
                )
            )
            mode = "operator actions with the token" if config.token else "read-only"
            log.info("console on %s (%s)", url, mode)
            task_status.started(url)

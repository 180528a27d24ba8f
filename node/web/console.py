"""The console's web app (Starlette): the page, its live feed, and the operator actions.

Routes:
    GET  /                 the page (static/index.html; it draws everything from the feed)
    GET  /static/...       its script and style
    GET  /api/state        one snapshot (feed.py) as JSON
    GET  /api/events       the live feed: server-sent events, one ``state`` event per change
    GET  /api/charts       the charts' series alone (node/observe/sampler.py), as JSON
    GET  /api/trace        ?context=n&key=...: one job's, message's or flow's hop timeline
                           (the document of ``hero-node job trace --json``; timeline.py)
    GET  /metrics          Prometheus exposition (node/observe/metrics.py)
    POST /api/dlq/retry    {"context": n, "key": "..."}: re-drive a dead letter  (token)
    POST /api/dlq/purge    {"context": n, "key": "..." or null}: delete dead letters (token)

Read-only unless ``[console] token`` is set; an action then needs ``Authorization: Bearer
<token>``, compared in constant time. The token lives in the operator's browser tab only (the
page asks for it): no response ever carries it.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from bus.errors import BusError
from node.observe.metrics import exposition
from node.web.feed import Feed
from node.web.timeline import Tracer

log = logging.getLogger(__name__)

STATIC_DIR: Final = Path(__file__).with_name("static")
FEED_INTERVAL_S: Final = 1.0  # a page hears of a change within about this long
KEEPALIVE_S: Final = 15.0  # an idle feed sends a comment this often (proxies, dead peers)
# the page loads only its own script and style, and talks only to this server
HEADERS: Final = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


LOOPBACK_HOSTS: Final = frozenset({"localhost", "127.0.0.1", "::1"})


class Console:
    """The app's state: the node's feed, the operator token ("" : read-only) and the host
    names a request may name (None: any)."""

    def __init__(
        self,
        feed: Feed,
        token: str,
        hosts: frozenset[str] | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.feed = feed
        self._token = token.encode()
        self.hosts = hosts
        self.tracer = tracer  # timelines (timeline.py); None: /api/trace answers 404

    def host_allowed(self, request: Request) -> bool:
        """Whether the request names a host this console answers for. A console on loopback
        answers only for loopback names: a web page whose DNS name was rebound to 127.0.0.1
        would otherwise read the node's jobs from the operator's own browser."""
        if self.hosts is None:
            return True
        host = request.headers.get("host", "")
        name = host.rpartition("]")[0].lstrip("[") if host.startswith("[") else host.split(":")[0]
        return name.lower() in self.hosts

    @property
    def actions(self) -> bool:
        return bool(self._token)

    def authorised(self, request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if not self._token or scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), self._token)

    async def state(self) -> dict[str, Any]:
        """A snapshot for the page. Raises StoreError if Redis fails."""
        return await self.feed.snapshot() | {"actions": self.actions}


def build_app(console: Console) -> Starlette:
    """The console's ASGI app."""
    routes = [
        Route("/", _endpoint(console, index)),
        Route("/api/state", _endpoint(console, state)),
        Route("/api/events", _endpoint(console, events)),
        Route("/api/charts", _endpoint(console, charts)),
        Route("/api/trace", _endpoint(console, trace)),
        Route("/api/dlq/retry", _endpoint(console, dlq_retry), methods=["POST"]),
        Route("/api/dlq/purge", _endpoint(console, dlq_purge), methods=["POST"]),
        Route("/metrics", _endpoint(console, metrics)),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    return Starlette(routes=routes)


def _endpoint(console: Console, handler: Any) -> Any:  # noqa: ANN401 - Starlette endpoints
    async def endpoint(request: Request) -> Response:
        if not console.host_allowed(request):
            return _refuse(421, "this console answers only for its own address")
        response: Response = await handler(console, request)
        response.headers.update(HEADERS)
        return response

    return endpoint


async def index(console: Console, request: Request) -> Response:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


async def metrics(console: Console, request: Request) -> Response:
    try:
        body, kind = await exposition(console.feed.node)
    except BusError as exc:
        return Response(f"cannot read the node's Valkey: {exc}\n", status_code=503)
    return Response(body, media_type=kind)


async def state(console: Console, request: Request) -> Response:
    try:
        return JSONResponse(await console.state())
    except BusError as exc:
        return JSONResponse({"error": f"cannot read the node's Valkey: {exc}"}, status_code=503)


async def charts(console: Console, request: Request) -> Response:
    return JSONResponse(console.feed.charts())


async def trace(console: Console, request: Request) -> Response:
    """A timeline: 400 for a bad context or key, 404 if this node holds no record of it."""
    if console.tracer is None:
        return _refuse(404, "this console draws no timelines")
    ctx_text, key = request.query_params.get("context", "1"), request.query_params.get("key", "")
    if not ctx_text.isdigit() or not 0 < int(ctx_text) < console.feed.node.config.valkey_databases:
        return _refuse(400, "context must be a context id (an integer >= 1)")
    try:
        doc = await console.tracer.timeline(int(ctx_text), key)
    except ValueError as exc:
        return _refuse(400, str(exc))
    except BusError as exc:
        return _refuse(503, f"cannot read the node's Valkey: {exc}")
    if doc is None:
        return _refuse(404, f"no {key[:80]} in context {ctx_text} on this node")
    return JSONResponse(doc)


async def events(console: Console, request: Request) -> Response:
    return StreamingResponse(_feed(console), media_type="text/event-stream")


async def _feed(console: Console) -> AsyncIterator[str]:
    """A ``state`` event whenever the snapshot changed (its clock aside), a ``trouble`` event
    while Valkey cannot be read, a comment when nothing was sent for KEEPALIVE_S. Ends when
    the page goes away (Starlette cancels it)."""
    last, quiet_since = "", trio.current_time()
    while True:
        try:
            snapshot = await console.state()
            compared = json.dumps(snapshot | {"now": 0}, separators=(",", ":"))
            if compared != last:
                last = compared
                yield f"event: state\ndata: {json.dumps(snapshot, separators=(',', ':'))}\n\n"
                quiet_since = trio.current_time()
        except BusError as exc:
            last = ""  # the first snapshot after an outage is sent whatever it holds
            yield f"event: trouble\ndata: {json.dumps(str(exc))}\n\n"
            quiet_since = trio.current_time()
        if trio.current_time() - quiet_since >= KEEPALIVE_S:
            yield ": keep-alive\n\n"
            quiet_since = trio.current_time()
        await trio.sleep(FEED_INTERVAL_S)  # a rate limit, not a wait for state


# -- operator actions --------------------------------------------------------------------------


async def _action_input(
    console: Console, request: Request, *, key_required: bool
) -> tuple[int, str | None] | Response:
    """(context, key) of an authorised action, or the response that refuses it."""
    if not console.actions:
        return _refuse(403, "the console is read-only: set [console] token to allow actions")
    if not console.authorised(request):
        return _refuse(401, "a valid token is needed (Authorization: Bearer <token>)")
    try:
        body = await request.json()
    except ValueError:
        return _refuse(400, "the body must be JSON")
    if not isinstance(body, dict):
        return _refuse(400, "the body must be a JSON object")
    ctx, key = body.get("context"), body.get("key")
    if not isinstance(ctx, int) or isinstance(ctx, bool) or ctx < 1:
        return _refuse(400, "context must be a context id (an integer >= 1)")
    if not (isinstance(key, str) and key) and (key_required or key is not None):
        return _refuse(400, "key must be the dead-lettered key (a non-empty string)")
    if ctx not in await console.feed.node.store.context_ids():
        return _refuse(404, f"this node serves no context {ctx}")
    return ctx, key


def _refuse(status: int, error: str) -> Response:
    return JSONResponse({"error": error}, status_code=status)


async def dlq_retry(console: Console, request: Request) -> Response:
    parsed = await _action_input(console, request, key_required=True)
    if isinstance(parsed, Response):
        return parsed
    ctx, key = parsed
    assert key is not None
    try:
        count = await console.feed.node.store.retry_dead_letter(ctx, key)
    except BusError as exc:
        return _refuse(503, f"cannot write the node's Valkey: {exc}")
    log.info("console: dlq retry %s (context %d): %d re-driven", key, ctx, count)
    return JSONResponse({"retried": count})


async def dlq_purge(console: Console, request: Request) -> Response:
    parsed = await _action_input(console, request, key_required=False)
    if isinstance(parsed, Response):
        return parsed
    ctx, key = parsed
    try:
        count = await console.feed.node.store.purge_dead_letters(ctx, key)
    except BusError as exc:
        return _refuse(503, f"cannot write the node's Valkey: {exc}")
    log.info("console: dlq purge %s (context %d): %d deleted", key or "(all)", ctx, count)
    return JSONResponse({"purged": count})

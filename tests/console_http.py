"""Talking HTTP to a node's web console from a trio test: the standard library's client in a
worker thread (the console is served by the node in the test's own trio loop)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import trio


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of GET ``url``."""
    return await trio.to_thread.run_sync(_request, url, None, headers or {})


async def post(url: str, body: object, token: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    status, _, raw = await trio.to_thread.run_sync(
        _request, url, json.dumps(body).encode(), headers
    )
    return status, json.loads(raw)


def _request(url: str, data: bytes | None, headers: dict[str, str]) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def next_state(
    url: str, until: Callable[[dict[str, Any]], bool], raw: list[str] | None = None
) -> dict[str, Any]:
    """Follow the live feed at ``url`` (/api/events) until a ``state`` event satisfies
    ``until``; return it. Every line read is appended to ``raw`` if given. Bound the call
    with trio.fail_after: the thread reading the stream ends when its socket times out."""
    return await next_event(url, "state", until, raw)


async def next_event(
    url: str, name: str, until: Callable[[Any], bool], raw: list[str] | None = None
) -> Any:  # noqa: ANN401 - an event's JSON data
    """The data of the first event ``name`` of the feed at ``url`` that satisfies ``until``."""
    return await trio.to_thread.run_sync(_follow, url, name, until, raw, abandon_on_cancel=True)


def _follow(url: str, name: str, until: Callable[[Any], bool], raw: list[str] | None) -> Any:  # noqa: ANN401
    with urllib.request.urlopen(url, timeout=30) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        event, data = "", ""
        for line in stream:
            text = line.decode().rstrip("\n")
            if raw is not None:
                raw.append(text)
            if text.startswith("event: "):
                event = text[len("event: ") :]
            elif text.startswith("data: "):
                data = text[len("data: ") :]
            elif not text and event == name:
                value = json.loads(data)
                if until(value):
                    return value
    raise AssertionError("the feed ended")

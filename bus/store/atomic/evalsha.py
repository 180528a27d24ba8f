"""Several scripts by their hash on one connection: pipelined ``EVALSHA``s, and the one reload
of the scripts the server does not know.

A fresh or restarted server (or one told ``SCRIPT FLUSH``) answers ``NOSCRIPT`` to a hash it
has not loaded, and nothing of that call ran. coredis's own pipeline asks ``SCRIPT EXISTS``
before every pipeline that runs a Script (one more round trip each time); here the bare
``EVALSHA``s go first and only the calls answered ``NOSCRIPT`` are loaded and run again.

Both pipelined paths run through :func:`evalsha_on`: :meth:`Store.scripts` on a connection it
takes for the batch, :meth:`Barrier.scripts_and_wait` on the connection it holds for the
``WAITAOF`` that must follow these writes (bus/store/durable.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import coredis.exceptions

from bus.errors import StoreError

if TYPE_CHECKING:
    from coredis.commands.script import Script

ScriptCall = tuple["Script[str]", list[str], list[str]]  # (script, keys, args)


def send_evalshas(
    connection: Any,  # noqa: ANN401 - a coredis connection the caller holds
    calls: Sequence[ScriptCall],
) -> list[Any]:
    """Send the calls' ``EVALSHA``s on ``connection`` (pipelined, behind whatever was sent
    there before); their pending replies, for :func:`evalsha_on`."""
    return [
        connection.create_request(b"EVALSHA", script.sha, len(names), *names, *args)
        for script, names, args in calls
    ]


async def read_replies(pending: Sequence[Any]) -> list[Any]:
    """Every pending reply of a pipeline, in order, an error reply as its exception (not
    raised): each one is read, so that the connection is left with nothing unread, before the
    caller raises what it must."""
    out: list[Any] = []
    for reply in pending:
        try:
            out.append(await reply)
        except coredis.exceptions.RedisError as exc:
            out.append(exc)
    return out


async def evalsha_on(
    connection: Any,  # noqa: ANN401 - a coredis connection the caller holds
    calls: Sequence[ScriptCall],
    url: str,
    sent: list[Any] | None = None,
) -> list[Any]:
    """Each call's reply, decoded as the connection decodes (as a coredis pipeline's
    ``evalsha`` would return it), the calls' ``EVALSHA``s pipelined on ``connection``
    (``sent``: their pending replies, when :func:`send_evalshas` sent them already).

    Those the server answered NOSCRIPT are run again on it after the others, in their order,
    once their scripts are loaded there (so calls of one script, as a delivery's, are all run
    again: the server knows a script or not). Every call runs once whatever the server's
    script cache held; then the first error, by position, is raised: StoreError (``url``
    names the server) if a script is still unknown after its ``SCRIPT LOAD``, else the
    script's coredis error, for the caller's translation."""

    def unknown(result: object) -> bool:
        return isinstance(result, coredis.exceptions.NoScriptError)

    results = await read_replies(send_evalshas(connection, calls) if sent is None else sent)
    missing = [i for i, r in enumerate(results) if unknown(r)]
    if missing:
        for script in {calls[i][0] for i in missing}:
            await connection.create_request(b"SCRIPT", b"LOAD", script.script)
        again = await read_replies(send_evalshas(connection, [calls[i] for i in missing]))
        for i, r in zip(missing, again, strict=True):
            results[i] = r
    for call, r in zip(calls, results, strict=True):
        if unknown(r):  # e.g. flushed again in between, or a sha that is not its text's
            raise StoreError(
                f"redis {url}: script {call[0].sha} still missing after SCRIPT LOAD"
            ) from r
        if isinstance(r, coredis.exceptions.RedisError):
            raise r
    return results

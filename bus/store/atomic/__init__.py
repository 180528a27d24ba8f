"""The one layer of atomic Valkey scripts: their texts, and the one way their calls are run.

Every Lua script of the project lives in ``bus/store/atomic/lua/<name>.lua``, with a header comment
that states its KEYS, its ARGV and its atomic effect, and is run through a named, typed method
of a module of this package; nothing above ``bus/`` builds a script or a command by hand.
Several calls at once go pipelined by hash through :func:`evalsha_on`, the one reload of the
scripts a server answers ``NOSCRIPT`` to, for plain and durable batches alike.

A script may start with ``-- include: <name>`` lines: the named fragment (a ``.lua`` file of
shared local functions, such as the attempt fence) is placed there, so a rule that several
scripts enforce is written once; a fragment that several parts of one script include is placed
once, where it is first included (:func:`sources`). ``${NAME}`` in a script is replaced by the
value of that name in :data:`CONSTANTS`: the job statistics' key and buckets
(``stats_jobs.lua``), the type breakers' key and the reasons that are no verdict on a type
(``type_breaker.lua``), named once in Python.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coredis.commands.script import Script

from bus.core import keys
from bus.core.reasons import Reason
from bus.core.stats import STATS_BUCKETS_S
from bus.errors import StoreError

__all__ = [
    "BREAKER_NEUTRAL",
    "CONSTANTS",
    "ScriptCall",
    "evalsha_on",
    "read_replies",
    "script",
    "send_evalshas",
    "source",
    "sources",
]

ScriptCall = tuple["Script[str]", list[str], list[str]]  # (script, keys, args)

_INCLUDE = re.compile(r"^-- include: ([a-z0-9_]+)\s*$", re.MULTILINE)
_CONSTANT = re.compile(r"\$\{([A-Z_]+)\}")

# A failed attempt whose reason's token is one of these is no verdict on its script type (a
# refusal, a stop): every reason but a timeout and a lost runner (type_breakers.py).
BREAKER_NEUTRAL = tuple(r.value for r in Reason if r not in (Reason.TIMEOUT, Reason.RUNNER_LOST))
CONSTANTS = {
    "TYPE_BREAKERS_KEY": keys.TYPE_BREAKERS,
    "BREAKER_NEUTRAL": "{" + ", ".join(f"['{r}'] = true" for r in BREAKER_NEUTRAL) + "}",
    "STATS_KEY": keys.STATS_JOBS,
    "STATS_BUCKETS": "{" + ", ".join(f"'{b}'" for b in STATS_BUCKETS_S) + "}",
    "QUOTA_DEPTH_KEY": keys.QUOTA_DEPTH,
    "QUOTA_COUNTED": keys.QUOTA_COUNTED,
    "QUOTA_WAITING_KEY": keys.QUOTA_WAITING,
    "QUOTA_WAIT_PREFIX": keys.QUOTA_WAIT_PREFIX,
    "QUOTA_WAKE_KEY": keys.QUOTA_FAIR_WAKE,
    "QUOTA_NEXT_KEY": keys.QUOTA_FAIR_NEXT,
    "REPLAY_KEY": keys.REPLAY,
}


@cache
def source(name: str, shared: tuple[str, ...] = ()) -> str:
    """The text of ``lua/<name>.lua`` with its includes expanded: :func:`sources`."""
    return sources((name,), shared)


@cache
def sources(names: tuple[str, ...], shared: tuple[str, ...] = ()) -> str:
    """The texts of ``names``, one after the other, with their includes expanded: each
    fragment once in all, where it is first included (a later include of it, by a script or by
    another fragment, finds its functions defined above, and a fragment's state, such as a
    batch being collected, is one for the whole script). Except ``shared`` and what they
    include: a script made of several parts (``runs.then_source``) places those fragments once
    above all of them (``sources(shared)``), so that their per-script caches (the ``TIME`` of
    stats_jobs, the type breakers type_breaker read) and batches serve every part."""
    placed: set[str] = set()
    for fragment in shared:
        _expand(fragment, placed)
    texts = [_expand(name, placed) for name in names if name not in placed]
    return _CONSTANT.sub(lambda m: CONSTANTS[m.group(1)], "\n".join(texts))


def _expand(name: str, placed: set[str]) -> str:
    """``lua/<name>.lua`` with each include not in ``placed`` replaced by its text (expanded
    the same way) and added to ``placed``; the others dropped."""

    def place(include: re.Match[str]) -> str:
        fragment = include.group(1)
        if fragment in placed:
            return ""
        placed.add(fragment)
        return _expand(fragment, placed)

    placed.add(name)
    text = resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")
    return _INCLUDE.sub(place, text)


@cache
def script(name: str) -> Script[str]:
    """The script ``lua/<name>.lua`` (loaded once; run with EVALSHA, loaded on NOSCRIPT).
    coredis is imported here, not above (nor in the runners of calls below): runner processes
    read :func:`source` without it."""
    from coredis.commands.script import Script

    return Script(script=source(name))


# -- running calls: pipelined EVALSHAs, and the one reload of the scripts a server lacks -------
#
# A fresh or restarted server (or one told ``SCRIPT FLUSH``) answers ``NOSCRIPT`` to a hash it
# has not loaded, and nothing of that call ran. coredis's own pipeline asks ``SCRIPT EXISTS``
# before every pipeline that runs a Script (one more round trip each time); here the bare
# ``EVALSHA``s go first and only the calls answered ``NOSCRIPT`` are loaded and run again.
# Both pipelined paths run through evalsha_on: Store.scripts on a connection it takes for the
# batch, Barrier.scripts_and_wait on the connection it holds for the ``WAITAOF`` that must
# follow these writes (bus/store/durable.py).


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
    from coredis.exceptions import RedisError

    out: list[Any] = []
    for reply in pending:
        try:
            out.append(await reply)
        except RedisError as exc:
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
    from coredis.exceptions import NoScriptError, RedisError

    results = await read_replies(send_evalshas(connection, calls) if sent is None else sent)
    missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
    if missing:
        for script in {calls[i][0] for i in missing}:
            await connection.create_request(b"SCRIPT", b"LOAD", script.script)
        again = await read_replies(send_evalshas(connection, [calls[i] for i in missing]))
        for i, r in zip(missing, again, strict=True):
            results[i] = r
    for call, r in zip(calls, results, strict=True):
        if isinstance(r, NoScriptError):  # flushed again in between, or a sha not its text's
            raise StoreError(
                f"redis {url}: script {call[0].sha} still missing after SCRIPT LOAD"
            ) from r
        if isinstance(r, RedisError):
            raise r
    return results

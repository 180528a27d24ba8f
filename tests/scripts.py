"""Job scripts for tests: they announce themselves on a Redis list, so a test can wait for
"the script is running" with a blocking pop instead of polling."""

from __future__ import annotations

import trio

_ANNOUNCE = """\
import os, socket
def _announce(port, key):
    val = str(os.getpid())
    parts = [b"SELECT", b"1", b"LPUSH", key.encode(), val.encode()]
    def cmd(*args):
        return b"*%d\\r\\n" % len(args) + b"".join(b"$%d\\r\\n%s\\r\\n" % (len(a), a) for a in args)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(cmd(*parts[:2]) + cmd(*parts[2:]))
        s.recv(100)
"""


def announcing(redis_url: str, key: str, body: str) -> str:
    """A python script that LPUSHes its pid on ``key`` (DB 1), then runs ``body``."""
    port = int(redis_url.rsplit(":", 1)[1])
    return f"{_ANNOUNCE}_announce({port}, {key!r})\n{body}"


async def wait_announced(store, key: str, timeout_s: float = 20) -> int:
    """The pid a script announced on ``key`` (blocking pop, bounded)."""
    with trio.fail_after(timeout_s):
        popped = await store.call(1, lambda r: r.blpop([key], timeout=timeout_s))
    assert popped is not None, f"no script announced itself on {key}"
    return int(popped[1])

"""What the node says when it cannot listen on a port: which port, for what, and the fix.

Every port the node binds comes from one setting of config.toml (the link listener's
``listen_port``, the console's ``[console] listen``, the embedded Valkey's ``valkey_port``);
the commonest mistake is a second node, or another program, on the same port.
"""

from __future__ import annotations

import errno

from node.errors import ListenError

_WHY = {
    errno.EADDRINUSE: "the port is in use",
    errno.EACCES: "a port below 1024 needs root",
    errno.EADDRNOTAVAIL: "this machine has no such address",
}


# what each setting takes instead of a port in use
_INSTEAD = {
    "listen_port": "a free port (0: any free one)",
    "valkey_port": "a free port (0: the unix socket only)",
    "[console] listen": 'a free host:port ("127.0.0.1:0": any free port; "": no console)',
}


def cannot_listen(what: str, host: str, port: int, setting: str, code: int | None) -> str:
    """The one line for ``what`` failing to bind ``host``:``port`` with errno ``code``."""
    why = _WHY.get(code or 0, errno.errorcode.get(code or 0, "cannot bind"))
    fix = f"set {setting} in config.toml to {_INSTEAD.get(setting, 'a free port')}"
    if code == errno.EADDRINUSE:
        fix = (
            f"stop what listens there (ss -ltnp 'sport = :{port}' names it; another node?), "
            f"or {fix}"
        )
    return f"{what} cannot listen on {host}:{port}: {why}; {fix}"


def listen_error(what: str, host: str, port: int, setting: str, exc: OSError) -> ListenError:
    """:func:`cannot_listen` for an OSError of bind(), as the error that stops the node."""
    return ListenError(cannot_listen(what, host, port, setting, exc.errno))

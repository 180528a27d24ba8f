"""Redis URLs with and without credentials (``redis://``, ``rediss://``, ``unix://``).

A URL with a password is handed only to what connects; logs, errors and published facts get
:func:`redact`'s form.
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit, urlunsplit


def with_credentials(url: str, user: str, password: str) -> str:
    """``url`` authenticating as ``user`` (``unix://user:pass@/path/to.sock`` for a socket)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


def redact(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}" if user else host))


# -- node link addresses (ws:// and wss://) ------------------------------------------------------

LINK_SCHEMES = ("ws", "wss")


def bare_host(host: str) -> str:
    """``host`` without the brackets an IPv6 address wears in a URL (``[::1]`` -> ``::1``), the
    form a listener binds to."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def link_url(scheme: str, host: str, port: int) -> str:
    """The URL peers dial to reach a listener on ``host``:``port``: an IPv6 address (a Mycelium
    overlay address, ``::1``) goes in brackets, ``ws://[::1]:7700``, as RFC 3986 requires."""
    bare = bare_host(host)
    return f"{scheme}://[{bare}]:{port}" if ":" in bare else f"{scheme}://{bare}:{port}"


def check_link_url(address: str) -> str:
    """``address`` if it is a URL a node can dial (``ws://host:port`` or ``wss://host:port``,
    an IPv6 host in brackets, nothing after the port); "" stays "" (a peer that only dials
    us). The one check of a peer's address, for ``peer add`` and ``Client.add_peer``.

    Raises:
        ValueError: what is wrong and the form to use.
    """
    if not address:
        return address
    try:
        parts = urlsplit(address)
        parts.port  # noqa: B018 - parsing the port is the check (":1:7700" is no port)
    except ValueError as exc:
        hint = " (write an IPv6 address in brackets: ws://[::1]:7700)" if "::" in address else ""
        raise ValueError(f"{address!r} is not a ws://host:port URL: {exc}{hint}") from None
    if parts.scheme not in LINK_SCHEMES or not parts.hostname:
        raise ValueError(
            f"{address!r} is not a ws://host:port or wss://host:port URL "
            "(an IPv6 host goes in brackets: ws://[::1]:7700)"
        )
    if not parts.port:
        raise ValueError(f"{address!r}: the port is missing (ws://host:port)")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"{address!r}: only ws://host:port, nothing after it")
    return address

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

"""Where the store is when Sentinels name it: the ``redis+sentinel://`` URL.

One URL carries everything a process needs to find the primary of a replicated store and to
know what "durable" means there, so that the node, its CLI, clients (``bus.open_client``),
runner processes and external runners, which all take a Redis URL, take this one too::

    redis+sentinel://USER:PASSWORD@HOST:PORT[,HOST:PORT...]/SERVICE[?waitaof=L,R&waitaof_timeout_ms=T&promise=P]

- ``HOST:PORT``: the Sentinels (at least one must answer; three or more in production);
- ``SERVICE``: the name they monitor the primary under (``sentinel monitor SERVICE ...``);
- ``USER``/``PASSWORD``: the ACL user, the same on the data servers and on the Sentinels
  (node/host/replicated.py makes both);
- ``waitaof=L,R``: a promise (a link's ack, a client's submit) is given once ``WAITAOF L R``
  confirms the writes behind it fsynced locally (L = 1) and on R replicas; default ``1,1``;
  ``0,0`` gives promises without waiting (as the embedded single Valkey does);
- ``waitaof_timeout_ms``: how long that may take before the promise is refused (default 1000);
- ``promise``: ``every-replica`` (the default: R is raised to every replica the Sentinels know)
  or ``one-replica`` (R as given, weaker: bus/store/promise.py says what each holds).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, unquote

from bus.store.promise import EVERY_REPLICA, PROMISES

SCHEME = "redis+sentinel"

# The first WAITAOF's timeout (the server checks it on its clock ticks, 100 ms apart at the
# default hz 10), before a second one asks the replicas again (bus/store/durable.py says why).
FIRST_WAIT_MS = 10

# A WAITAOF unanswered NUDGE_AFTER_S after it was sent is nudged (bus/store/durable.py says why
# and how): quiet, a replica has fsynced by then (a lone WAITAOF: 0.4 ms at the median). Again
# while it stays unanswered, each gap twice the last, up to NUDGE_GAP_MAX_S: a replica stopped
# for long is asked ~60 times a second, no more.
NUDGE_AFTER_S = 0.001
NUDGE_GAP_MAX_S = 0.016
NUDGES_AT_ONCE = 4  # nudges awaiting their replies, each on a connection of its own, at most
# WAITAOF 0 N 1 with N above any set's replicas: it blocks (1 ms, until the server's next loop
# after it), and a blocked WAITAOF is what makes the primary ask every replica for its offsets;
# the one such command every role's ACL allows. Its reply says nothing of anyone's writes.
NUDGE: tuple[str | int, ...] = ("WAITAOF", 0, 1_000_000, 1)


def nudge_gaps() -> Iterator[float]:
    """How long a WAITAOF waits unanswered before its first nudge, then between nudges."""
    gap = NUDGE_AFTER_S
    while True:
        yield gap
        gap = min(gap * 2, NUDGE_GAP_MAX_S)


@dataclass(frozen=True)
class SentinelTarget:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    username: str | None
    password: str | None
    waitaof_local: int = 1
    waitaof_replicas: int = 1
    waitaof_timeout_ms: int = 1000
    promise: str = EVERY_REPLICA

    @property
    def durable(self) -> bool:
        return self.waitaof_local > 0 or self.waitaof_replicas > 0

    def waits_ms(self) -> tuple[int, ...]:
        """The timeouts of the WAITAOFs that confirm a write, one after the other while they
        do not: a short one, then the rest of ``waitaof_timeout_ms``."""
        first = min(self.waitaof_timeout_ms, FIRST_WAIT_MS)
        rest = self.waitaof_timeout_ms - first
        return (first, rest) if rest > 0 else (first,)

    def confirmed(self, local: int, replicas: int, wanted: int | None = None) -> bool:
        """Whether a WAITAOF's reply (local and replica fsyncs) is what this URL asks
        (``wanted``: the replicas its promise counts, bus/store/promise.py; by default
        ``waitaof_replicas``)."""
        wanted = self.waitaof_replicas if wanted is None else wanted
        return local >= self.waitaof_local and replicas >= wanted

    def shortfall(self, local: int, replicas: int, wanted: int | None = None) -> str:
        """What a WAITAOF that did not confirm (``local``, ``replicas``) fell short of."""
        wanted = self.waitaof_replicas if wanted is None else wanted
        return (
            f"WAITAOF confirmed {local} local and {replicas} replica fsync(s) in "
            f"{self.waitaof_timeout_ms} ms; {self.waitaof_local} and {wanted} wanted "
            f"(promise {self.promise})"
        )


def is_sentinel_url(url: str) -> bool:
    return url.startswith(SCHEME + "://")


def durability(url: str) -> SentinelTarget | None:
    """What "durable" means at ``url``: its parsed target when it asks for WAITAOF, None for a
    store that is not replicated (a promise is given once the write is answered)."""
    if not is_sentinel_url(url):
        return None
    target = parse_sentinel_url(url)
    return target if target.durable else None


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The Sentinels, service, credentials and durability ``url`` names.

    Raises:
        ValueError: what is wrong with it, and the form to use.
    """
    form = f"{SCHEME}://user:password@host:port[,host:port...]/service"
    if not is_sentinel_url(url):
        raise ValueError(f"not a {SCHEME}:// URL ({form})")
    rest = url[len(SCHEME) + 3 :]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
    service = unquote(path.strip("/"))
    if not service or "/" in service:
        raise ValueError(f"{SCHEME} URL without a service name ({form})")
    hosts: list[tuple[str, int]] = []
    for item in hostlist.split(","):
        host, colon, port = item.rpartition(":")
        if not colon or not port.isdigit() or not host:
            raise ValueError(f"{item!r} is not a Sentinel host:port ({form})")
        hosts.append((host.strip("[]"), int(port)))
    options = {k: v[-1] for k, v in parse_qs(query).items()}
    unknown = set(options) - {"waitaof", "waitaof_timeout_ms", "promise"}
    if unknown:
        raise ValueError(f"unknown {SCHEME} option(s): {', '.join(sorted(unknown))}")
    local, replicas, timeout_ms = 1, 1, 1000
    try:
        if "waitaof" in options:
            local_s, _, replicas_s = options["waitaof"].partition(",")
            local, replicas = int(local_s), int(replicas_s)
        timeout_ms = int(options.get("waitaof_timeout_ms", timeout_ms))
    except ValueError:
        raise ValueError("waitaof=L,R and waitaof_timeout_ms=T take whole numbers") from None
    if local not in (0, 1) or replicas < 0 or timeout_ms < 0:
        raise ValueError("waitaof=L,R: L is 0 or 1, R >= 0; waitaof_timeout_ms >= 0")
    promise = options.get("promise", EVERY_REPLICA)
    if promise not in PROMISES:
        raise ValueError(f"promise is one of {', '.join(PROMISES)}, got {promise!r}")
    return SentinelTarget(
        tuple(hosts), service, username, password, local, replicas, timeout_ms, promise
    )


def sentinel_url(
    sentinels: list[tuple[str, int]],
    service: str,
    username: str = "",
    password: str = "",
    **query: str,
) -> str:
    """The URL of a service behind ``sentinels`` (``query``: waitaof, waitaof_timeout_ms,
    promise)."""
    auth = ""
    if username or password:
        auth = f"{quote(username, safe='')}:{quote(password, safe='')}@"
    hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in sentinels)
    tail = "&".join(f"{k}={v}" for k, v in query.items())
    return f"{SCHEME}://{auth}{hosts}/{quote(service, safe='')}" + (f"?{tail}" if tail else "")

"""A replicated store on this machine: one Valkey primary, its replicas and the Sentinels that
watch them, all from the same ``valkey-server`` binary as the embedded Valkey.

``deploy/testnet.py --replicated`` and the failover tests start one; deploy/compose-replicated.yaml
lays out the same on separate machines. Every server needs a password: the data servers get the
node's ACL (node/host/acl.py) plus two users of their own, ``replica`` (a replica syncing from
the primary) and ``sentinel`` (a Sentinel watching, reconfiguring and promoting); the Sentinels
get ``sentinel`` (they talk to each other) and the node's roles, which may only ask where the
primary is (:func:`sentinel_acl`). Replicas write their AOF with ``appendfsync always``, so that
``WAITAOF`` (bus/store/durable.py) confirms a write fsynced on another machine in about a
millisecond instead of up to a second.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bus.store.sentinel import sentinel_url
from node.errors import ValkeyError
from node.host.acl import CLIENT, NODE, RUNNER, acl_text
from node.host.valkey import (
    READY_MARKER,
    STOP_GRACE_S,
    ValkeySpec,
    find_valkey_binary,
    free_port,
    ping,
    server_env,
)

log = logging.getLogger(__name__)

REPLICA, SENTINEL = "replica", "sentinel"
# how a server that could not bind its port says so; it is then started again on another
ADDRESS_IN_USE = "Address already in use"
PORT_ATTEMPTS = 5
SET_ROLES = (NODE, CLIENT, RUNNER, REPLICA, SENTINEL)

# What a replica needs on its primary, and a Sentinel on every data server (Redis's documented
# minimum for a Sentinel user: watch, publish hellos, reconfigure, promote).
_REPLICA_RULES = "-@all +psync +replconf +ping"
_SENTINEL_RULES = (
    "allchannels -@all +multi +slaveof +replicaof +ping +exec +subscribe +config|rewrite +role "
    "+publish +info +client|setname +client|kill +script|kill"
)
# The node's roles on a Sentinel: find the primary (and its replicas, for ``status``); only
# the node may read the rest (``sentinel masters``, its failover history).
_ASK_PRIMARY = (
    "-@all +auth +hello +ping +role +client|setinfo +client|setname "
    "+sentinel|get-master-addr-by-name +sentinel|replicas +sentinel|sentinels"
)


def _user(name: str, password: str, rules: str) -> str:
    digest = hashlib.sha256(password.encode()).hexdigest()
    return f"user {name} on #{digest} resetchannels resetkeys {rules}"


def data_acl(passwords: dict[str, str]) -> str:
    """The ACL file of each data server (primary or replica: either may be promoted)."""
    return (
        acl_text(passwords)
        + _user(REPLICA, passwords[REPLICA], _REPLICA_RULES)
        + "\n"
        + _user(SENTINEL, passwords[SENTINEL], _SENTINEL_RULES)
        + "\n"
    )


def sentinel_acl(passwords: dict[str, str]) -> list[str]:
    """The ``user`` lines of a Sentinel's configuration."""
    return [
        "user default off resetchannels resetkeys -@all",
        _user(SENTINEL, passwords[SENTINEL], "allchannels +@all"),
        _user(NODE, passwords[NODE], "allchannels +@all"),
        _user(CLIENT, passwords[CLIENT], _ASK_PRIMARY),
        # redis-py's Sentinel client (the runner processes') finds the primary with
        # SENTINEL MASTERS, not GET-MASTER-ADDR-BY-NAME: addresses and flags, no secret
        _user(RUNNER, passwords[RUNNER], _ASK_PRIMARY + " +sentinel|masters"),
    ]


def store_acl(part: str, passwords: dict[str, str], service: str) -> str:
    """What ``hero-node store-acl PART`` prints: ``data``, the ACL file of every data server;
    ``replica``, the lines of each data server's configuration that let it sync from whichever
    is primary; ``sentinel``, the lines of each Sentinel's configuration (after its ``sentinel
    monitor SERVICE ...`` line)."""
    if part == "data":
        return data_acl(passwords)
    if part == "replica":
        return f"masteruser {REPLICA}\nmasterauth {passwords[REPLICA]}\n"
    lines = [
        f"sentinel auth-user {service} {SENTINEL}",
        f"sentinel auth-pass {service} {passwords[SENTINEL]}",
        f"sentinel sentinel-user {SENTINEL}",
        f"sentinel sentinel-pass {passwords[SENTINEL]}",
        *sentinel_acl(passwords),
    ]
    return "\n".join(lines) + "\n"


def data_args(primary: tuple[str, int] | None, passwords: dict[str, str]) -> list[str]:
    """valkey-server arguments beyond :meth:`ValkeySpec.argv` for a member of the set
    (``primary`` None: it starts as the primary)."""
    args = [
        "--appendfsync",
        "always",
        "--masteruser",
        REPLICA,
        "--masterauth",
        passwords[REPLICA],
        # an isolated old primary refuses writes once no replica has acknowledged it for 10 s:
        # what it still takes in that window is what a failover can lose (docs/guarantees)
        "--min-replicas-to-write",
        "1",
        "--min-replicas-max-lag",
        "10",
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
    ]
    if primary is not None:
        args += ["--replicaof", primary[0], str(primary[1])]
    return args


def sentinel_conf(
    port: int,
    primary: tuple[str, int],
    passwords: dict[str, str],
    *,
    service: str = "hero",
    quorum: int = 2,
    down_after_ms: int = 1000,
    failover_timeout_ms: int = 5000,
    bind: str = "127.0.0.1",
) -> str:
    """A Sentinel's configuration file (it rewrites it as it learns the set)."""
    lines = [
        f"port {port}",
        f"bind {bind}",
        "protected-mode no",
        f"sentinel monitor {service} {primary[0]} {primary[1]} {quorum}",
        f"sentinel down-after-milliseconds {service} {down_after_ms}",
        f"sentinel failover-timeout {service} {failover_timeout_ms}",
        f"sentinel parallel-syncs {service} 1",
    ]
    return "\n".join(lines) + "\n" + store_acl(SENTINEL, passwords, service)


@dataclass
class _Child:
    name: str
    argv: list[str]
    ready: bytes = READY_MARKER  # a Sentinel says "+slave" once per replica it found
    times: int = 1  # how many lines with ``ready`` it writes before it is ready
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=server_env(),
        )
        assert self.proc.stdout is not None
        tail: list[str] = []
        seen = 0
        for raw in iter(self.proc.stdout.readline, b""):
            seen += self.ready in raw
            if seen == self.times:
                threading.Thread(target=_discard, args=(self.proc.stdout,), daemon=True).start()
                return
            tail = (tail + [raw.decode("utf-8", "replace").strip()])[-3:]
        self.proc.wait()
        raise ValkeyError(f"{self.name} exited before it was ready: {' / '.join(tail)}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if not self.running:
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)  # a stopped server cannot act on SIGTERM
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()


def _discard(stream: object) -> None:
    for _ in iter(stream.readline, b""):  # type: ignore[attr-defined]
        pass


@dataclass
class ReplicatedSet:
    """A primary, ``replicas`` replicas and ``sentinels`` Sentinels on 127.0.0.1, free ports."""

    root: Path
    passwords: dict[str, str]
    service: str = "hero"
    replicas: int = 2
    sentinels: int = 3
    down_after_ms: int = 1000
    ports: Callable[[], int] = free_port  # where each server's port comes from
    data_ports: list[int] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)
    data: list[_Child] = field(default_factory=list)
    watchers: list[_Child] = field(default_factory=list)

    def url(self, role: str = NODE, **query: str) -> str:
        """The ``redis+sentinel://`` URL ``role`` connects with (bus/store/sentinel.py)."""
        hosts = [("127.0.0.1", p) for p in self.sentinel_ports]
        return sentinel_url(hosts, self.service, role, self.passwords[role], **query)

    @property
    def sentinel_addresses(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.sentinel_ports]

    def start(self) -> None:
        binary = find_valkey_binary()
        self.root.mkdir(parents=True, exist_ok=True)
        acl = self.root / "data.acl"
        acl.write_text(data_acl(self.passwords))
        acl.chmod(0o600)
        self.data_ports = []
        for i in range(1 + self.replicas):
            primary = None if i == 0 else ("127.0.0.1", self.data_ports[0])
            self._start_data(binary, acl, i, primary)
        self.sentinel_ports = []
        for _ in range(self.sentinels):
            self._start_sentinel(binary, ("127.0.0.1", self.data_ports[0]))

    def _start_data(self, binary: Path, acl: Path, i: int, primary: tuple[str, int] | None) -> None:
        def argv(port: int) -> list[str]:
            spec = self._data_spec(port, i, acl)
            spec.data_dir.mkdir(parents=True, exist_ok=True)
            return spec.argv(binary) + data_args(primary, self.passwords)

        port = self._on_a_free_port("valkey", argv, (READY_MARKER, 1), self.data)
        self.data_ports.append(port)
        if not ping(self._data_spec(port, i, acl)):
            raise ValkeyError(f"valkey {port} does not answer PING")

    def _data_spec(self, port: int, i: int, acl: Path) -> ValkeySpec:
        return ValkeySpec(
            port=port,
            data_dir=self.root / f"valkey-{i}",
            aclfile=acl,
            auth=(NODE, self.passwords[NODE]),
        )

    def _start_sentinel(self, binary: Path, primary: tuple[str, int]) -> None:
        def argv(port: int) -> list[str]:
            conf = self.root / f"sentinel-{port}.conf"
            conf.write_text(
                sentinel_conf(
                    port,
                    primary,
                    self.passwords,
                    service=self.service,
                    down_after_ms=self.down_after_ms,
                )
            )
            conf.chmod(0o600)
            return [str(binary), str(conf), "--sentinel"]

        # ready once it knows every replica: a promise counts the replicas the Sentinels know
        # (bus/store/promise.py), and one asked before it found them would count too few
        found = (b"+slave slave", self.replicas) if self.replicas else (b"+monitor master", 1)
        port = self._on_a_free_port("sentinel", argv, found, self.watchers)
        self.sentinel_ports.append(port)

    def _on_a_free_port(
        self,
        kind: str,
        argv: Callable[[int], list[str]],
        ready: tuple[bytes, int],
        into: list[_Child],
    ) -> int:
        """Start a server on a port from ``ports``, again on another if it finds it taken: a
        probed port is only free until someone else binds it (node/host/valkey.py free_port).
        Its port; the server is in ``into``."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = self.ports()
            child = _Child(f"{kind} {port}", argv(port), *ready)
            into.append(child)
            try:
                child.start()
            except ValkeyError as exc:
                into.remove(child)
                if ADDRESS_IN_USE not in str(exc) or attempt == PORT_ATTEMPTS:
                    raise
                log.warning("%s: port %d was taken before it bound; another port", kind, port)
                continue
            return port
        raise AssertionError("unreachable")  # the loop returns or raises

    def pid_of(self, port: int) -> int:
        for child in self.data:
            if child.name == f"valkey {port}" and child.proc is not None:
                return child.proc.pid
        raise KeyError(port)

    def child(self, port: int) -> _Child:
        return next(c for c in self.data if c.name == f"valkey {port}")

    def restart(self, port: int) -> None:
        """Start the data server of ``port`` again after it died (same port, data and
        arguments: it comes back as it went, and the Sentinels make it a replica)."""
        child = self.child(port)
        if child.running:
            raise ValkeyError(f"valkey {port} is still running")
        child.start()

    def stop(self) -> None:
        """Stop every server this set started, by its PID."""
        for child in [*self.watchers, *self.data]:
            child.stop()


@contextmanager
def replicated_set(root: Path, passwords: dict[str, str], **kw: int) -> Iterator[ReplicatedSet]:
    rs = ReplicatedSet(root, passwords, **kw)  # type: ignore[arg-type]
    try:
        rs.start()
        yield rs
    finally:
        rs.stop()

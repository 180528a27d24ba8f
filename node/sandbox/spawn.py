"""A runner slot's sandboxed worker, from the runner's side: what it is started with
(:class:`SandboxSpec`), how it is started, and the life of the slot's one worker and its
spare (:class:`Worker`: taken, retired, killed, stopped). What a worker is asked to do, job by
job, is node/sandbox/host.py's ``Sandbox``; the worker itself is node/sandbox/inner.py.

Each worker is replaced after at most ``recycle_jobs`` jobs: up to an eighth fewer, drawn when it
starts (:func:`recycle_point`). A node's slots take jobs in turn, so with one count for all
they replaced their workers together, four starts (~85 ms of CPU each) at once on two cores
every ``recycle_jobs`` jobs a slot: a sequential round trip met 10-14 slow ones in a row there
(bench/HISTORY.md#admission-where-job-runs). Drawn apart, they start one at a time.

The runner process holds the runner's credentials; this module starts the worker with exec of
a fresh program (subprocess, close_fds, an empty environment), never by a fork that keeps
running Python.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bus.core.models import dumps_json
from node.sandbox import disk, seccomp
from node.sandbox.cgroups import Leaf, enter_argv
from node.sandbox.limits import Limits, rlimits
from node.sandbox.plan import WORK, HostFacts, SandboxPlan, bwrap_argv
from node.sandbox.reap import end_worker, kill_group, kill_pidfds, pidfds_below, reap_adopted

INNER = str(Path(__file__).with_name("inner.py"))


def _pidns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


_OUTER_PIDNS = _pidns()
STAGGER = random.Random()  # the module's own: a caller's seeded sequence is never drawn from


def recycle_point(recycle_jobs: int, rng: random.Random = STAGGER) -> int:
    """How many jobs a worker runs before it is replaced: ``recycle_jobs``, less a number
    drawn below an eighth of it (so exactly ``recycle_jobs`` below 8)."""
    return recycle_jobs - rng.randrange(recycle_jobs // 8 + 1)


class SandboxLost(Exception):  # noqa: N818 - it is an event
    """The worker ended (killed, or it could not start): the job has no ending of its own."""


@dataclass(frozen=True)
class SandboxSpec:
    """What a runner needs to start its context's sandboxed worker (JSON in the RunnerSpec)."""

    mode: str  # strict, namespaces, none
    work_dir: str
    bwrap: str = "bwrap"
    setpriv: str = "setpriv"
    uid: int = -1
    network: bool = False
    recycle_jobs: int = 1000
    fresh_process: bool = False  # a fresh process per job (else python jobs share a warm one)
    as_root: bool = True
    binds: list[str] = field(default_factory=list)
    dirs: dict[str, str | None] = field(default_factory=dict)  # HostFacts.dirs
    limits: dict[str, int] = field(default_factory=dict)
    # node/sandbox/cgroups.py: {"version": "v1" | "v2", "dirs": {controller: dir}, "prefix"}
    cgroups: dict[str, Any] = field(default_factory=dict)
    disk_quota: bool = False  # the work dir on an image of limits' disk_mb (node/sandbox/disk.py)
    work_dir_policy: str = "keep"  # "per_job": emptied after each job, as /tmp always is

    @functools.cached_property
    def limit_values(self) -> Limits:
        return Limits(**self.limits)

    @property
    def emptied(self) -> list[str]:
        """What the worker empties after each job: the sandbox's /tmp (its own tmpfs), and the
        work dir under ``work_dir = "per_job"``; nothing without a sandbox."""
        if self.mode == "none":
            return []
        return ["/tmp", WORK] if self.work_dir_policy == "per_job" else ["/tmp"]

    def argv(self, seccomp_fd: int, workdir_fd: int, settings: dict[str, Any]) -> list[str]:
        """The worker's command (in its sandbox); ``settings``: what each of its jobs is set up
        with (node/sandbox/inner.py SETTINGS)."""
        way = "--fresh" if self.fresh_process else "--warm"
        given = dumps_json(settings).decode()
        worker = [sys.executable, "-u", INNER, way, _OUTER_PIDNS, given, *self.emptied]
        if self.mode == "none":
            return worker
        plan = SandboxPlan(
            mode=self.mode,
            bwrap=self.bwrap,
            setpriv=self.setpriv,
            work_dir=self.work_dir,
            worker=worker,
            binds=self.binds,
            uid=self.uid,
            network=self.network,
            as_root=self.as_root,
            seccomp_fd=seccomp_fd,
            workdir_fd=workdir_fd,
            tmp_bytes=min(self.limit_values.file_size_mb, 1024) * 1024 * 1024,
        )
        return bwrap_argv(plan, HostFacts(dict(self.dirs)))


def prepare_work_dir(spec: SandboxSpec) -> None:
    """The context's work dir: 0700, owned by the context's uid in strict mode."""
    path = Path(spec.work_dir)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    quota = spec.limit_values.disk_mb
    if spec.disk_quota and quota:
        disk.mount_quota(path, quota, spec.uid)
    path.chmod(0o700)
    # the mode may have changed since it was made: its owner too. Strict without root needs
    # CAP_CHOWN (deploy/hero-node.service); without it strict cannot start, and says so.
    uid = spec.uid if spec.mode == "strict" else os.geteuid()
    st = path.stat()
    if (st.st_uid, st.st_gid) != (uid, uid if spec.mode == "strict" else st.st_gid):
        os.chown(path, uid, uid if spec.mode == "strict" else -1)


def _same_uid_processes() -> int:
    """Processes of this uid now (``namespaces``: the bound on processes counts them too)."""
    me, n = os.getuid(), 0
    for name in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == me:
                n += 1
    return n


@dataclass
class Started:
    """A worker started, its hello not read yet."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    nproc_base: int
    leaf: Leaf | None

    def discard(self, whole: bool) -> None:
        end_worker(self.proc, self.sock, whole, [], leaf=self.leaf)


def spawn(spec: SandboxSpec, stderr: int | None) -> Started:
    """Start a worker (exec of the planned sandbox); it says hello when it is ready."""
    if spec.mode not in ("strict", "namespaces", "none"):
        raise SandboxLost(f"no sandbox can be built (isolation {spec.mode})")
    prepare_work_dir(spec)
    nproc_base = 0
    if spec.mode != "strict" and os.getuid() != 0:
        nproc_base = _same_uid_processes() + 16
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    passed: list[int] = []  # closed here whatever happens: the worker has its own copies
    leaf: Leaf | None = None
    try:
        rfd, wfd = os.pipe()
        passed.append(rfd)
        arch = seccomp.native_arch()
        try:
            if arch is not None:
                os.write(wfd, seccomp.encode(seccomp.program(arch)))  # < a pipe's buffer
        finally:
            os.close(wfd)
        leaf = _leaf(spec)
        wd = -1
        if spec.mode == "strict" and not spec.as_root:
            # O_PATH: the node may not read a dir its context's uid owns 0700, only name it
            wd = os.open(spec.work_dir, os.O_PATH | os.O_DIRECTORY)
            passed.append(wd)
        argv = spec.argv(rfd, wd, _settings(spec, nproc_base, leaf))
        proc = subprocess.Popen(  # noqa: S603 - the planned sandbox
            enter_argv(leaf.procs_files(), argv) if leaf is not None else argv,
            stdin=theirs.fileno(),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            pass_fds=passed,
            env={"LANG": "C.UTF-8"},
            cwd="/",  # the worker enters the work dir (which the node may not)
            start_new_session=True,
        )
    except BaseException:
        ours.close()
        if leaf is not None:
            leaf.remove()
        raise
    finally:
        theirs.close()
        for fd in passed:
            os.close(fd)
    return Started(proc, ours, nproc_base, leaf)


def _settings(spec: SandboxSpec, nproc_base: int, leaf: Leaf | None) -> dict[str, Any]:
    """What every job of a worker is set up with besides its own request: given to the
    worker once, in its argv, not in each request (their JSON, written by the runner and
    parsed by the job process on a lone job's path, was half settings)."""
    cwd = spec.work_dir if spec.mode == "none" else WORK
    return {
        "cwd": cwd,
        "rlimits": rlimits(spec.limit_values, nproc_base, leaf is not None),
        # the worker sweeps its sandbox's processes only in a pid namespace not this one
        "outer_pidns": _OUTER_PIDNS,
    }


def _leaf(spec: SandboxSpec) -> Leaf | None:
    """A new cgroup for a worker, with the job's bounds; None without cgroups. Raises
    SandboxLost if it cannot be made: a job never runs unbounded by accident."""
    cg = spec.cgroups
    if not cg:
        return None
    ctx = int(Path(spec.work_dir).name)
    leaf = Leaf(str(cg["version"]), dict(cg["dirs"]), str(cg["prefix"]), ctx)
    try:
        leaf.create(spec.limit_values)
    except OSError as exc:
        leaf.remove()
        raise SandboxLost(f"cannot make the job's cgroup: {exc}") from None
    return leaf


class Worker:
    """The one warm sandboxed worker of a runner slot (and its spare, near its retirement):
    what ``Sandbox`` (node/sandbox/host.py) runs its jobs in."""

    def __init__(
        self, spec: SandboxSpec, rng: random.Random = STAGGER, stderr: int | None = None
    ) -> None:
        """``stderr``: where bwrap and the worker write theirs (an open fd; None: inherited),
        so that the probe can say why a sandbox did not start."""
        self.spec = spec
        self._stderr = stderr
        self._rng = rng  # draws each worker's recycle_point
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.jobs = 0
        self.recycle_at = spec.recycle_jobs  # this worker's own (recycle_point), drawn at start
        self.nproc_base = 0
        self.uid = -1  # the worker's uid, as it reported it
        self.spare: Started | None = None
        self._killed: list[int] = []  # pidfds a kill took, to reap when the worker is retired
        # the current worker was killed: an answer it sent still counts for nothing (see kill)
        self.was_killed = False
        self.leaf: Leaf | None = None  # the worker's cgroup, if the node has cgroups
        self._lock = threading.Lock()

    @property
    def whole(self) -> bool:
        """Whether a kill must find every process under the worker: with no pid namespace
        to end them all, under isolation "none" (the job process leads its own session)."""
        return self.spec.mode == "none"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def _take(self) -> None:
        """Make the spare (or a worker started now) the current worker, its hello unread."""
        started, self.spare = self.spare, None
        if started is not None and started.proc.poll() is not None:
            started.discard(self.whole)  # died waiting: start another
            started = None
        if started is None:
            started = self._spawn()
        self.proc, self.sock, self.nproc_base = started.proc, started.sock, started.nproc_base
        self.leaf = started.leaf
        self.was_killed = False
        self.jobs = 0
        self.recycle_at = recycle_point(self.spec.recycle_jobs, self._rng)

    def _spawn(self) -> Started:
        return spawn(self.spec, self._stderr)

    def kill(self) -> None:
        """End the sandbox and every process in it now (any thread may call this).

        The job's processes are signalled before the worker, so the worker may live long
        enough to answer for the job the kill ended (killed by SIGKILL), or for one that ended
        just before it: the answer reaches the job's thread, the worker is dead behind it.
        ``was_killed`` tells that thread so (node/sandbox/host.py ``Sandbox.run``: the kill's
        own answer ends the job as a kill), and whoever hands the worker its next job
        (``_retire_spent``: it is retired first)."""
        # under the lock from before the first signal: the job's thread sees the worker die
        # only after one, and its _retire must then find every pidfd taken here (a process it
        # missed stays a zombie of this process, adopted from the pid namespace), while none
        # is closed by a _retire before its signal is sent
        with self._lock:
            proc = self.proc
            if proc is None or proc.returncode is not None:
                return
            self.was_killed = True
            below = pidfds_below(proc.pid, self.whole)
            self._killed += below
            kill_pidfds(below)
            kill_group(proc)
            if self.leaf is not None:  # the tree at once, whatever left the pid namespace's view
                self.leaf.kill()

    def _retire(self, graceful: bool = False) -> None:
        """End and reap the worker (``graceful``: let it exit first, see
        node/sandbox/reap.py ``end_worker``); the next job starts a new one (or takes the
        spare)."""
        with self._lock:
            killed, self._killed = self._killed, []
        if self.proc is not None:
            end_worker(self.proc, self.sock, self.whole, killed, graceful and not killed, self.leaf)
        else:
            reap_adopted(killed)
            if self.sock is not None:
                self.sock.close()
        self.proc, self.sock, self.leaf = None, None, None

    def stop(self, graceful: bool = False) -> None:
        """Kill and reap the worker and its spare. ``graceful``: let the worker exit first, as
        a retirement does (see node/sandbox/reap.py ``end_worker``), so that its jobs' CPU is
        counted in this process: how a runner that leaves (drained, recycled) ends its
        sandbox."""
        self._retire(graceful)
        spare, self.spare = self.spare, None
        if spare is not None:
            spare.discard(self.whole)

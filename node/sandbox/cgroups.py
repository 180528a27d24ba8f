"""A job's whole tree under one bound (docs/security/bounds.md): each sandboxed worker, and so
every process of the job it runs, in a cgroup of its own with a memory bound (the sandbox's
/tmp tmpfs is charged to it too), a process bound and a CPU quota.

Where the node may: cgroup v2 when its own cgroup is a delegated subtree (systemd
``Delegate=yes``: writable, with the memory, pids and cpu controllers), else cgroup v1 when it
may write a memory, a pids and a cpu hierarchy (root on a v1 host). Otherwise the rlimits of
node/sandbox/limits.py are all there is, and ``status`` says so.

A runner makes a leaf per sandboxed worker it starts, ``hero-<node>-<context>-<pid>-<n>``
beside the node's own cgroup in each v1 hierarchy (under the node's ``hero-<node>`` in v2,
which must hand its controllers down), moves the worker's first process there before bwrap
runs (:func:`enter_argv`): no process of the sandbox is ever outside it; and removes the leaf
once the worker has ended. Nothing is left behind but what a killed runner leaves, which the
node removes when it next starts (:func:`sweep`). After a job the runner reads the leaf's
counters (OOM kills, refused forks, its tree's CPU time: node/sandbox/host.py, from the files
:meth:`Leaf.open_counted` holds open), which are facts the job cannot forge, unlike its stderr.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from node.sandbox.inner import kill_and_wait  # the worker's own: pidfds, waited on
from node.sandbox.limits import MB, Limits

CONTROLLERS = ("memory", "pids", "cpu")
# v1 only: the tree's CPU time (``cpuacct.usage``), a hierarchy of its own or the cpu one's
CPUACCT = "cpuacct"
UNIFIED = "unified"  # the key of v2's one directory in Cgroups.dirs
PERIOD_US = 100_000
# processes of a sandbox that are not the job's: bwrap's init, the worker, its job process,
# and a spare's start racing a retirement
SANDBOX_PROCESSES = 4
_SEQ = itertools.count(1)
# ending what a leaf still holds: in all, and rounds (a fork bomb forks while it is killed)
END_WAIT_S = 5.0
END_ROUNDS = 20


@dataclass(frozen=True)
class Cgroups:
    """The node's cgroups: version "v2", "v1" or "" (none), and its directory per controller
    (v2: one, under :data:`UNIFIED`)."""

    version: str = ""
    dirs: dict[str, str] = field(default_factory=dict)
    prefix: str = ""  # of the leaves' names: the node's
    tree_cpu: bool = False  # a leaf counts its tree's CPU time: cpu_s bounds the job's tree

    @property
    def mode(self) -> str:
        """What ``status`` calls the bounds in force."""
        return f"cgroup {self.version}" if self.version else "rlimits"

    @property
    def cpu_time(self) -> str:
        """What ``cpu_s`` bounds here, as ``status`` says it."""
        return "job tree" if self.tree_cpu else "process"


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, file system type, super options) of each cgroup mount."""
    out = []
    for line in Path(mountinfo).read_text().splitlines():
        left, _, right = line.partition(" - ")
        parts, tail = left.split(), right.split()
        if len(parts) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            out.append((parts[3], parts[4], tail[0], set(tail[2].split(","))))
    return out


def _own(proc_cgroup: str) -> dict[str, str]:
    """This process's cgroup path per controller ("" for v2's)."""
    out: dict[str, str] = {}
    for line in Path(proc_cgroup).read_text().splitlines():
        _hid, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            out[name] = path
    return out


def _inside(root: str, point: str, path: str) -> str | None:
    if path != root and not path.startswith(root.rstrip("/") + "/"):
        return None
    return point + path[len(root.rstrip("/")) :]


def _writable(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK)


def find(
    name: str, proc_cgroup: str = "/proc/self/cgroup", mountinfo: str = "/proc/self/mountinfo"
) -> Cgroups:
    """The cgroups the node may bound jobs with, its directories made (``hero-<name>``);
    Cgroups() if none."""
    try:
        mounts, own = _mounts(mountinfo), _own(proc_cgroup)
    except (OSError, ValueError):
        return Cgroups()
    for root, point, kind, _opts in mounts:
        if kind == "cgroup2" and "" in own:
            base = _inside(root, point, own[""])
            if base and _writable(base) and (made := _v2_dir(base, name)):
                # cpu.stat's usage_usec is kept by every v2 cgroup, its controller on or not
                return Cgroups("v2", {UNIFIED: made}, f"hero-{name}-", tree_cpu=True)
    dirs: dict[str, str] = {}
    for controller in (*CONTROLLERS, CPUACCT):
        for root, point, kind, opts in mounts:
            if kind == "cgroup" and controller in opts and controller in own:
                base = _inside(root, point, own[controller])
                if base and _writable(base):
                    dirs[controller] = base
    if not set(CONTROLLERS) <= set(dirs):
        return Cgroups()
    # co-mounted with cpu ("cpu,cpuacct"): the cpu leaf has the counter, and one directory
    # is made once
    tree_cpu = CPUACCT in dirs
    if dirs.get(CPUACCT) == dirs["cpu"]:
        del dirs[CPUACCT]
    return Cgroups("v1", dirs, f"hero-{name}-", tree_cpu)


def _v2_dir(base: str, name: str) -> str:
    """The node's v2 directory under its delegated cgroup ``base``, with the controllers
    enabled for its children ("" if they cannot be). A cgroup that hands controllers down may
    hold no process itself: the processes in ``base`` move to a leaf ``hero-node`` first, but
    only if they are all this process and its children (a unit's, ``Delegate=yes``), never a
    terminal's scope, whose shell is not the node's to move."""
    try:
        have = Path(base, "cgroup.controllers").read_text().split()
        if not set(CONTROLLERS) <= set(have):
            return ""
        enable = " ".join(f"+{c}" for c in CONTROLLERS)
        if not set(CONTROLLERS) <= set(Path(base, "cgroup.subtree_control").read_text().split()):
            procs = [int(p) for p in Path(base, "cgroup.procs").read_text().split()]
            if not all(_ours(pid) for pid in procs):
                return ""
            leaf = Path(base, "hero-node")
            leaf.mkdir(exist_ok=True)
            for pid in map(str, procs):
                with contextlib.suppress(OSError):  # gone meanwhile
                    Path(leaf, "cgroup.procs").write_text(pid)
            Path(base, "cgroup.subtree_control").write_text(enable)
        made = Path(base, f"hero-{name}")
        made.mkdir(exist_ok=True)
        Path(made, "cgroup.subtree_control").write_text(enable)
        return str(made)
    except OSError:
        return ""


def _ours(pid: int, me: int = 0) -> bool:
    """Whether ``pid`` is this process or one of its descendants."""
    me = me or os.getpid()
    for _ in range(64):
        if pid == me:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def sweep(cg: Cgroups) -> None:
    """Remove the empty leaves an earlier run of the node left (a runner killed with its
    worker: nothing else removes them)."""
    for d in cg.dirs.values():
        with contextlib.suppress(OSError):
            for leaf in Path(d).glob(f"{cg.prefix}*"):
                with contextlib.suppress(OSError):
                    leaf.rmdir()


def _possible_cpus() -> int:
    """How many CPUs this machine may ever run processes on at once: those it may bring
    online too (``/sys/devices/system/cpu/possible``: "0-3,6"), else those online now."""
    try:
        with open("/sys/devices/system/cpu/possible") as f:
            spans = [part.partition("-") for part in f.read().strip().split(",")]
        return sum(int(last or first) - int(first) + 1 for first, _, last in spans)
    except (OSError, ValueError):
        return os.cpu_count() or 1


POSSIBLE_CPUS = _possible_cpus()  # what bounds a leaf's CPU time per second (node/sandbox/host.py)


# -- a runner's side: one leaf per sandboxed worker ---------------------------------------------


@dataclass(frozen=True)
class CountFiles:
    """A leaf's counter files, held open from its making to its removal, which node/sandbox/
    host.py reads for each job (one pread each); -1 for one that could not be opened."""

    memory: int = -1  # its OOM kills: memory.events (v2), memory.oom_control (v1)
    pids: int = -1  # its refused forks: pids.events
    cpu: int = -1  # its tree's CPU time: cpu.stat (v2), cpuacct.usage (v1)
    v2: bool = False


class Leaf:
    """The cgroup of one sandboxed worker (and the job it runs)."""

    def __init__(self, version: str, dirs: dict[str, str], prefix: str, ctx: int) -> None:
        name = f"{prefix}{ctx}-{os.getpid()}-{next(_SEQ)}"
        self.version = version
        self.dirs = {c: Path(d, name) for c, d in dirs.items()}
        self.counted = CountFiles()  # opened as it is made (:meth:`open_counted`)

    def _dir(self, controller: str) -> Path:
        return self.dirs[UNIFIED if self.version == "v2" else controller]

    def create(self, limits: Limits) -> None:
        """Make the leaf with the bounds of ``limits`` (OSError if it cannot be), its counter
        files opened."""
        for d in self.dirs.values():
            d.mkdir()
        self._bound(limits)
        self.open_counted()

    def _bound(self, limits: Limits) -> None:
        memory, pids = limits.memory_mb * MB, limits.processes + SANDBOX_PROCESSES
        quota = limits.cpu_percent * PERIOD_US // 100
        if self.version == "v2":
            d = self.dirs[UNIFIED]
            writes = [("memory.max", str(memory)), ("pids.max", str(pids))]
            writes += [("cpu.max", f"{quota} {PERIOD_US}")]
            for name, value in writes:
                (d / name).write_text(value)
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                with contextlib.suppress(OSError):  # a kernel without them
                    (d / name).write_text(str(value))
            return
        (self._dir("memory") / "memory.limit_in_bytes").write_text(str(memory))
        with contextlib.suppress(OSError):  # no swap accounting on this host
            (self._dir("memory") / "memory.memsw.limit_in_bytes").write_text(str(memory))
        (self._dir("pids") / "pids.max").write_text(str(pids))
        (self._dir("cpu") / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (self._dir("cpu") / "cpu.cfs_quota_us").write_text(str(quota))

    def open_counted(self) -> None:
        """Open the files a job's counters are read from, once: the runner reads them after
        each job (~100 us a job with pathlib's open and read, here, against two preads), and
        the CPU time at each watch tick while one runs."""
        v2 = self.version == "v2"
        memory, pids = (self.dirs.get(UNIFIED if v2 else c) for c in ("memory", "pids"))
        cpu = self.dirs.get(CPUACCT) or self.dirs.get(UNIFIED if v2 else "cpu")
        self.counted = CountFiles(
            _opened(memory, "memory.events" if v2 else "memory.oom_control"),
            _opened(pids, "pids.events"),
            _opened(cpu, "cpu.stat" if v2 else "cpuacct.usage"),
            v2,
        )

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def kill(self) -> None:
        """SIGKILL every process in the leaf at once (v2 ``cgroup.kill``), or each of those
        it lists (v1)."""
        if self.version == "v2":
            with contextlib.suppress(OSError):
                (self.dirs[UNIFIED] / "cgroup.kill").write_text("1")
                return
        with contextlib.suppress(OSError, ValueError):
            for pid in (self._dir("pids") / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError, ValueError):
            return [int(p) for p in (self._dir("pids") / "cgroup.procs").read_text().split()]
        return []

    def end(self, wait_s: float = END_WAIT_S) -> bool:
        """Kill what is left in the leaf, wait (bounded, on pidfds) until it has exited, and
        remove the leaf; False if it could not be (the node's next start removes it)."""
        deadline = time.monotonic() + wait_s
        for _ in range(END_ROUNDS):
            left = self.pids()
            if not left or time.monotonic() >= deadline:
                break
            kill_and_wait(left, deadline)
        return self.remove()

    def remove(self) -> bool:
        """Remove the leaf (its processes all ended); False if one is still there."""
        counted, self.counted = self.counted, CountFiles()
        for fd in (counted.memory, counted.pids, counted.cpu):
            if fd >= 0:
                os.close(fd)
        done = True
        for d in self.dirs.values():
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                done = False
        return done


def _opened(d: Path | None, name: str) -> int:
    """``name`` in ``d`` opened to read; -1 if it cannot be."""
    if d is not None:
        with contextlib.suppress(OSError):
            return os.open(d / name, os.O_RDONLY | os.O_CLOEXEC)
    return -1


# the worker's first process enters the leaf, then becomes the planned command (exec: same pid)
_ENTER = 'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 126; shift; done; '
_ENTER += 'shift; exec "$@"'


def enter_argv(procs_files: list[str], argv: list[str]) -> list[str]:
    """``argv`` run in the cgroups whose ``cgroup.procs`` are ``procs_files``: the process
    enters them before bwrap starts, so every process of the sandbox is born inside."""
    for path in procs_files:
        if path == "--" or not path.startswith("/"):
            raise ValueError(f"not a cgroup.procs path: {shlex.quote(path)}")
    return ["/bin/sh", "-c", _ENTER, "hero-cgroup", *procs_files, "--", *argv]

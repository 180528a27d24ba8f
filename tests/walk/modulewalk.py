"""A module tracer for one job's walk (tests/layout/test_message_walk.py): which project modules
(node/, bus/, crypto/) run, in which order, in every process a job passes.

A process started with ``HERO_WALK_TRACE=<dir>`` and this directory on ``PYTHONPATH`` installs it
from ``sitecustomize.py`` before anything else runs; the node hands its environment on to its
runner processes (less its secrets), so they are traced too. Without the variable nothing is
installed: the node's own code has no trace of this.

Each process appends ``<monotonic ns> <module path>`` lines to ``<dir>/<pid>.walk`` (a header
names the process): one line when a call enters a project module other than the one the last
line named, and one for a call after a quiet spell (``QUIET_NS``), so that a module resumed after
waiting is seen again. Lines are written through at once: a runner process ends with
``os._exit`` and runs no exit handler. The clock is the machine's monotonic one, the same in
every process, so a test takes the modules first entered between two readings of its own.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

ENV = "HERO_WALK_TRACE"
ROOT = Path(__file__).resolve().parents[2]
TOPS = ("node", "bus", "crypto")
TIMER_TICKS = 3  # woken this often in an idle interval (5.5 s): a timer, not a 5 s pop
TICK_GAP_NS = 300_000_000  # lines further apart than this are two wake-ups
WOKE = b"~"  # a line's module when a task resumed, calling nothing yet
QUIET_NS = 2_000_000  # a call after 2 ms without one is a resumption: said again
# generators and coroutines: a profile hook sees each resumption as a call
_SUSPENDS = 0x20 | 0x80 | 0x100 | 0x200


def _project(filename: str, root: str) -> str | None:
    """``node/intake/supervisor.py`` for a file of the project, else None."""
    if not filename.startswith(root):
        return None
    rel = filename[len(root) :]
    return rel if rel.split("/", 1)[0] in TOPS else None


def _task() -> tuple[int, str]:
    """Who runs: the trio task (a service of the node's), else the thread; id and name."""
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            task = trio.lowlevel.current_task()
            return id(task), task.name
        except RuntimeError:
            pass  # not in a trio run (a runner process, a worker thread)
    return threading.get_ident(), threading.current_thread().name


def install(out_dir: str | Path, name: str = "") -> None:
    """Trace this process (every thread, those started later too) into ``out_dir``."""
    path = Path(out_dir) / f"{os.getpid()}.walk"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    argv = " ".join(sys.argv) if hasattr(sys, "argv") else ""
    os.write(fd, f"# {os.getppid()} {name or argv}\n".encode())
    root = str(ROOT) + "/"
    seen: dict[str, str | None] = {}
    named: set[int] = set()
    starts: dict[CodeType, int] = {}  # where a generator's or coroutine's frame starts
    last: list[Any] = ["", 0, 0]  # the module the last line named, when, in which task

    def hook(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        filename = frame.f_code.co_filename
        module = seen.get(filename, "")
        if module == "":
            module = seen[filename] = _project(filename, root)
        if module is None:
            return
        code = frame.f_code
        now = time.monotonic_ns()
        task, task_name = _task()
        if task not in named:
            named.add(task)
            os.write(fd, b"= %x %s\n" % (task, task_name.encode(errors="replace")))
        if code.co_flags & _SUSPENDS and starts.setdefault(code, frame.f_lasti) != frame.f_lasti:
            # resumed where it waited: a wake-up (a timer's tick shows), not a call
            if task != last[2] or now - last[1] > QUIET_NS:
                os.write(fd, b"%d %x %s\n" % (now, task, WOKE))
                last[0], last[2] = WOKE, task
            last[1] = now
            return
        if module != last[0] or task != last[2] or now - last[1] > QUIET_NS:
            os.write(fd, b"%d %x %s\n" % (now, task, module.encode()))
            last[0], last[2] = module, task
        last[1] = now

    _open.append(fd)
    threading.setprofile(hook)
    sys.setprofile(hook)


_open: list[int] = []  # the trace files this process writes


def uninstall() -> None:
    """Stop tracing this process (threads started from now on too) and close its file."""
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    while _open:
        os.close(_open.pop())


def install_from_env() -> None:
    """What ``sitecustomize.py`` runs at every start: one look at the environment."""
    out_dir = os.environ.get(ENV)
    if out_dir:
        install(out_dir)


# -- reading the traces ---------------------------------------------------------------------------


@dataclass
class Traced:
    """One process's trace: its parent, its command line, its tasks' names and its lines
    (``(ns, task, module)``, in the order written)."""

    pid: int
    ppid: int
    argv: str
    tasks: dict[str, str] = field(default_factory=dict)
    lines: list[tuple[int, str, str]] = field(default_factory=list)

    def tickers(self, idle: tuple[int, int]) -> dict[str, set[str]]:
        """What each task did in an idle interval (the modules it entered), for a task that
        did something then."""
        found: dict[str, set[str]] = {}
        for ns, task, module in self.lines:
            if idle[0] <= ns <= idle[1] and module != "~":
                found.setdefault(task, set()).add(module)
        return found

    def timers(self, idle: tuple[int, int]) -> set[str]:
        """The tasks that woke up at least :data:`TIMER_TICKS` times in an idle interval: a
        service on a timer (counters, stats, backpressure flushes), whose tick may carry a
        job's figures but is no step of its way."""
        woke: dict[str, list[int]] = {}
        for ns, task, _ in self.lines:
            if idle[0] <= ns <= idle[1]:
                times = woke.setdefault(task, [])
                if not times or ns - times[-1] > TICK_GAP_NS:
                    times.append(ns)
                else:
                    times[-1] = ns
        return {task for task, times in woke.items() if len(times) >= TIMER_TICKS}

    def chains(self, start: int, end: int, idle: tuple[int, int]) -> list[list[str]]:
        """Per task that ran between ``start`` and ``end``, the modules it first entered, in
        that order (tasks in the order they began): less the timers, and less a task that did
        nothing then but what it does when the process is idle (a blocking pop's timeout)."""
        ticking, timers = self.tickers(idle), self.timers(idle)
        during: dict[str, list[str]] = {}
        for ns, task, module in self.lines:
            if start <= ns <= end and task not in timers and module != "~":
                chain = during.setdefault(task, [])
                if module not in chain:
                    chain.append(module)
        return [c for t, c in during.items() if not set(c) <= ticking.get(t, set())]


def read_traces(out_dir: str | Path) -> dict[int, Traced]:
    """Every process's trace in ``out_dir``, by pid."""
    found: dict[int, Traced] = {}
    for path in sorted(Path(out_dir).glob("*.walk")):
        pid = int(path.stem)
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            head, _, rest = line.partition(" ")
            if head == "#":
                ppid, _, argv = rest.partition(" ")
                found.setdefault(pid, Traced(pid, int(ppid), argv))
            elif head == "=":
                task, _, name = rest.partition(" ")
                found[pid].tasks[task] = name
            else:
                task, _, module = rest.partition(" ")
                found[pid].lines.append((int(head), task, module))
    return found

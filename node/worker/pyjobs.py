"""Python jobs in a warm interpreter: one job after another in fresh namespaces, inside a
runner process (``python -m node.worker.pyjobs --runner``, node/worker/loop.py); a script
that crashes or hangs takes down at most that process, never the node.

The script's own fds 0/1/2 are /dev/null and two capture files (:class:`Capture`), so output
written by the script, by C code or by child processes is all captured; what it leaves running
is killed after it (:func:`end_leftovers`: the process is a child subreaper).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import tempfile
import traceback
from typing import Any, BinaryIO


class Capture:
    """fd 1 and 2 redirected into reusable temp files for the duration of one job."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.spare = (tempfile.TemporaryFile(), tempfile.TemporaryFile())
        self.files: tuple[BinaryIO, BinaryIO] = self.spare

    def start(self, paths: list[str] | None = None) -> None:
        """Capture into ``paths`` (files the node follows live), else into the spare files."""
        if paths:
            self.files = (open(paths[0], "w+b"), open(paths[1], "w+b"))  # noqa: SIM115
        else:
            self.files = self.spare
        for fd, f in zip((1, 2), self.files, strict=True):
            f.seek(0)
            f.truncate()
            os.dup2(f.fileno(), fd)

    def finish(self) -> tuple[str, str]:
        sys.stdout.flush()
        sys.stderr.flush()
        out, err = self._read(self.files[0]), self._read(self.files[1])
        if self.files is not self.spare:
            for f in self.files:
                f.close()
        return out, err

    def _read(self, f: BinaryIO) -> str:
        size = f.seek(0, os.SEEK_END)
        f.seek(0)
        text = f.read(self.limit).decode("utf-8", "replace")
        return text + (f"\n[... {size - self.limit} more bytes cut]" if size > self.limit else "")


def run_one(script: str, env: dict[str, str]) -> int:
    """Exec ``script`` as ``__main__`` in a fresh namespace with ``env``; its exit code."""
    saved_cwd = os.getcwd()
    os.environ.update(env)  # the runner process emptied its own (procjob.prepare_process)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(script, "<job>", "exec"), namespace)  # noqa: S102 - running jobs is the point
        return 0
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - any failure of the script is its exit status
        traceback.print_exc()
        return 1
    finally:
        os.environ.clear()
        if os.getcwd() != saved_cwd:
            os.chdir(saved_cwd)


_PR_SET_CHILD_SUBREAPER = 36
_MAX_ROUNDS = 1000  # bounded: a fork bomb must not keep the worker from answering


def become_subreaper() -> bool:
    """Adopt orphans: a process a job started and left behind (``sleep &`` in a child that
    exited) is re-parented to this worker instead of init, so that :func:`end_leftovers` sees
    it among the worker's children and, when a job left nothing, knows so in one system call."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):  # not Linux
        return False


def end_leftovers(subreaper: bool) -> None:
    """Kill every process the job left running (the other members of this worker's process
    group and the worker's children, adopted orphans included) and reap them, so that a job's
    processes end with it. What escapes (README "Runners"): a process that is no descendant of
    the worker (started through another service); without the subreaper setting, also one that
    left the group with setsid() after its parent exited."""
    if subreaper and not _has_children():
        return
    me = os.getpid()  # also the process group's id: the worker leads its own session
    for _ in range(_MAX_ROUNDS):
        left = [p for p, ppid, pgrp in _live_processes() if p != me and me in (ppid, pgrp)]
        if not left:
            break
        for pid in left:
            _kill_and_wait(pid)
        _reap_children()
    _reap_children()


def _has_children() -> bool:
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _live_processes() -> list[tuple[int, int, int]]:
    """(pid, ppid, process group) of every process that is not a zombie."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                state, ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if state != "Z":
            out.append((int(name), int(ppid), int(pgrp)))
    return out


def _kill_and_wait(pid: int) -> None:
    """SIGKILL ``pid`` through a pidfd (no pid-reuse race) and wait (bounded) until it died."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:  # no pidfds (Linux < 5.3): a plain kill; the next round sees it if alive
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(1000)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


def _reap_children() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


def main() -> None:
    """``python -m node.worker.pyjobs --runner``: a runner process (node/worker/loop.py)."""
    if sys.argv[1:2] != ["--runner"]:
        sys.exit("usage: python -m node.worker.pyjobs --runner (started by the node)")
    # told to stop while it starts: it has taken nothing yet, so it just goes
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: os._exit(0))
    from node.worker.loop import main as runner_main

    runner_main()


if __name__ == "__main__":
    main()

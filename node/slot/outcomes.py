"""A job's outcome on disk: its output files (followed while it runs, read back once it
answered), the limit that ended it, the outcome kept tied to its attempt until Valkey has
recorded it, and the processes a dead run of the node left behind that may still finish one.

Scripts write their output to two files under ``run/logs``, one pair per runner slot (emptied
for the slot's next job); while the job runs, its pump (:class:`LogPump`) appends what is new
to the stream ``logs:<job key>`` every LOG_FLUSH_S (a job that ends sooner has its output in
its result and never touches the stream). The runner process's watch thread drives the flushes
(node/worker/job.py). When a job that published ends, the rest and an ``end`` entry follow.
Each stream forwards at most ``max_output_bytes``, keeps at most MAX_ENTRIES entries and
expires with the reply lists. ``hero-node job logs KEY --follow`` reads it.

Once the job answered, the runner reads back what it wrote (:func:`written`,
:func:`read_back`, :func:`tail_of`); its outcome (bus/core/attempts.py ``outcome_of``) is
``finished`` with the script's output or ``error`` with a reason: a limit's
(:func:`limit_reason`, read from the same exit status, the tail of its stderr and the size of
its output) where one ended it. An outcome file holds it as :func:`recorded` writes it; the
slot's output files are what adoption reads the output from when the record has none.

A node killed while its jobs run leaves their processes running (each in its own session): they
finish, and only they know how. So the runner process that waits for a job keeps the job's
outcome on disk until Valkey has recorded it, named by the attempt: ``run/outcomes/<ctx>-<job
key>-<attempt>``. The attempt in the name is the fencing token: a slot adopts the outcome of a
job's *current* attempt (node/runners/recovery.py: recover_slot), waiting first for a process
that still runs it; only a job whose process died with no outcome is recorded ``runner_lost``.
A job's processes record their pid in ``run/jobs`` while they run, and a job's pid file
(``run/jobs/<pid>``) names its outcome file on its second line, so that the start-up orphan
killer (:func:`kill_orphans`) kills what the dead run left behind but spares a process that is
still worth adopting.

Every job's outcome goes first into its slot's file (:class:`SlotFile`,
``run/outcome-slots/<ctx>-<slot>``, open for the life of the runner process), one write over
the last, emptied once Valkey has the end: creating, renaming and removing a file per job cost
the runner ~180 us of CPU, this ~17. Before the slot's recovery looks for outcome files, it
turns what the slot's file holds into the outcome file it names (:func:`unpack_slot`); the slot's
process has ended by then. A runner whose node has died, one that ends a stopped or timed-out
python job by exiting, and one whose end Valkey refused write the named file itself (the next
node may already be looking), the last fsynced (:func:`write_outcome` ``durable``).

This module is imported by the runner processes too: standard library and bus/core only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from bus.core.attempts import Outcome, exit_reason
from bus.core.models import dumps_json

if TYPE_CHECKING:
    from bus.store.atomic.runs_sync import SyncRuns

# how long a job (or a runner process) told to end may take before it is killed outright
KILL_GRACE_S = 2.0


# -- the output files --------------------------------------------------------------------

LOG_FLUSH_S = 0.5
MAX_ENTRIES = 2000


def log_paths(run_dir: Path, slot_name: str) -> tuple[Path, Path]:
    """The output files of one runner slot (reused by each job it runs)."""
    base = run_dir / "logs"
    base.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", slot_name)
    return base / f"{name}.out", base / f"{name}.err"


class LogPump:
    """Forwards what the script wrote since the last flush to the job's log stream (from the
    watch thread; the end from the main thread, after the job)."""

    def __init__(
        self, runs: SyncRuns, job_key: str, paths: tuple[Path, Path], limit: int, ttl_s: int
    ) -> None:
        self.runs, self.job_key, self.paths = runs, job_key, paths
        self.limit, self.ttl = limit, ttl_s
        self.offsets = [0, 0]
        self.published = False
        self.lock = threading.Lock()  # a flush in progress ends before the end marker

    def flush(self) -> None:
        with self.lock:
            self._flush()

    def _flush(self) -> None:
        for i, (name, path) in enumerate(zip(("stdout", "stderr"), self.paths, strict=True)):
            if self.offsets[i] >= self.limit:
                continue
            chunk = _read_from(path, self.offsets[i], self.limit - self.offsets[i])
            if chunk:
                self.offsets[i] += len(chunk)
                fields = {"stream": name, "data": chunk.decode("utf-8", "replace")}
                self.runs.log_chunk(self.job_key, fields, MAX_ENTRIES)
                self.published = True

    def finish(self, status: str) -> None:
        """After the job: the rest and an end marker, if anything was published live (a
        Valkey that is away does not hold up the job's end)."""
        if not self.published and not self.lock.locked():
            return
        with self.lock, contextlib.suppress(Exception):
            if not self.published:
                return
            self._flush()
            self.runs.log_end(self.job_key, status, MAX_ENTRIES, self.ttl)


# What a job's output file is read with first: its size known from what came back, not from
# an fstat (the file held open, nothing writes it after the job's answer). One system call a
# file instead of two for what most jobs write; 64 KiB costs pread no more than 4.
HEAD_BYTES = 65536


class Written(msgspec.Struct, frozen=True):
    """What a job wrote to one of its output files: its first bytes (up to HEAD_BYTES) and its
    size."""

    head: bytes
    size: int


def written(fd: int) -> Written:
    """What the file open as ``fd`` holds from its start: read once, an fstat only if it is
    longer than HEAD_BYTES."""
    head = os.pread(fd, HEAD_BYTES, 0)
    return Written(head, len(head) if len(head) < HEAD_BYTES else os.fstat(fd).st_size)


def tail_of(fd: int, w: Written, n: int) -> bytes:
    """The last ``n`` bytes of what :func:`written` read as ``w``."""
    if w.size <= len(w.head):
        return w.head[-n:] if w.size else b""
    return os.pread(fd, n, max(0, w.size - n))


def read_back(fd: int, w: Written, limit: int) -> str:
    """What a script wrote to its log file (open as ``fd``, read as ``w``), bounded like
    captured output."""
    size = w.size
    if not size:
        return ""
    data = w.head if min(size, limit) <= len(w.head) else os.pread(fd, min(size, limit), 0)
    text = data[:limit].decode("utf-8", "replace")
    return text + (f"\n[... {size - limit} more bytes cut]" if size > limit else "")


def _read_from(path: Path, offset: int, most: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(most)
    except OSError:
        return b""


# -- the limit a job hit -----------------------------------------------------------------


# What a job's stderr says when a limit refused it something (the tail is searched, so a job
# cannot hide it by printing more first).
_MEMORY_MARKS = (b"MemoryError", b"Cannot allocate memory", b"memory exhausted", b"out of memory")
_PIDS_MARKS = (
    b"Resource temporarily unavailable",
    b"BlockingIOError",
    b"fork: retry",
    b"Cannot fork",
    b"can't fork",
)
# EFBIG (a job that ignores SIGXFSZ), and a shell's word for a child SIGXFSZ killed
_FSIZE_MARKS = (b"File too large", b"File size limit exceeded")
# ENOSPC and EDQUOT: the work dir's quota (or the /tmp tmpfs) is full
_DISK_MARKS = (b"No space left on device", b"Disk quota exceeded")
TAIL_BYTES = 4096


class Bounds(Protocol):
    """The limits a job's reason is read against (node/sandbox/limits.py: ``Limits``)."""

    @property
    def file_size_mb(self) -> int: ...

    @property
    def cpu_s(self) -> int: ...


class Ending(msgspec.Struct, frozen=True):
    """How a job's process ended, as the worker saw it (wait status and rusage)."""

    exit_code: int | None  # None: killed by a signal
    signal: int = 0
    cpu_s: float = 0.0
    bound: str = ""  # the reason of a bound the runner saw hit (a cgroup's counters, a full disk)


def limit_reason(
    ending: Ending, limits: Bounds, stderr_tail: bytes, largest_output: int
) -> str | None:
    """The reason token of a limit (node/sandbox/limits.py) that ended the job, or None if none
    did. ``largest_output``: the size of its larger output file (a SIGXFSZ there is the output
    limit)."""
    signum = ending.signal
    if not signum and ending.exit_code is not None and 128 < ending.exit_code < 160:
        signum = ending.exit_code - 128  # a shell reports its child's death by signal so
    tail = stderr_tail[-TAIL_BYTES:]
    too_large = ending.exit_code != 0 and any(mark in tail for mark in _FSIZE_MARKS)
    if signum == signal.SIGXFSZ or too_large:  # the signal, or EFBIG where it is ignored
        at_output_limit = largest_output >= limits.file_size_mb * 1024 * 1024
        return "output_limit" if at_output_limit else "file_size_limit"
    if signum == signal.SIGXCPU:
        return "cpu_limit"
    if signum == signal.SIGKILL and ending.cpu_s >= limits.cpu_s:
        return "cpu_limit"
    if ending.bound == "cpu_limit":  # the tree's CPU time: past it, however the job ended
        return "cpu_limit"
    if ending.exit_code == 0:
        return None
    if ending.bound:
        return ending.bound
    if any(mark in tail for mark in _DISK_MARKS):
        return "disk_limit"
    if any(mark in tail for mark in _MEMORY_MARKS):
        return "memory_limit"
    if any(mark in tail for mark in _PIDS_MARKS):
        return "pids_limit"
    return None


# -- outcome files ------------------------------------------------------------------------


def recorded(outcome: Outcome, *, output: bool = True) -> dict[str, object]:
    """``outcome`` as an outcome file records it (node/runners/adoption.py: adopted_outcome
    reads it back): the script's exit status, its output (else adoption reads it from the
    slot's log files), and a reason where the exit status does not say it (a stop, a timeout,
    a limit, a command that could not start)."""
    result = outcome.result
    code = int(result.get("exit_code") or -signal.SIGKILL)
    record: dict[str, object] = {"exit_code": code}
    if output:
        record |= {"stdout": result.get("stdout", ""), "stderr": result.get("stderr", "")}
    if "exit_code" not in result or outcome.reason != exit_reason(code):
        record["reason"] = outcome.reason
    return record


def outcome_dir(run_dir: Path) -> Path:
    return run_dir / "outcomes"


def outcome_path(run_dir: Path, ctx: int, job_key: str, attempt: int) -> Path:
    """Where attempt ``attempt`` of ``job_key`` (context ``ctx``) writes its outcome."""
    return outcome_dir(run_dir) / outcome_name(ctx, job_key, attempt)


def outcome_name(ctx: int, job_key: str, attempt: int) -> str:
    """The name of :func:`outcome_path`'s file (:func:`parse_outcome_name` reads it)."""
    return f"{ctx}-{job_key}-{attempt}"


def parse_outcome_name(name: str) -> tuple[int, str, int] | None:
    """(context, job key, attempt) of an outcome file's name; None if it is not one."""
    ctx, _, rest = name.partition("-")
    job_key, _, attempt = rest.rpartition("-")
    if not (ctx.isdigit() and attempt.isdigit() and job_key):
        return None
    return int(ctx), job_key, int(attempt)


def write_outcome(path: Path, outcome: dict[str, Any], *, durable: bool = False) -> None:
    """Write ``outcome`` whole: a temporary file renamed over ``path``, so a reader sees all of
    it or nothing, readable by the node's user only (it may hold the job's output).

    Not fsynced by default: the file outlives the node's death in the page cache, and a
    machine crash that could lose it also loses Valkey's last second and the job itself,
    which then runs again at worst. ``durable``: fsynced, the file and then its folder (so the
    rename is on disk too), for an outcome that Valkey could not take and that then exists
    nowhere else: a runner process killed after this (its node's unit stopped, the restarted
    node's orphan killer, a machine crash) loses nothing, the next start adopts the file."""
    name = os.fspath(path)
    fd = os.open(name + ".tmp", _FLAGS, 0o600)
    try:
        data = memoryview(json.dumps(outcome).encode())
        while data:
            data = data[os.write(fd, data) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(name + ".tmp", name)
    if durable:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


def read_outcome(path: Path) -> dict[str, Any] | None:
    """The outcome recorded at ``path``, or None if there is none (or it is unreadable)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) and isinstance(value.get("exit_code"), int) else None


def discard(path: Path) -> None:
    """Forget an outcome the node has recorded in Valkey (or that was superseded)."""
    name = os.fspath(path)
    for each in (name, name + ".tmp"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(each)


def slot_path(run_dir: Path, ctx: int, slot_id: str) -> Path:
    """The outcome file of runner slot ``slot_id`` of context ``ctx`` (see :class:`SlotFile`)."""
    return run_dir / "outcome-slots" / f"{ctx}-{slot_id}"


BLANKED_MAX = 4096  # the longest record SlotFile.clear blanks instead of truncating


class SlotFile:
    """A runner slot's outcome file: the outcome of the attempt its process is ending, and the
    name of the outcome file it stands for. Each record is one ``pwrite`` at offset 0, padded
    with blanks over the longest record before it (JSON allows them), so a process killed at
    any point leaves either the last record or the one before it whole."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1
        self.size = 0  # the file's length: records are written over it

    def keep(self, name: str, outcome: dict[str, Any]) -> None:
        """Hold ``outcome``, standing for the outcome file ``name`` (:func:`outcome_name`)."""
        self._write({"file": name, "outcome": outcome})

    def keep_all(self, records: list[tuple[str, dict[str, Any]]]) -> None:
        """Hold the outcomes of a batch's attempts, each standing for its outcome file (name,
        outcome), in one record."""
        self._write({"kept": [{"file": name, "outcome": outcome} for name, outcome in records]})

    def _write(self, record: dict[str, Any]) -> None:
        if self.fd < 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self.size = os.fstat(self.fd).st_size
        # orjson (dumps_json): json.dumps' encoder costs a lone job ~5 us here, ~20 cold
        data = dumps_json(record)
        os.pwrite(self.fd, data.ljust(self.size), 0)
        self.size = max(self.size, len(data))

    def clear(self) -> None:
        """Valkey has the end: the slot holds no outcome. Blanked in place (a blank file holds
        none: :func:`unpack_slot`), as a record is written: an ftruncate of a file with data
        costs ~8 us on ext4 (the inode journalled), a pwrite of a few blanks ~1
        (bench/HISTORY.md#runner-syscalls). Truncated still past :data:`BLANKED_MAX`, so that
        one large batch record does not pad every later one."""
        if self.size > BLANKED_MAX:
            os.ftruncate(self.fd, 0)
            self.size = 0
        elif self.size:
            os.pwrite(self.fd, b" " * self.size, 0)


def unpack_slot(run_dir: Path, ctx: int, slot_id: str) -> str | None:
    """The outcomes a slot's file holds (one, or a batch's), each written as the outcome file
    it names (unless that file exists: it was written later), the slot's file emptied; the
    name of the last, or None if it held none. For the slot's recovery, once the slot's process
    has ended. A record that is not one is dropped: the slot's own process wrote it, and only
    whole records."""
    path = slot_path(run_dir, ctx, slot_id)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    name: str | None = None
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        value = json.loads(text) if text.strip() else {}
        kept = value.get("kept")
        for record in kept if isinstance(kept, list) else [value]:
            name = _unpacked(run_dir, record) or name
    os.truncate(path, 0)
    return name


def _unpacked(run_dir: Path, record: Any) -> str | None:  # noqa: ANN401 - JSON
    """One record of a slot's file written as the outcome file it names; that name."""
    named, outcome = record.get("file"), record.get("outcome")
    if not (
        isinstance(named, str)
        and parse_outcome_name(named) is not None
        and "/" not in named
        and isinstance(outcome, dict)
        and isinstance(outcome.get("exit_code"), int)
    ):
        return None
    target = outcome_dir(run_dir) / named
    if not target.exists():
        write_outcome(target, outcome)
    return named


def live_processes(pid_dir: Path, *, prune: bool = True) -> dict[int, str]:
    """The processes this node's pid files name that still run (checked by their environment,
    as a pid may have been reused): pid -> the outcome file its pid file names ("" if none).
    ``prune``: remove the other pid files (only while no job runs: one being written would
    look stale)."""
    pid_dir.mkdir(parents=True, exist_ok=True)
    alive: dict[int, str] = {}
    for path in pid_dir.iterdir():
        try:
            pid = int(path.name)
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            marker, _, outcome = path.read_text().partition("\n")
        except (ValueError, OSError):
            if prune:
                path.unlink(missing_ok=True)
            continue
        if "=" not in marker:  # a job: "<caller>:<id>"
            marker = f"HERO_JOB_ID={marker.partition(':')[2]}"
        if f"\0{marker}\0".encode() in b"\0" + environ + b"\0":
            alive[pid] = outcome
        elif prune:
            path.unlink(missing_ok=True)
    return alive


def kill_orphans(pid_dir: Path, keep: frozenset[str] = frozenset()) -> int:
    """Kill the process groups of scripts a crashed run of this node left behind, except those
    running an attempt whose outcome file is in ``keep`` (they are adopted); how many."""
    killed = 0
    for pid, outcome in live_processes(pid_dir).items():
        if outcome and outcome in keep:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
            killed += 1
        (pid_dir / str(pid)).unlink(missing_ok=True)
    return killed

"""A job's output files: a running script's stdout/stderr, followed while it runs and read
back once it answered.

Scripts write their output to two files under ``run/logs``, one pair per runner slot (truncated
when the slot's next job starts); while the job runs, its pump appends what is new to the
stream ``logs:<job key>`` every LOG_FLUSH_S (a job that ends sooner has its output in its result
and never touches the stream). The runner process's watch thread drives the flushes
(node/worker/job.py). When a job that published ends, the rest and an ``end`` entry
follow. Each stream forwards at most ``max_output_bytes``, keeps at most MAX_ENTRIES entries and
expires with the reply lists. ``hero-node job logs KEY --follow`` reads it.

Once the job answered, the runner reads back what it wrote (:func:`written`, :func:`read_back`,
:func:`tail_of`): its result's output, and the tail a limit's reason is read from
(node/slot/outcomes.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bus.store.atomic.runs_sync import SyncRuns

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


@dataclass(frozen=True)
class Written:
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

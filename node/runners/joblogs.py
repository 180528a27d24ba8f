"""Live job logs: a running script's stdout/stderr, followed while it runs.

Scripts write their output to two files under ``run/logs``, one pair per runner slot (truncated
when the slot's next job starts); while the job runs, its pump appends what is new to the
stream ``logs:<job key>`` every LOG_FLUSH_S (a job that ends sooner has its output in its result
and never touches the stream). The slot's watcher (node/runners/runner.py) drives the flushes.
When a job that published ends, the rest and an ``end`` entry follow. Each stream forwards at most
``max_output_bytes``, keeps at most MAX_ENTRIES entries and expires with the reply lists.
``hero-node job logs KEY --follow`` reads it.
"""

from __future__ import annotations

import re
from pathlib import Path

import trio

from bus import keys
from node.state import NodeState

LOG_FLUSH_S = 0.5
MAX_ENTRIES = 2000


def log_paths(node: NodeState, slot_name: str) -> tuple[Path, Path]:
    """The output files of one runner slot (reused by each job it runs)."""
    base = node.config.run_dir / "logs"
    base.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", slot_name)
    return base / f"{name}.out", base / f"{name}.err"


class LogPump:
    """Forwards what the script wrote since the last flush to the job's log stream."""

    def __init__(self, node: NodeState, ctx: int, job_key: str, paths: tuple[Path, Path]) -> None:
        self.node, self.ctx, self.job_key, self.paths = node, ctx, job_key, paths
        self.offsets = [0, 0]
        self.published = False
        self._lock = trio.Lock()  # a flush in progress ends before the end marker is written

    @property
    def touched(self) -> bool:
        """Something was (or is being) published: :meth:`finish` has work to do."""
        return self.published or self._lock.locked()

    async def flush(self) -> None:
        async with self._lock:
            await self._flush()

    async def _flush(self) -> None:
        limit = self.node.config.max_output_bytes
        stream = keys.logs(self.job_key)
        for i, (name, path) in enumerate(zip(("stdout", "stderr"), self.paths, strict=True)):
            if self.offsets[i] >= limit:
                continue
            chunk = _read_from(path, self.offsets[i], limit - self.offsets[i])
            if not chunk:
                continue
            self.offsets[i] += len(chunk)
            fields = {"stream": name, "data": chunk.decode("utf-8", "replace")}
            await self._add(stream, fields)

    async def finish(self, status: str) -> None:
        """After the job: the rest and an end marker, if anything was published live."""
        async with self._lock:
            if not self.published:
                return
            await self._flush()
            await self._add(keys.logs(self.job_key), {"end": status})
            ttl = self.node.config.reply_ttl_s
            await self.node.store.expire(self.ctx, keys.logs(self.job_key), ttl)

    async def _add(self, stream: str, fields: dict[str, str]) -> None:
        await self.node.store.xadd_capped(self.ctx, stream, fields, MAX_ENTRIES)
        self.published = True


def _read_from(path: Path, offset: int, most: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(most)
    except OSError:
        return b""

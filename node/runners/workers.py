"""Warm Python workers (see :mod:`node.runners.pyworker`), one per runner slot.

A worker is started on first use and reused for up to ``max_jobs`` jobs, then recycled. A job
that outlives its timeout, or is stopped, kills the worker's whole process group (a fresh one
starts for the next job); a worker that dies under a job reports it as ``runner_lost``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import trio

from bus.models import JobStatus, RunnerJob
from bus.reasons import Reason
from node.errors import WorkerLost
from node.runners.executor import KILL_GRACE_S, Outcome, job_env, outcome_of

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
DEFAULT_MAX_JOBS = 500


class PythonWorker:
    def __init__(
        self,
        *,
        max_output_bytes: int,
        max_jobs: int = DEFAULT_MAX_JOBS,
        pid_dir: Path | None = None,
    ) -> None:
        self.max_output_bytes = max_output_bytes
        self.max_jobs = max_jobs
        self.pid_dir = pid_dir
        self.proc: trio.Process | None = None
        self.jobs = 0
        self._buffer = bytearray()

    async def run(
        self, job: RunnerJob, logs: tuple[Path, Path] | None = None, outcome: Path | None = None
    ) -> Outcome:
        """Run one job (its stdout/stderr written live to ``logs`` if given; its outcome to
        ``outcome``, see node/runners/outcomes.py); never raises for what the script does."""
        if self.proc is None or self.jobs >= self.max_jobs or self.proc.returncode is not None:
            await self.close()
            await self._start()
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.jobs += 1
        paths = [str(p) for p in logs] if logs else None
        self._name_outcome(outcome)
        fields = {"script": job.script, "env": job_env(job), "logs": paths}
        request = json.dumps(fields | {"outcome": str(outcome or "")}).encode()
        try:
            with trio.move_on_after(job.timeout or 1e9) as deadline:
                await self.proc.stdin.send_all(_HEADER.pack(len(request)) + request)
                reply = await self._read_frame()
        except (WorkerLost, trio.BrokenResourceError, trio.ClosedResourceError):
            code = await self._reap()
            return outcome_of(code if code < 0 else -signal.SIGKILL, b"", b"", 0)
        except BaseException:  # cancelled (stop, shutdown): the worker may be mid-job
            with trio.CancelScope(shield=True):
                await self.close()
            raise
        if deadline.cancelled_caught:
            await self.close()
            return Outcome(JobStatus.ERROR, {}, f"{Reason.TIMEOUT}: killed after {job.timeout} s")
        return outcome_of(
            int(str(reply["exit_code"])),
            str(reply["stdout"]),
            str(reply["stderr"]),
            self.max_output_bytes,
        )

    async def _start(self) -> None:
        env = dict(os.environ) | {"HERO_WORKER": str(id(self))}
        self.proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "node.runners.pyworker", str(self.max_output_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            env=env,
        )
        self.jobs = 0
        self._buffer.clear()
        if self.pid_dir is not None:
            self.pid_dir.mkdir(parents=True, exist_ok=True)
            (self.pid_dir / str(self.proc.pid)).write_text(f"HERO_WORKER={id(self)}")

    def _name_outcome(self, outcome: Path | None) -> None:
        """Name the job's outcome file in the worker's pid file: the orphan killer at the next
        start spares a worker still running an attempt that is worth adopting."""
        if self.pid_dir is not None and self.proc is not None and outcome is not None:
            (self.pid_dir / str(self.proc.pid)).write_text(f"HERO_WORKER={id(self)}\n{outcome}")

    async def _read_frame(self) -> dict[str, object]:
        header = await self._read_exactly(_HEADER.size)
        return dict(json.loads(await self._read_exactly(_HEADER.unpack(header)[0])))

    async def _read_exactly(self, n: int) -> bytes:
        assert self.proc is not None
        assert self.proc.stdout is not None
        while len(self._buffer) < n:
            chunk = await self.proc.stdout.receive_some(65536)
            if not chunk:
                raise WorkerLost
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    async def _reap(self) -> int:
        assert self.proc is not None
        with trio.move_on_after(KILL_GRACE_S):
            await self.proc.wait()
        code = self.proc.returncode if self.proc.returncode is not None else -signal.SIGKILL
        await self.close()
        return code

    async def close(self) -> None:
        """Kill the worker's process group and forget it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
        if self.pid_dir is not None:
            (self.pid_dir / str(proc.pid)).unlink(missing_ok=True)

"""A lone job's "started" line is written while the job runs, not between its start and its
run (node/worker/loop.py run_job, node/worker/job.py JobRun.meanwhile): at the node's default
level that line (its record, its formatter, a write to the node's pipe) was the largest piece
of the runner's work on a lone job's way to its sandbox. It still comes before the job's end."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from bus.core import admitted
from bus.core.models import JobStatus
from bus.store.atomic.runs import NextJob
from bus.store.atomic.runs_sync import connect
from node.worker import job as procjob
from node.worker.loop import SlotLoop
from tests.runners.slots import slot_spec

KEY = b"k" * 32
LISTS = ["queue:v:prio:high", "queue:v", "queue:v:prio:low"]


class _Box:
    """The slot's sandbox, answering at once: what the runner had logged when the request was
    sent, and once the sandbox's ``idle`` function (if any) was called."""

    def __init__(self, real: Any, records: list[logging.LogRecord], call_idle: bool) -> None:  # noqa: ANN401
        self.real, self.records, self.call_idle = real, records, call_idle
        self.spec = real.spec
        self.seen: list[list[str]] = []

    def run(self, request: dict[str, Any], out: int, err: int, idle: Any = None) -> dict[str, Any]:  # noqa: ANN401
        self.seen.append([r.getMessage() for r in self.records])
        if idle is not None and self.call_idle:
            idle[1]()
            self.seen.append([r.getMessage() for r in self.records])
        return {"exit_code": 0, "signal": 0, "cpu_s": 0.0}

    def keep_spare(self) -> None:
        pass


def _queued(redis_url: str, n: int) -> str:
    key = f"job:1:{n}"
    fields = {
        "id": str(n),
        "caller_id": "1",
        "context_id": "1",
        "script": "print(1)",
        "script_type": "v",
        "message_key": f"message:1:{n}",
        "origin": "n",
        "status": "dispatched",
        "attempt": "0",
    }
    fields["admitted"] = admitted.stamp(KEY, 1, key, fields)
    client = connect(redis_url, 1)
    client.hset(key, mapping=fields)
    client.lpush("queue:v", key)
    return key


@pytest.mark.parametrize("call_idle", [True, False])
def test_a_lone_jobs_start_line_is_written_once_its_request_is_sent(
    redis_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    call_idle: bool,
) -> None:
    """Not before the request goes to the sandbox: by the sandbox's idle function, while the
    answer is awaited; a sandbox that answered first (no idle call) still gets it before the
    job's end is logged."""
    caplog.set_level(logging.INFO, logger="node.worker.loop")
    (tmp_path / "outcomes").mkdir()
    monkeypatch.setattr(procjob.PROCESS, "parent", os.getppid())  # its node is alive
    runner = SlotLoop(slot_spec(redis_url, tmp_path, pop_timeout_s=1.0), KEY)
    box = _Box(runner.job.sandbox, caplog.records, call_idle)
    runner.job.sandbox = box  # type: ignore[assignment]
    key = _queued(redis_url, 7)
    spec = runner.spec
    popped = runner.popper.pop(LISTS, check_first=True)
    assert popped == (key, None)
    nxt = NextJob(tuple(LISTS), spec.token_base, spec.lease_ttl_ms, spec.slot_id)
    assert runner.run_job(key, None, nxt) == []

    started = f"{key} started (attempt 1)"
    assert started not in box.seen[0]  # not yet when the request was sent
    if call_idle:
        assert started in box.seen[1]  # written while the answer was awaited
    lines = [r.getMessage() for r in caplog.records]
    ends = [i for i, line in enumerate(lines) if line.startswith(f"{key} finished")]
    assert lines.count(started) == 1
    assert ends == [ends[0]]
    assert lines.index(started) < ends[0]
    assert connect(redis_url, 1).hget(key, "status") == JobStatus.FINISHED.value

"""The lease renewal of a runner's watch thread (node/worker/job.py) tells a superseded attempt
from one that just ended: a tick that read the running attempt just before the main thread
recorded its end is refused by that end, and must not log that the result was refused (a
fault run found "attempt 1 superseded (result refused)" 3 ms after that attempt's result was
recorded and answered)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from bus.core.models import RunnerJob
from bus.store.atomic.runs import Ending
from bus.store.atomic.runs_sync import SyncRuns
from node.slot.outcomes import LogPump
from node.worker.job import HeldAttempt, JobRun
from tests.runners.slots import slot_spec

JOB = "job:1:7"
TOKEN = "n:b:1:v:0:" + JOB


@dataclass
class Watched:
    """Attempt 1 of a job, started in Valkey, as the watch thread holds it (a renewal due)."""

    run: JobRun
    cur: HeldAttempt
    runs: SyncRuns

    def tick(self, caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
        """One tick of the watch thread, which read ``cur`` before anything the test did
        since; what it logged of a superseded attempt."""
        with caplog.at_level(level, logger="node.worker.loop"):
            self.run._tick(self.cur)
        return [r.getMessage() for r in caplog.records if "superseded" in r.getMessage()]


@pytest.fixture
def watched(redis_url: str, tmp_path: Path, sync_runs: SyncRuns) -> Watched:
    sync_runs.client.hset(JOB, mapping={"status": "dispatched", "attempt": "0", "script_type": "v"})
    assert isinstance(sync_runs.start(JOB, TOKEN, 15_000, "v:0"), dict)
    run = JobRun(slot_spec(redis_url, tmp_path), sync_runs, lambda *_: True)
    job = RunnerJob(7, 1, 1, "print(1)", "v")
    pump = LogPump(sync_runs, JOB, run.logs, 1000, 60)
    cur = HeldAttempt(job, None, 1, TOKEN, pump, 1e18, 0.0, 1e18)  # type: ignore[arg-type]
    return Watched(run, cur, sync_runs)


def test_a_renewal_refused_by_the_attempts_own_end_logs_no_refusal(
    watched: Watched, caplog: pytest.LogCaptureFixture
) -> None:
    # the main thread: the run is over, then its end is recorded (the result is the job's)
    watched.cur.over = True
    ending = Ending(JOB, 1, "inflight:runner:v:0", "finished", {}, "", "")
    done, _ = watched.runs.finish_local(ending, "message:1:1", 60, None)
    assert done
    assert watched.tick(caplog, logging.DEBUG) == []
    assert watched.runs.client.hmget(JOB, ["status", "attempt"]) == ["finished", "1"]


def test_a_renewal_refused_because_another_attempt_started_says_so(
    watched: Watched, caplog: pytest.LogCaptureFixture
) -> None:
    watched.runs.client.hset(JOB, "status", "dispatched")  # presumed lost, started again
    assert isinstance(watched.runs.start(JOB, TOKEN + "-2", 15_000, "v:1"), dict)
    assert watched.tick(caplog, logging.INFO) == [f"{JOB}: attempt 1 superseded (result refused)"]
    assert watched.cur.next_renew == 1e18  # no renewal of a superseded attempt again

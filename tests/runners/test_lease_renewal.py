"""The lease renewal of a runner's watch thread (node/worker/job.py) tells a superseded attempt
from one that just ended: a tick that read the running attempt just before the main thread
recorded its end is refused by that end, and must not log that the result was refused (a
fault run found "attempt 1 superseded (result refused)" 3 ms after that attempt's result was
recorded and answered)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bus.core.models import RunnerJob
from bus.store.atomic.runs import Ending
from node.slot.joblogs import LogPump
from node.slot.spec import RunnerSpec
from node.worker.job import JobRun, _Current

JOB = "job:1:7"
TOKEN = "n:b:1:v:0:" + JOB


def _spec(redis_url: str, tmp_path: Path) -> RunnerSpec:
    return RunnerSpec(
        url=redis_url,
        ctx=1,
        script_type="v",
        slot=0,
        command=[],
        group="",
        token_base="n:b:1:v:0",
        lease_ttl_ms=15_000,
        run_dir=str(tmp_path),
        max_output_bytes=1000,
        reply_ttl_s=60,
        node_id="n",
        in_process=True,
        max_jobs=10,
    )


@pytest.fixture
def watched(redis_url: str, tmp_path: Path, sync_runs) -> tuple[JobRun, _Current]:  # noqa: ANN001
    """Attempt 1 of a job, started in Valkey, as the watch thread holds it (a renewal due)."""
    sync_runs.client.hset(JOB, mapping={"status": "dispatched", "attempt": "0", "script_type": "v"})
    assert isinstance(sync_runs.start(JOB, TOKEN, 15_000, "v:0"), dict)
    run = JobRun(_spec(redis_url, tmp_path), sync_runs, lambda *_: True)
    job = RunnerJob(7, 1, 1, "print(1)", "v")
    pump = LogPump(sync_runs, JOB, run.logs, 1000, 60)
    cur = _Current(job, None, 1, TOKEN, pump, 1e18, 0.0, 1e18)  # type: ignore[arg-type]
    return run, cur


def _superseded(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "superseded" in r.getMessage()]


def test_a_renewal_refused_by_the_attempts_own_end_logs_no_refusal(
    watched: tuple[JobRun, _Current],
    sync_runs,
    caplog: pytest.LogCaptureFixture,  # noqa: ANN001
) -> None:
    run, cur = watched
    # the main thread: the run is over, then its end is recorded (the result is the job's)
    cur.over = True
    ending = Ending(JOB, 1, "inflight:runner:v:0", "finished", {}, "", "")
    done, _ = sync_runs.finish_local(ending, "message:1:1", 60, None)
    assert done
    with caplog.at_level(logging.DEBUG, logger="node.worker.loop"):
        run._tick(cur)  # the watch thread, which read ``cur`` before the end
    assert _superseded(caplog) == []
    assert sync_runs.client.hmget(JOB, ["status", "attempt"]) == ["finished", "1"]


def test_a_renewal_refused_because_another_attempt_started_says_so(
    watched: tuple[JobRun, _Current],
    sync_runs,
    caplog: pytest.LogCaptureFixture,  # noqa: ANN001
) -> None:
    run, cur = watched
    sync_runs.client.hset(JOB, "status", "dispatched")  # presumed lost, started again
    assert isinstance(sync_runs.start(JOB, TOKEN + "-2", 15_000, "v:1"), dict)
    with caplog.at_level(logging.INFO, logger="node.worker.loop"):
        run._tick(cur)
    assert _superseded(caplog) == [f"{JOB}: attempt 1 superseded (result refused)"]
    assert cur.next_renew == 1e18  # no renewal of a superseded attempt again

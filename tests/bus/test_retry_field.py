"""A retry is a typed field, not a string to parse back (issue 44): a retried job waits with
its reason the failed attempt's (the cause) and ``retry_of`` that attempt, which the next start
clears; the scripts that count it (job statistics, the type's breaker) are handed the cause as
it is. A job hash that waits for a retry as the code before wrote it runs on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bus.core import keys
from bus.core.attempts import AnswerHere, Attempt, Outcome, Retry, RetryPolicy, plan_ending
from bus.core.ids import now_ms
from bus.core.models import JobStatus, Message, RunnerJob
from bus.store.atomic import runs_trio, type_breakers
from bus.store.atomic.runs import ending_of
from bus.store.atomic.runs_sync import SyncRuns

JOB = "job:1:1"
INFLIGHT = "inflight:runner:python:0"
TOKEN = "n:b:1:python:0:" + JOB
STORED = Path(__file__).resolve().parents[1] / "vectors" / "stored-retry-job.json"


def _end(sync_runs: SyncRuns, fields: dict[str, str], outcome: Outcome) -> Any:  # noqa: ANN401
    """End the started attempt of ``fields`` as a runner process does: the plan, executed."""
    job, attempt = RunnerJob.from_hash(fields), int(fields["attempt"])
    request = Message(9, 1, 1, origin="")
    plan = plan_ending(
        job, outcome, Attempt(attempt, TOKEN, 1, 2), RetryPolicy.of(job), request=request, here="n"
    )
    ending = ending_of(plan, JOB, attempt, INFLIGHT)
    if isinstance(plan, Retry):
        assert sync_runs.retry_later(ending, queue=plan.queue, due_ms=1)
    else:
        assert isinstance(plan, AnswerHere)
        done, _ = sync_runs.finish_local(ending, request.key, 60, None, reply_to=plan.reply_to)
        assert done
    return plan


async def _start_due(store, sync_runs: SyncRuns) -> dict[str, str]:  # noqa: ANN001
    assert await runs_trio.move_due(store, 1, now_ms()) == -1
    assert sync_runs.pop_first(["queue:python"], INFLIGHT) == (JOB, 0)
    fields = sync_runs.start(JOB, TOKEN, 10_000, "python:0")
    assert isinstance(fields, dict)
    return fields


async def _stats(store) -> dict[str, str]:  # noqa: ANN001
    return await store.hgetall(1, keys.STATS_JOBS)


async def test_a_retry_is_a_field_and_the_scripts_read_its_cause(store, sync_runs) -> None:
    sync_runs.set_breaker("python", 5, 60_000, 1)
    job = {"id": "1", "caller_id": "1", "context_id": "1", "script": "x", "retries": "1"}
    await store.hset(1, JOB, job | {"script_type": "python", "status": "dispatched"})
    fields = sync_runs.start(JOB, TOKEN, 10_000, "python:0")
    assert isinstance(fields, dict)
    plan = _end(sync_runs, fields, Outcome(JobStatus.ERROR, {}, "exit code 3: boom"))
    assert isinstance(plan, Retry)
    stored = await store.hgetall(1, JOB)
    assert (stored["status"], stored["reason"], stored["retry_of"]) == (
        "dispatched", "exit code 3: boom", "1"
    )  # fmt: skip
    assert (await _stats(store))["ended|python|retry|exit"] == "1"
    assert (await type_breakers.read(store, 1))["python"].failures == 1
    # the next start clears the retry it waited for, in the hash and in what it returns
    again = await _start_due(store, sync_runs)
    assert (again["attempt"], "retry_of" in again) == ("2", False)
    assert "retry_of" not in await store.hgetall(1, JOB)


async def test_a_retry_stored_before_the_field_runs_on(store, sync_runs) -> None:
    """The job hash, delayed entry and attempt record that the code before issue 44 wrote for
    a retry (its cause inside ``reason``'s text): queued when due, started, retried and
    answered by today's code, counted under its causes."""
    old = json.loads(STORED.read_text(encoding="utf-8"))
    await store.hset(1, JOB, old["job"])
    await store.call(1, lambda r: r.zadd(keys.DELAYED, {old["delayed"]["member"]: 1}))
    await store.call(1, lambda r: r.rpush(keys.attempts(JOB), old["attempts"]))
    fields = await _start_due(store, sync_runs)
    assert (fields["status"], fields["attempt"]) == ("started", "2")
    _end(sync_runs, fields, Outcome(JobStatus.ERROR, {}, "timeout: killed after 5 s"))
    stored = await store.hgetall(1, JOB)
    assert (stored["reason"], stored["retry_of"]) == ("timeout: killed after 5 s", "2")
    fields = await _start_due(store, sync_runs)
    plan = _end(sync_runs, fields, Outcome(JobStatus.FINISHED, {"stdout": "1\n"}, ""))
    stored = await store.hgetall(1, JOB)
    assert (stored["status"], stored["attempt"], stored["reason"]) == ("finished", "3", "")
    assert "retry_of" not in stored
    assert len(await store.lrange(1, keys.attempts(JOB))) == 3
    reply = json.loads((await store.lrange(1, keys.reply(plan.body.in_reply_to)))[0])
    assert (reply["status"], reply["result"]["attempts"]) == ("finished", "3")
    stats = await _stats(store)
    assert stats["ended|python|retry|timeout"] == "1"
    assert stats["ended|python|finished|"] == "1"


async def test_an_external_runner_s_retried_job_is_answered_without_its_retry(store) -> None:
    """An external runner starts a job with its own commands, which leave ``retry_of``; the
    results service's answer clears it: a final job never says it waits for a retry."""
    job = {"status": "finished", "attempt": "2", "retry_of": "1", "result": "{}"}
    await store.hset(1, JOB, job)
    read = runs_trio.Answered(JOB, "finished", "2", "")
    args = {"result": {}, "request_key": "message:1:9", "reply": "{}", "reply_ttl_s": 60}
    assert await runs_trio.answer_local(store, 1, read, **args)
    stored = await store.hgetall(1, JOB)
    assert ("answered" in stored, "retry_of" in stored) == (True, False)

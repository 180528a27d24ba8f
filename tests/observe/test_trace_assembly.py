"""The timeline of a job or a flow from the nodes' records (node/observe/trace.py). Pure."""

from __future__ import annotations

import json

from bus.core.traces import flow_dag, message_job_keys
from node.observe.trace import flow_trace, job_trace

ORIGIN, RAN = "a" * 64, "b" * 64
JOB, MSG = "job:1:5", "message:1:9"


def records() -> dict:
    """A job sent from ORIGIN to RAN, failed once there (exit 3) and retried."""
    sent = {"origin": ORIGIN, "destination": RAN, "message_type": "job", "created_at": "100",
            "acked_at": "101"}  # fmt: skip
    got = sent | {"received_at": "101", "received_from": ORIGIN}
    del got["acked_at"]
    attempts = [
        {"attempt": 1, "status": "error", "reason": "exit code 3", "started_at": 102,
         "ended_at": 104},
        {"attempt": 2, "status": "finished", "reason": "", "started_at": 106, "ended_at": 107},
    ]  # fmt: skip
    return {
        ORIGIN: {
            JOB: {"fields": {"status": "finished", "message_key": MSG, "node": RAN,
                             "updated_at": "108"}, "attempts": []},
            MSG: {"fields": sent},
        },
        RAN: {
            JOB: {"fields": {"status": "finished", "message_key": MSG, "origin": ORIGIN,
                             "attempt": "2", "stats_queued_ms": "105500"}, "attempts": attempts},
            MSG: {"fields": got},
        },
    }  # fmt: skip


def test_a_retried_job_shows_each_attempt_where_it_ran_in_time_order():
    trace = job_trace(JOB, records())
    assert (trace.node, trace.status, trace.attempts) == (RAN, "finished", 2)
    hops = [(h.node, h.what, h.attempt, h.outcome) for h in trace.hops]
    assert hops == [
        (ORIGIN, "job message submitted", None, ""),
        (ORIGIN, "acknowledged by destination", None, ""),
        (RAN, "received", None, ""),
        (RAN, "attempt", 1, "error"),
        (RAN, "queued", None, ""),
        (RAN, "attempt", 2, "finished"),
        (ORIGIN, "result received", None, "finished"),
    ]
    durations = [h.duration_s for h in trace.hops]
    assert durations == [None, 1.0, 0.0, 2.0, 3.5, 1.0, 2.0]  # attempts: their own run
    assert trace.hops[3].detail == "exit code 3"


def test_a_job_run_once_has_its_attempt_from_its_hash():
    fields = {"status": "error", "reason": "timeout", "attempt": "1",
              "stats_started_ms": "200250", "updated_at": "203"}  # fmt: skip
    trace = job_trace(JOB, {RAN: {JOB: {"fields": fields, "attempts": []}}})
    [hop] = trace.hops
    assert (hop.what, hop.attempt, hop.outcome, hop.detail) == ("attempt", 1, "error", "timeout")
    assert (hop.at, hop.duration_s) == (200.25, 2.75)


def test_a_flow_is_its_dag_with_the_node_of_each_job():
    doc = {"jobs": [
        {"id": "A", "job_id": 5, "node": RAN, "script": "secret()", "depends": []},
        {"id": "B", "job_id": 6, "node": ORIGIN, "script": "x", "dependends": ["A"]},
    ]}  # fmt: skip
    fields = {"id": "3", "name": "f", "status": "error", "doc": json.dumps(doc)}
    dag = flow_dag(fields)
    assert dag == [
        {"id": "A", "job_id": 5, "node": RAN, "depends": []},
        {"id": "B", "job_id": 6, "node": ORIGIN, "depends": ["A"]},  # the spec's spelling read
    ]
    flow = flow_trace(fields, dag, 1, records())
    jobs = {j["flow_job"]: j for j in flow["jobs"]}
    assert (jobs["A"]["key"], jobs["A"]["node"], jobs["A"]["attempts"]) == (JOB, RAN, 2)
    assert (jobs["B"]["node"], jobs["B"]["status"], jobs["B"]["hops"]) == (
        ORIGIN,
        "not released",
        [],
    )
    assert flow_dag({"doc": "{"}) == []


def test_a_messages_jobs():
    job = '[{"id": 5, "caller_id": 1}, {"id": 6, "caller_id": 1}]'
    assert message_job_keys({"job": job}) == ["job:1:5", "job:1:6"]
    assert message_job_keys({"job": "[{}]"}) == []


def test_hops_of_the_same_second_keep_the_order_a_job_lives_them():
    data = records()
    data[ORIGIN][JOB]["fields"]["updated_at"] = "106"  # the result, in the retry's second
    whats = [h.what for h in job_trace(JOB, data).hops]
    assert whats[-2:] == ["attempt", "result received"]

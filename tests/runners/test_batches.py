"""A runner slot takes what is queued in batches (node/worker/batch.py): up to ``batch_jobs``
python jobs started in one script call, run in one request to the slot's warm sandbox, ended
together in the call that takes the next ones. A job that times out or ends the job process
ends its batch there: the jobs after it are given back uncounted and run once, later.

Each test queues its jobs behind a gate job that holds the slot's only runner, then kills the
gate: its end takes every queued job at once. The control that they ran as a batch is the
starts the slot counted: a job given back is started twice, yet its attempt is its first.
A job that answered is ended and answered while a long one behind it still runs.
"""

from __future__ import annotations

import os
import signal

import trio

from bus.client.api import new_job
from bus.core import keys
from bus.core.envelope import JobResult, parse_reply
from bus.store import records
from crypto import read_key_file
from tests.scripts import announcing, wait_announced, work_file

# a job that leaves one line in its own file in the work dir: it ran exactly once
MARK = "import pathlib\nwith open('ran-{0}', 'a') as f:\n    f.write('x')\nprint('{0}')\n"


async def _submit(node, script: str, **kw):  # noqa: ANN001, ANN202 - a test node, a message
    actor = read_key_file(node.config.actor_key_path)
    return await node.client.submit_job(
        actor, 1, to=node.node_id, context_id=1, script_type="python", script=script, **kw
    )


async def _result(node, msg):  # noqa: ANN001, ANN202
    with trio.fail_after(60):
        [result] = await node.client.wait_results(msg, timeout_s=60)
    return result


async def _starts(node) -> int:  # noqa: ANN001
    stats = await records.job_stats(node.store, 1)  # a runner's starts are in its slot's totals
    return int(stats.get("started|python", 0))


async def _behind_a_gate(node, middle: str, **middle_kw):  # noqa: ANN001, ANN202
    """One message: a gate job, then a, the ``middle`` job, c and d, queued together (one
    script materialises the message). The idle slot takes the gate alone; once it runs, it is
    killed: its end takes the four at once. Their results, in that order."""
    hold = announcing(node.info.redis_url, "gate", "import time\ntime.sleep(600)")
    jobs = [new_job(1, 1, "python", hold), new_job(1, 1, "python", MARK.format("a"))]
    jobs.append(new_job(1, 1, "python", middle, **middle_kw))
    jobs += [new_job(1, 1, "python", MARK.format(n)) for n in "cd"]
    actor = read_key_file(node.config.actor_key_path)
    msg = await node.client.submit(actor, 1, to=node.node_id, context_id=1, jobs=jobs)
    pid = await wait_announced(node.store, "gate")
    os.kill(pid, signal.SIGKILL)  # the job process dies: the gate ends, the take takes all
    with trio.fail_after(60):
        results = await node.client.wait_results(msg, timeout_s=60)
    order = [j.key for j in jobs]
    gate, *rest = sorted(results, key=lambda r: order.index(r.job_key))
    assert not gate.ok
    return rest


async def _ran_once_each(node, results, names: str) -> None:  # noqa: ANN001
    for name, result in zip(names, results, strict=True):
        assert result.ok, result
        assert result.stdout == f"{name}\n"  # its own output
        assert result.result["attempts"] == "1"  # a give-back is no attempt
        assert work_file(node, f"ran-{name}").read_text() == "x"  # it ran exactly once


async def test_a_job_that_times_out_in_a_batch_ends_timeout_and_the_others_end_right(
    node_factory,  # noqa: ANN001
) -> None:
    alice = await node_factory("alice", runners={"python": 1})
    before = await _starts(alice)
    a, b, c, d = await _behind_a_gate(
        alice, "import time\ntime.sleep(600)\nprint('late')", timeout_s=1, retries=0
    )
    assert not b.ok
    assert b.reason.startswith("timeout"), b.reason
    assert b.stdout == ""
    await _ran_once_each(alice, [a, c, d], "acd")
    # the gate, then a, b, c, d started together, then c and d again after their give-back
    assert await _starts(alice) - before == 7


async def test_a_job_that_ends_the_job_process_gives_the_rest_of_its_batch_back(
    node_factory,  # noqa: ANN001
) -> None:
    alice = await node_factory("alice", runners={"python": 1})
    before = await _starts(alice)
    a, b, c, d = await _behind_a_gate(
        alice, "import os, sys\nprint('b', flush=True)\nos._exit(3)", retries=0
    )
    assert not b.ok
    assert b.result["exit_code"] == "3", b
    assert b.stdout == "b\n"
    await _ran_once_each(alice, [a, c, d], "acd")
    assert await _starts(alice) - before == 7


async def test_a_lone_job_is_taken_alone_and_answered_at_once(node_factory) -> None:  # noqa: ANN001
    """k = 1 when one is queued: the slot never waits for a batch to fill."""
    alice = await node_factory("alice", runners={"python": 1})
    before = await _starts(alice)
    result = await _result(alice, await _submit(alice, MARK.format("lone")))
    await _ran_once_each(alice, [result], ["lone"])
    assert await _starts(alice) - before == 1


async def test_batch_jobs_1_takes_one_job_at_a_time(node_factory) -> None:  # noqa: ANN001
    """The setting ``batch_jobs = 1``: the same jobs, none given back (5 starts), the timeout's
    job ends alone and the others as before."""
    alice = await node_factory("alice", runners={"python": 1}, batch_jobs=1)
    before = await _starts(alice)
    a, b, c, d = await _behind_a_gate(
        alice, "import time\ntime.sleep(600)\nprint('late')", timeout_s=1, retries=0
    )
    assert b.reason.startswith("timeout"), b.reason
    await _ran_once_each(alice, [a, c, d], "acd")
    assert await _starts(alice) - before == 5


async def _answers_until(node, msg, job_key: str, got: dict[str, JobResult]) -> JobResult:  # noqa: ANN001
    """Pop ``msg``'s answers into ``got`` until ``job_key``'s has come (bounded)."""
    with trio.fail_after(30):  # generous: a quick job's answer, on a busy machine
        while job_key not in got:
            raw = await records.pop_reply(node.store, 1, keys.reply(msg.key), 30)
            assert raw is not None, f"no answer for {job_key}"
            result = parse_reply(raw)[1]
            got[result.job_key] = result
    return got[job_key]


async def test_a_job_that_answered_is_answered_while_a_long_one_behind_it_runs(
    node_factory,  # noqa: ANN001
) -> None:
    """a (quick) and b (held on a FIFO until the test writes to it) taken in one batch: a's end
    is recorded and its client answered while b still runs; b ends once released."""
    alice = await node_factory("alice", runners={"python": 1})
    before = await _starts(alice)
    url = alice.info.redis_url
    hold = announcing(url, "gate", "import time\ntime.sleep(600)")
    held = announcing(url, "held", "print(open('release').read())")
    gate, a, b = (new_job(1, 1, "python", s) for s in (hold, MARK.format("a"), held))
    actor = read_key_file(alice.config.actor_key_path)
    msg = await alice.client.submit(actor, 1, to=alice.node_id, context_id=1, jobs=[gate, a, b])
    assert not msg.reply_to  # answered on its own reply list, read here answer by answer
    pid = await wait_announced(alice.store, "gate")
    fifo = work_file(alice, "release")
    os.mkfifo(fifo)
    os.chmod(fifo, 0o666)  # noqa: S103 - the sandboxed job's uid reads it
    os.kill(pid, signal.SIGKILL)  # the gate ends: its end takes a and b at once
    got: dict[str, JobResult] = {}
    first = await _answers_until(alice, msg, a.key, got)
    await wait_announced(alice.store, "held")  # b runs, its answer not yet possible
    assert (await alice.store.hgetall(1, b.key))["status"] == "started"
    assert (await alice.store.hgetall(1, a.key))["status"] == "finished"
    assert first.ok, first
    assert first.stdout == "a\n"
    await trio.to_thread.run_sync(fifo.write_text, "b")  # b may end now
    second = await _answers_until(alice, msg, b.key, got)
    assert second.ok, second
    assert second.stdout == "b\n"
    assert [got[j.key].result["attempts"] for j in (a, b)] == ["1", "1"]
    assert work_file(alice, "ran-a").read_text() == "x"
    assert await _starts(alice) - before == 3  # the gate, a and b, each once

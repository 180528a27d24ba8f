"""The circuit breaker per script type (bus/store/atomic/type_breakers.py, lua/type_breaker.lua):
the
Lua state machine replayed against bus/core/breaker.py, which attempts count, the settings,
and a real node whose sh jobs keep failing."""

from __future__ import annotations

import argparse
import random

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from bus.core import keys
from bus.core.breaker import Breaker, BreakerConfig
from bus.core.ids import now_ms
from bus.core.models import JobStatus
from bus.core.reasons import Reason
from bus.store.atomic import BREAKER_NEUTRAL, type_breakers
from bus.store.atomic.runs import NextJob
from bus.store.atomic.type_breakers import BreakerOpen, config_value, parse, verdict
from crypto import read_key_file
from node.cli.status import status, status_facts
from node.config import load_config, render_config
from node.errors import ConfigError
from node.host.home import init_home
from node.observe.metrics import exposition
from node.worker.loop import SlotLoop
from tests.runners.slots import slot_spec

# -- the Lua state machine against the pure one ---------------------------------------------------


def _may_start(b: Breaker, now: float) -> bool:
    """Whether the pure breaker lets an attempt start at ``now`` (without counting it)."""
    return b.attempt(now)[0]


async def test_the_lua_breaker_follows_the_pure_one(store):
    """Random events at random times, applied to the hash by ``type_breaker_event.lua`` (the
    fragment every starting and ending script uses) and to bus/core/breaker.py: the
    fields agree after every event. The model counts in milliseconds (its unit is its
    caller's), so that both compare the same integers."""
    rng = random.Random(14)
    for run in range(60):
        threshold, open_ms, probes = rng.randint(1, 4), rng.randint(1, 5000), rng.randint(1, 3)
        script_type = f"t{run}"
        await store.hset(
            1, keys.TYPE_BREAKERS, {f"{script_type}|cfg": config_value(threshold, open_ms, probes)}
        )
        model, now_ms = Breaker(BreakerConfig(threshold, open_ms, probes)), 1_000_000
        for _ in range(40):
            now_ms += rng.choice([0, 1, rng.randint(0, 3000), rng.randint(0, 8000)])
            now = float(now_ms)
            event = rng.choice(["fail", "fail", "ok", "release", "take", "take"])
            got = await type_breakers.apply_event(
                store, 1, script_type, event, now_ms, job_key=f"job:1:{run}"
            )
            if event == "take":
                allowed, model = model.attempt(now)
                assert (got >= 0) == allowed, (run, event, now_ms)
            else:
                model = {"fail": model.failed, "ok": model.succeeded, "release": model.released}[
                    event
                ](now)
                assert (got == 0) == _may_start(model, now), (run, event, now_ms)
            fields = await store.hgetall(1, keys.TYPE_BREAKERS)
            read = parse(fields, now_ms)[script_type]
            opened = None if model.opened_at is None else int(model.opened_at)
            assert (read.failures, read.opened_ms, read.probing) == (
                model.failures,
                opened,
                model.probing,
            ), (run, event, now_ms)
            assert read.state == model.state(now).value


async def test_a_type_without_a_threshold_has_no_breaker(store):
    await store.hset(1, keys.TYPE_BREAKERS, {"sh|cfg": config_value(0, 1000, 1)})
    for _ in range(3):
        assert await type_breakers.apply_event(store, 1, "sh", "fail", 5000) == 0
    assert await type_breakers.apply_event(store, 1, "sh", "take", 5000, "job:1:1") == 0
    assert await type_breakers.read(store, 1) == {}


# -- which attempts count -----------------------------------------------------------------------

REASON_TEXT = st.text(st.characters(codec="utf-8"), max_size=30)


@given(st.integers(1, 255), REASON_TEXT)
def test_failed_scripts_timeouts_and_lost_runners_count(code, detail):
    assert verdict("error", f"exit code {code}") == "fail"
    assert verdict("retry", f"exit code {code}") == "fail"  # a retry's reason: its cause
    assert verdict("error", f"{Reason.TIMEOUT}: {detail}") == "fail"
    assert verdict("error", f"{Reason.RUNNER_LOST}: {detail}") == "fail"
    assert verdict("error", f"cannot start runner: {detail}") == "fail"
    assert verdict("finished", detail) == "ok"


@given(st.sampled_from(BREAKER_NEUTRAL), REASON_TEXT)
def test_stops_and_refusals_are_no_verdict(reason, detail):
    assert reason not in (Reason.TIMEOUT, Reason.RUNNER_LOST)
    assert verdict("error", f"{reason}: {detail}") == ""
    assert verdict("retry", f"{reason}: {detail}") == ""
    assert verdict("requeued", detail) == ""


@given(
    st.integers(0, 20), st.integers(0, 10**6), st.integers(0, 5), st.integers(0, 9), st.booleans()
)
def test_parse_reads_what_the_scripts_write(threshold, open_ms, probes, failures, opened):
    fields = {
        "sh|cfg": config_value(threshold, open_ms, probes),
        "sh|failures": str(failures),
        "sh|opened_ms": "5000" if opened else "",
        "sh|probing": "0",
        "junk|cfg": "not,a,config",
    }
    read = parse(fields, 5000 + open_ms)
    if threshold == 0:
        assert read == {}
        return
    breaker = read["sh"]
    assert (breaker.threshold, breaker.open_ms, breaker.probes) == (
        threshold,
        open_ms,
        max(1, probes),
    )
    assert breaker.failures == failures
    assert breaker.state == ("half_open" if opened else "closed")
    assert ("opened_at" in breaker.to_json()) is opened


@given(st.one_of(st.text(), st.binary().map(lambda b: b.decode("latin-1"))))
def test_only_a_breaker_answer_reads_as_a_wait(answer):
    """A refusal token or any entry never passes for ``breaker_open:<ms>`` (and never raises)."""
    tail = answer.removeprefix("breaker_open:")
    opened = answer.startswith("breaker_open:") and tail.isascii() and tail.isdigit()
    expected = int(tail) if opened else None
    assert type_breakers.open_wait(answer) == expected
    assert type_breakers.open_wait("breaker_open:2500") == 2500
    assert type_breakers.open_wait(b"breaker_open:7") == 7
    for token in ("missing_hash", "wrong_type", "malformed_job", ""):
        assert type_breakers.open_wait(token) is None


# -- settings ------------------------------------------------------------------------------------


def test_settings_round_trip_and_are_checked(tmp_path):
    config = init_home(tmp_path / "n", name="n", listen_port=0, console_listen="")
    assert (config.type_breaker_failures, config.type_breaker_open_s) == (5, 10.0)
    text = render_config(config).replace("type_breaker_failures = 5", "type_breaker_failures = 0")
    config.config_path.write_text(text)
    assert load_config(config.home).type_breaker_failures == 0
    for bad in ("type_breaker_failures = -1", "type_breaker_probes = 0", "type_breaker_open_s = 0"):
        name = bad.split(" ")[0]
        lines = [ln for ln in text.splitlines() if not ln.startswith(f"{name} =")]
        config.config_path.write_text("\n".join(lines).replace("[node]\n", f"[node]\n{bad}\n", 1))
        with pytest.raises(ConfigError, match=f"{name} must be at least"):
            load_config(config.home)


# -- a real node ---------------------------------------------------------------------------------

OPEN_S = 3.0


async def _run(node, script: str):  # noqa: ANN001 - conftest.RunningNode
    actor = read_key_file(node.config.actor_key_path)
    return await node.client.submit_job(
        actor, 1, to=node.node_id, context_id=1, script_type="sh", script=script
    )


async def _result(node, msg, timeout_s: float = 20):  # noqa: ANN001
    with trio.fail_after(timeout_s + 5):
        [res] = await node.client.wait_results(msg, timeout_s)
    return res


async def _started_ms(node, job_key: str) -> int:  # noqa: ANN001
    return int((await node.store.hgetall(1, job_key))["stats_started_ms"])


async def _queued_then_started(node, job_key: str) -> tuple[int, int]:  # noqa: ANN001
    """When the job was queued and when its attempt started (Valkey's clock, ms)."""
    job = await node.store.hgetall(1, job_key)
    return int(job["stats_queued_ms"]), int(job["stats_started_ms"])


async def test_failing_jobs_open_it_queued_jobs_wait_probes_decide(node_factory, capsys):
    """Two sh runner processes share the breaker. The runner processes are real processes on
    Valkey's clock, so trio's autojump clock cannot drive them: the cool-down is kept short
    (OPEN_S) and the waits are checked against the times Valkey stamped (when the breaker
    opened, when each job was queued and started), not against sleeps."""
    alice = await node_factory(
        "alice",
        runners={"python": 1, "sh": 2},
        type_breaker_failures=2,
        type_breaker_open_s=OPEN_S,
        type_breaker_probes=1,
    )
    for _ in range(2):
        res = await _result(alice, await _run(alice, "exit 3"))
        assert res.status is JobStatus.ERROR
    breaker = (await type_breakers.read(alice.store, 1))["sh"]
    assert (breaker.state, breaker.failures) == ("open", 2)
    first_open = breaker.opened_ms
    assert first_open is not None

    facts = await status_facts(alice.client)
    assert facts["contexts"][1]["type_breakers"]["sh"]["state"] == "open"
    as_cli = argparse.Namespace(home=alice.config.home, json=False)
    assert await status(alice.client, as_cli) == 0
    assert "breaker of sh open since" in capsys.readouterr().out
    body, _ = await exposition(alice.info.state)
    samples = {
        (s.name, s.labels.get("type"), s.labels.get("state")): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert samples[("hero_type_breaker_state", "sh", "open")] == 1
    assert samples[("hero_type_breaker_state", "sh", "closed")] == 0
    assert samples[("hero_type_breaker_failures", "sh", None)] == 2

    # another type does not wait for sh's breaker
    actor = read_key_file(alice.config.actor_key_path)
    python = await alice.client.submit_job(
        actor, 1, to=alice.node_id, context_id=1, script_type="python", script="print(1)"
    )
    ran = await _result(alice, python)
    assert ran.ok
    assert await _started_ms(alice, ran.job_key) < first_open + OPEN_S * 1000

    # a job queued while it is open waits in the queue; run after the cool-down, as the one
    # probe, it fails: the breaker opens again
    res = await _result(alice, await _run(alice, "exit 4"))
    assert res.status is JobStatus.ERROR
    queued, started = await _queued_then_started(alice, res.job_key)
    assert queued < first_open + OPEN_S * 1000 <= started
    breaker = (await type_breakers.read(alice.store, 1))["sh"]
    assert breaker.state == "open"
    assert breaker.opened_ms is not None
    assert breaker.opened_ms > first_open
    assert breaker.failures == 3

    # the next probe succeeds: closed, and jobs run at once again
    ok = await _result(alice, await _run(alice, "echo fine"))
    assert ok.ok, ok
    queued, started = await _queued_then_started(alice, ok.job_key)
    assert queued < breaker.opened_ms + OPEN_S * 1000 <= started
    after = (await type_breakers.read(alice.store, 1))["sh"]
    assert (after.state, after.failures, after.probing) == ("closed", 0, 0)
    again = await _result(alice, await _run(alice, "echo again"), timeout_s=OPEN_S)
    assert again.ok


async def test_a_popped_job_of_an_open_type_goes_back_to_its_queue_untouched(
    store, redis_url, tmp_path
):
    """The start after a pop (``runs_start``) refuses while the breaker is open: the runner
    puts the entry back at the consuming end of the list it came from and waits."""
    spec = slot_spec(
        redis_url, tmp_path, pop_timeout_s=1.0, breaker_failures=1, breaker_open_ms=60_000
    )
    runner = SlotLoop(spec, b"k" * 32)
    runner.runs.set_breaker("v", 1, 60_000, 1)
    assert await type_breakers.apply_event(store, 1, "v", "fail", now_ms()) > 0
    job = {"status": "dispatched", "attempt": "0", "script_type": "v", "priority": "high"}
    await store.hset(1, "job:1:1", job)
    await store.lpush(1, "queue:v:prio:high", "job:1:0", "job:1:1")
    lists = ["queue:v:prio:high", "queue:v", "queue:v:prio:low"]
    assert runner.popper.pop(lists, check_first=True) == ("job:1:0", None)
    nxt = NextJob(tuple(lists), spec.token_base, spec.lease_ttl_ms, spec.slot_id, script_type="v")
    assert runner.run_job("job:1:0", None, nxt) == []  # job:1:0 has no hash: refused alone
    assert runner.popper.pop(lists, check_first=True) == ("job:1:1", None)
    assert runner.run_job("job:1:1", None, nxt) == []
    assert await store.lrange(1, "queue:v:prio:high") == ["job:1:1"]
    assert await store.llen(1, spec.inflight) == 0
    assert await store.hgetall(1, "job:1:1") == job
    assert 50_000 < runner.popper.breaker_wait_ms <= 60_000
    # the blocking pop's pipelined start is refused the same way: back to its queue, untouched
    await store.hset(1, "job:1:2", job | {"priority": ""})
    await store.lpush(1, "queue:v", "job:1:2")
    popped = runner.popper.pop(lists, check_first=False, held=0)
    assert popped is not None
    assert popped[0] == "job:1:2"
    assert isinstance(popped[1], BreakerOpen)
    assert runner.run_job("job:1:2", popped[1], nxt) == []
    assert await store.lrange(1, "queue:v") == ["job:1:2"]
    assert await store.llen(1, spec.inflight) == 0
    assert await store.hgetall(1, "job:1:2") == job | {"priority": ""}

"""Prometheus metrics: running nodes run jobs (a success, a failure, a refusal, one across a
link), then their exposition is parsed as Prometheus would and the families are checked."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import redis
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from trio_websocket import ConnectionClosed

from bus.core import keys
from bus.core.models import JobStatus
from bus.core.stats import StatsBatch, merged_fields, reason_token, type_label
from bus.errors import HandshakeError
from bus.store import records
from bus.store.atomic import runs, runs_trio, script, source
from bus.store.atomic.runs_sync import SyncRuns, connect
from bus.store.connection import open_store
from bus.wire.transport import Transport
from crypto import KeyPair, read_key_file
from node.config.console import ConsoleConfig
from node.host.acl import NODE, RUNNER, role_url
from tests.console_http import get
from tests.nodes import link_to

Labels = tuple[tuple[str, str], ...]
Samples = dict[str, dict[Labels, float]]
SERVED = ConsoleConfig(listen="127.0.0.1:0")  # scraped over HTTP, as Prometheus does


async def scrape(node) -> tuple[Samples, set[str]]:  # noqa: ANN001 - conftest.RunningNode
    """The node's ``GET /metrics`` as Prometheus parses them: sample name -> labels -> value,
    and the names and types of the families (``name:type``)."""
    status, headers, body = await get(node.info.console_url + "/metrics")
    assert status == 200, body
    kind = {k.lower(): v for k, v in headers.items()}["content-type"]
    assert kind.startswith("text/plain; version=")
    samples: Samples = {}
    families = set()
    for family in text_string_to_metric_families(body.decode()):
        families.add(f"{family.name}:{family.type}")
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples, families


def value(samples: Samples, metric: str, **labels: str) -> float:
    return samples.get(metric, {}).get(tuple(sorted(labels.items())), 0.0)


async def run_jobs(alice, bob) -> None:  # noqa: ANN001
    """On alice: a python job that finishes, an sh job that fails twice (one retry), a
    message signed with a key that is not its actor's (refused); to bob: a python job."""
    actor = await link_to(alice, bob)
    stranger = KeyPair.generate()
    with trio.fail_after(30):
        ok = await alice.client.submit_job(
            actor, 1, to="self", context_id=1, script_type="python", script="print(1)"
        )
        bad = await alice.client.submit_job(
            actor, 1, to="self", context_id=1, script_type="sh", script="exit 3", retries=1
        )
        forged = await alice.client.submit_job(
            stranger, 1, to="self", context_id=1, script_type="python", script="print(2)"
        )
        remote = await alice.client.submit_job(
            actor, 1, to=bob.node_id, context_id=1, script_type="python", script="print(3)"
        )
        outcomes = [(await alice.client.wait_results(m, 25))[0] for m in (ok, bad, forged, remote)]
    assert [r.status for r in outcomes] == [
        JobStatus.FINISHED,
        JobStatus.ERROR,
        JobStatus.ERROR,
        JobStatus.FINISHED,
    ]
    assert outcomes[2].reason.startswith("wrong_signer")


async def test_a_scrape_shows_jobs_queues_links_and_refusals(node_factory):
    alice = await node_factory("alice", console=SERVED)
    bob = await node_factory("bob", console=SERVED)
    await run_jobs(alice, bob)
    a, families = await scrape(alice)
    py, sh = {"ctx": "1", "type": "python"}, {"ctx": "1", "type": "sh"}
    # jobs at the origin: submitted, run here, answered (the refusal too, with its reason)
    assert value(a, "hero_jobs_submitted_total", **py) == 3
    assert value(a, "hero_jobs_submitted_total", **sh) == 1
    assert value(a, "hero_jobs_started_total", **py) == 1
    assert value(a, "hero_jobs_finished_total", **py) == 1
    assert value(a, "hero_jobs_failed_total", **sh, reason="exit") == 1
    assert value(a, "hero_jobs_retried_total", **sh, reason="exit") == 1
    assert value(a, "hero_jobs_started_total", **sh) == 2
    assert value(a, "hero_job_duration_seconds_count", **sh) == 2
    assert value(a, "hero_jobs_answered_total", **py, status="finished", reason="") == 2
    assert value(a, "hero_jobs_answered_total", **py, status="error", reason="wrong_signer") == 1
    assert value(a, "hero_job_duration_seconds_count", **py) == 1
    assert value(a, "hero_job_duration_seconds_bucket", **py, le="+Inf") == 1
    assert value(a, "hero_job_round_trip_seconds_count", **py) == 3
    assert value(a, "hero_job_round_trip_seconds_count", **sh) == 1
    buckets = [
        v for k, v in a["hero_job_round_trip_seconds_bucket"].items() if ("type", "python") in k
    ]
    assert buckets == sorted(buckets)  # cumulative
    assert value(a, "hero_job_round_trip_seconds_sum", **py) > 0
    # refusals and verifications
    assert value(a, "hero_messages_refused_total", reason="wrong_signer") == 1
    assert value(a, "hero_signature_verifications_total", result="wrong_signer") == 1
    assert value(a, "hero_signature_verifications_total", result="ok") >= 4
    # bob verified alice's job message; the result his signer signed for his runner he routed
    # without verifying it again (node/host/signer.py: the signer's notices)
    b, _ = await scrape(bob)
    assert value(b, "hero_signature_verifications_total", result="ok") == 1
    # queues read at scrape time
    assert value(a, "hero_queue_depth", ctx="1", queue="dlq") == 1
    assert value(a, "hero_queue_depth", ctx="1", queue="msg_out") == 0
    assert a["hero_queue_depth"][(("ctx", "1"), ("queue", "queue:python"))] == 0  # empty: shown
    assert value(a, "hero_runner_slots", ctx="1", type="python", state="idle") == 2
    assert value(a, "hero_runner_slots", ctx="1", type="sh", state="busy") == 0
    assert value(a, "hero_valkey_ping_seconds") > 0
    # the link to bob
    peer = {"peer": bob.node_id, "name": "bob"}
    assert value(a, "hero_link_up", **peer) == 1
    assert value(a, "hero_outbox_depth", **peer, state="pending") == 0
    assert value(a, "hero_link_frames_total", **peer, direction="out") >= 1
    assert value(a, "hero_link_frames_total", **peer, direction="in") >= 2  # ack, result
    assert value(a, "hero_link_bytes_total", **peer, direction="out") > 100
    assert value(a, "hero_link_acks_total", direction="received", kind="ack") >= 1
    assert value(a, "hero_link_acks_total", direction="sent", kind="ack") >= 1  # the result
    assert {
        "hero_jobs_submitted:counter",
        "hero_job_duration_seconds:histogram",
        "hero_queue_depth:gauge",
        "hero_link_refusals:counter",
        "hero_service_restarts:counter",
    } <= families
    # bob ran alice's job: received, started, finished there
    b, _ = await scrape(bob)
    assert value(b, "hero_jobs_received_total", **py) == 1
    assert value(b, "hero_jobs_submitted_total", **py) == 0
    assert value(b, "hero_jobs_finished_total", **py) == 1
    assert value(b, "hero_job_duration_seconds_count", **py) == 1
    assert value(b, "hero_link_acks_total", direction="sent", kind="ack") >= 1


async def _ignore(*_: object) -> None:
    return None


async def test_link_refusals_are_counted_by_reason(node_factory):
    alice = await node_factory("alice", console=SERVED)
    bob = await node_factory("bob", console=SERVED)
    await alice.client.add_peer(bob.node_id, "", name="bob")  # known, never linked
    # a node bob does not know dials him: he refuses the handshake (unknown_node)
    stranger = Transport(KeyPair.generate(), lambda: {bob.node_id}, _ignore, _ignore)
    with trio.fail_after(10), pytest.raises((HandshakeError, ConnectionClosed)):
        await stranger._dial_once(bob.node_id, bob.info.ws_url)
    b, _ = await scrape(bob)
    assert value(b, "hero_link_refusals_total", stage="handshake", reason="unknown_node") == 1
    await alice.info.state.peers.load_peers(
        alice.info.state.store
    )  # as the registry watcher does on its event
    a, _ = await scrape(alice)
    assert a["hero_link_up"][(("name", "bob"), ("peer", bob.node_id))] == 0


async def test_runner_credentials_may_keep_the_job_statistics(node_factory):
    """A runner process connected as the ``runner`` user ends a job with a script that counts
    it in stats:jobs (Valkey's TIME, the hash): its rights allow that."""
    alice = await node_factory(
        "alice", embedded=True, runners={"python": 1, "ext": 0}, console=SERVED
    )
    actor = read_key_file(alice.config.actor_key_path)
    inflight = keys.runner_inflight("x")
    # the runner user may not SCRIPT LOAD: the node loads its scripts
    await alice.store.call(1, lambda r: r.script_load(source("runs_malformed")))
    runner_url = role_url(alice.config, alice.info.redis_url, RUNNER)
    as_node = SyncRuns(connect(role_url(alice.config, alice.info.redis_url, NODE), 1))
    as_runner = SyncRuns(connect(runner_url, 1))
    with trio.fail_after(30):
        async with open_store(runner_url) as runner:
            await alice.client.submit_job(
                actor, 1, to="self", context_id=1, script_type="ext", script="say 1"
            )
            key = await runner.call(
                1, lambda r: r.blmove(keys.queue("ext"), inflight, "RIGHT", "LEFT", 20)
            )
        fields = as_node.start(key, "x:1", 15000, "x")
        assert isinstance(fields, dict)
        assert fields["attempt"] == "1"
        assert as_runner.finish_malformed(key, 1, inflight, "a test")
    as_node.client.close()
    as_runner.client.close()
    a, _ = await scrape(alice)
    ext = {"ctx": "1", "type": "ext"}
    assert value(a, "hero_jobs_started_total", **ext) == 1
    assert value(a, "hero_jobs_failed_total", **ext, reason="malformed_job") == 1
    assert value(a, "hero_job_duration_seconds_count", **ext) == 1


async def test_job_statistics_keep_their_labels_few(store, sync_runs):
    """Labels come from what runners write: a type is cut at a character no type name has, a
    reason at its first word, and a retry counts under the reason of its attempt."""
    job = "job:1:1"
    await store.hset(1, job, {"status": "dispatched", "script_type": "v-lang.2|x", "attempt": "0"})
    assert isinstance(sync_runs.start(job, "t", 15000, ""), dict)
    cause = "exit code 3: boom"  # the failed attempt's reason: the retry's cause
    inflight = keys.inflight("r")
    ok = await runs_trio.retry_later(
        store, 1, job, 1, inflight, queue="queue:v", cause=cause, entry="{}", due_ms=1
    )
    assert ok
    stats = await store.hgetall(1, keys.STATS_JOBS)
    assert stats["started|v-lang.2"] == "1"
    assert stats["ended|v-lang.2|retry|exit"] == "1"
    assert sum(int(v) for k, v in stats.items() if k.startswith("duration|v-lang.2|")) == 1
    assert float(stats["duration_sum|v-lang.2"]) >= 0


async def _end_twice(  # noqa: ANN202
    store,  # noqa: ANN001
    redis_url: str,
    ctx: int,
    *,
    by_runner: bool,
    slot: str = "",
):
    """A job that fails once (retry) then fails for good, answered here; counted by the
    scripts, or by the caller as a runner process does: as increments, or (``slot``) as that
    slot's totals. Returns the totals."""
    totals = StatsBatch()
    job = f"job:1:{ctx}"
    queued = {"stats_queued_ms": "1000", "script_type": "v-lang.2|x", "status": "dispatched"}
    await store.hset(ctx, job, queued | {"attempt": "0"})
    inflight = keys.inflight("r")
    sync_runs = SyncRuns(connect(redis_url, ctx))
    for attempt, status, reason in (
        (1, "retry", "exit code 3: boom"),  # a retry's reason is its cause
        (2, "error", "timeout_run: 5 s"),
    ):
        fields = sync_runs.start(job, "t", 15000, "", counted=by_runner)
        assert isinstance(fields, dict)
        ending = runs.Ending(job, attempt, inflight, status, {}, reason, "{}")
        batch = StatsBatch()
        if by_runner:
            batch.started(fields)
            batch.ended(fields, status, reason, 0.001)
            if status != "retry":
                batch.answered(fields, status, reason, 0.001)
        if slot:
            totals = totals.merged(batch)
            handed = totals.handover(slot)
        else:
            handed = batch.encode() if by_runner else ""
        if status == "retry":
            call = runs.retry_call(
                ending,
                queue="queue:v",
                due_ms=1,
                stats=handed,
            )
        else:
            call = runs.finish_local_call(
                ending,
                request_key="message:1:1",
                reply_ttl_s=60,
                stats=handed,
            )
        name, key_list, args = call
        assert await store.script(ctx, script(name), key_list, args) == 1
    sync_runs.client.close()
    return totals


def _labels(stats: dict[str, str]) -> Counter[str]:
    """The counts by field, a histogram's buckets summed and its sum left out (they depend on
    the durations)."""
    out: Counter[str] = Counter()
    for name, n in stats.items():
        if "_sum|" in name:
            continue
        if name.startswith(("duration|", "roundtrip|")):
            name = name.rsplit("|", 1)[0]
        out[name] += int(n)
    return out


async def test_a_runner_counts_what_the_scripts_count(store, redis_url):
    """A runner process counts the ends and answers of its attempts in its memory
    (bus/core/stats.py) and hands the sums to its ending scripts: the same fields and
    counts as the scripts' own counting (bucket and sums aside, which depend on durations)."""
    await _end_twice(store, redis_url, 1, by_runner=False)
    await _end_twice(store, redis_url, 2, by_runner=True)
    by_scripts = await store.hgetall(1, keys.STATS_JOBS)
    by_runner = await store.hgetall(2, keys.STATS_JOBS)
    assert _labels(by_runner) == _labels(by_scripts)
    assert set(by_runner) >= {"duration_sum|v-lang.2", "roundtrip_sum|v-lang.2"}
    counted = _labels(by_runner)
    assert counted["ended|v-lang.2|retry|exit"] == counted["roundtrip|v-lang.2"] == 1
    assert counted["answered|v-lang.2|error|timeout_run"] == counted["duration|v-lang.2"] - 1


def _calls(redis_url: str) -> Counter[str]:
    stats = redis.Redis.from_url(redis_url).info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})


async def test_a_runner_hands_its_slot_totals_over_in_one_write(store, redis_url):
    """A runner process hands its counts over as its slot's totals: one field set in one
    HSET, not an HINCRBY per figure; a reader adds them to the scripts' own counts, to the
    same figures; handed over again (a reply lost), they count once; the slot's next process
    goes on from them; a field no runner wrote is left out."""
    await _end_twice(store, redis_url, 1, by_runner=False)
    before = _calls(redis_url)
    totals = await _end_twice(store, redis_url, 2, by_runner=True, slot="v:0")
    calls = _calls(redis_url) - before
    assert calls["hincrby"] == 0  # the starts too are in the runner's sums
    assert calls["hincrbyfloat"] == 0
    raw = await store.hgetall(2, keys.STATS_JOBS)
    assert set(raw) == {"runner|v:0"}
    by_scripts = await records.job_stats(store, 1)
    by_runner = await records.job_stats(store, 2)
    assert _labels(by_runner) == _labels(by_scripts)
    assert float(by_runner["duration_sum|v-lang.2"]) == pytest.approx(0.002)
    # the same totals again (an ending script whose reply was lost is not run twice, the
    # idle hand-over is), then what the slot's next process reads at its start
    sync_runs = SyncRuns(connect(redis_url, 2))
    sync_runs.add_stats(totals, "v:0")
    assert await records.job_stats(store, 2) == by_runner
    assert sync_runs.slot_totals("v:0").figures() == totals.figures()
    # fields no runner process wrote: skipped by readers, written over by the slot's runner
    await store.hset(2, keys.STATS_JOBS, {"runner|v:1": "[1, 2]", "runner|v:2": '{"a": "x"}'})
    await store.hset(2, keys.STATS_JOBS, {"ended|v|finished|": "many", "roundtrip_sum|v": "nan"})
    assert await records.job_stats(store, 2) == by_runner
    assert not sync_runs.slot_totals("v:1").figures()
    sync_runs.client.close()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["ended|p|finished|", "duration|p|0.1", "duration_sum|p", "x|y"]),
            st.integers(0, 10**6),
        ),
        max_size=4,
    ),
    st.dictionaries(st.sampled_from(["submitted|p", "ended|p|finished|"]), st.integers(0, 99)),
)
def test_merged_fields_add_every_slot_to_the_plain_fields(slots, plain):
    """merged_fields: each figure is the plain field plus every slot's, whatever the order."""
    stats = {k: str(v) for k, v in plain.items()}
    expected: Counter[str] = Counter(plain)
    for i, figures in enumerate(slots):
        batch = StatsBatch()
        for name, n in figures.items():
            if "_sum|" in name:
                batch.sums[name] = n / 8
            else:
                batch.counts[name] = n
        field, _, value = batch.handover(f"s:{i}")[1:].partition("\t")
        stats[field] = value
        expected.update({k: v / 8 if "_sum|" in k else v for k, v in figures.items()})
    merged = merged_fields(stats)
    assert {k: float(v) for k, v in merged.items()} == {k: float(v) for k, v in expected.items()}


_FIGURE = st.sampled_from(["ended|p|finished|", "duration|p|0.1", "x|y", "answered|p|error|t"])
_SUM = st.sampled_from(["duration_sum|p", "roundtrip_sum|p"])


def _batch(counts: dict[str, int], sums: dict[str, float], jobs: int) -> StatsBatch:
    return StatsBatch(Counter(counts), dict(sums), jobs)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(_FIGURE, st.integers(-5, 10**6)),
    st.dictionaries(_SUM, st.floats(0, 1e6)),
    st.dictionaries(_FIGURE, st.integers(-5, 10**6)),
    st.dictionaries(_SUM, st.floats(0, 1e6)),
    st.integers(0, 99),
    st.integers(0, 99),
)
def test_merged_batches_add_as_counters_do(counts, sums, counts2, sums2, jobs, jobs2):
    """StatsBatch.merged: the counts as Counter addition gives them (a figure not above zero
    left out: a slot's totals read back may hold one), the sums added, the jobs added; copy
    and merged change neither batch."""
    one, two = _batch(counts, sums, jobs), _batch(counts2, sums2, jobs2)
    both = one.merged(two)
    assert both.counts == Counter(counts) + Counter(counts2)
    assert list(both.counts) == list(Counter(counts) + Counter(counts2))  # the handover's order
    expected = dict(sums)
    for k, v in sums2.items():
        expected[k] = expected.get(k, 0.0) + v
    assert both.sums == expected
    assert both.jobs == jobs + jobs2
    copied = one.copy()
    copied.counts["x|y"] += 1
    copied.sums["duration_sum|p"] = -1.0
    assert (one.counts, one.sums) == (Counter(counts), sums)
    assert (two.counts, two.sums) == (Counter(counts2), sums2)


_ANY_CHAR = st.sampled_from("abz_09AZ.-:| \u00e9")
# a long run of token characters first, so that the cuts at 40 and 64 are reached
_LABEL_TEXT = st.one_of(
    st.text(_ANY_CHAR, max_size=90),
    st.builds(
        str.__add__,
        st.text(st.sampled_from("abz_09"), min_size=35, max_size=80),
        st.text(_ANY_CHAR, max_size=10),
    ),
)


@settings(max_examples=500, deadline=None)
@given(_LABEL_TEXT)
def test_labels_are_the_lua_scripts_patterns_cut(text):
    """type_label and reason_token (remembered by the prefix that decides them) give what
    stats_jobs.lua's stats_type and stats_token give: the longest prefix of [runners] name
    characters, at most 64, and of token characters, at most 40."""
    name = re.match(r"[A-Za-z0-9_.\-]*", text)
    token = re.match(r"[a-z0-9_]*", text)
    assert type_label(text) == (name.group(0)[:64] if name else "")
    assert reason_token(text) == (token.group(0)[:40] if token else "")


async def test_statistics_never_stop_the_transition_that_counts_them(store, sync_runs):
    """The runner user may write stats:jobs: a field that holds no number, and a ``stats``
    argument no runner writes, make their increments fail alone; the attempt still starts
    and ends, with everything else it writes."""
    await store.hset(1, keys.STATS_JOBS, {"started|v": "many", "ended|v|finished|": "x"})
    inflight = keys.inflight("r")
    arguments = ("", "=no tab", "[not json", '["ended|v|finished|", "1.5", 3, "x", "a|b", "1"]')
    for n, stats in enumerate(arguments):
        job = f"job:1:{n}"
        await store.hset(1, job, {"status": "dispatched", "script_type": "v", "attempt": "0"})
        assert isinstance(sync_runs.start(job, "t", 15000, ""), dict)
        ending = runs.Ending(job, 1, inflight, "finished", {}, "", "{}")
        name, key_list, args = runs.finish_local_call(
            ending, request_key=f"message:1:{n}", reply_ttl_s=60, stats=stats
        )
        assert await store.script(1, script(name), key_list, args) == 1
        assert (await store.hgetall(1, job))["status"] == "finished"
        assert (await store.hgetall(1, f"message:1:{n}"))["status"] == "processed"
    counted = await store.hgetall(1, keys.STATS_JOBS)
    assert counted["started|v"] == "many"  # what it held, untouched
    assert counted["a|b"] == "1"  # the well-formed pair of the last argument
    merged = await records.job_stats(store, 1)  # a scrape skips what holds no number
    assert "started|v" not in merged
    assert "ended|v|finished|" not in merged
    assert merged["answered|v|finished|"] == "1"  # the end the scripts counted themselves

"""The per-peer circuit breaker: the pure state machine (property tests against a model), its
wiring (node/links/peer_breakers.py) on trio's clock, and a real node whose peer is down."""

from __future__ import annotations

import json
import socket

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from bus.core import keys
from bus.core.breaker import Breaker, BreakerConfig, BreakerState
from bus.core.models import JobStatus
from bus.wire.breakers import PeerBreakers
from crypto import read_key_file
from node.cli.status import status_facts
from node.links.peer_breakers import BREAKERS_FIELD, PUBLISH_EVERY_S

EVENTS = st.lists(
    st.tuples(st.sampled_from(["fail", "ok", "attempt"]), st.floats(0, 20)), max_size=60
)


@given(EVENTS, st.integers(1, 5), st.floats(0.5, 30), st.integers(1, 3))
def test_breaker_follows_its_model(events, threshold, open_s, probes):
    """A straightforward model of closed / open / half-open, replayed event by event."""
    config = BreakerConfig(threshold, open_s, probes)
    breaker, clock = Breaker(config), 0.0
    failures, opened_at, probing = 0, None, 0
    for kind, step in events:
        clock += step
        if opened_at is None:
            expected = BreakerState.CLOSED
        elif clock < opened_at + open_s:
            expected = BreakerState.OPEN
        else:
            expected = BreakerState.HALF_OPEN
        assert breaker.state(clock) is expected
        if kind == "ok":
            breaker, failures, opened_at, probing = breaker.succeeded(clock), 0, None, 0
        elif kind == "fail":
            breaker = breaker.failed(clock)
            failures += 1
            if expected is BreakerState.HALF_OPEN or (
                expected is BreakerState.CLOSED and failures >= threshold
            ):
                opened_at, probing = clock, 0
        else:
            allowed, breaker = breaker.attempt(clock)
            model = expected is BreakerState.CLOSED or (
                expected is BreakerState.HALF_OPEN and probing < probes
            )
            assert allowed == model
            if allowed and expected is BreakerState.HALF_OPEN:
                probing += 1
        assert (breaker.failures, breaker.opened_at, breaker.probing) == (
            failures,
            opened_at,
            probing,
        )


@given(st.integers(1, 10), st.floats(0.1, 100))
def test_threshold_failures_open_it_and_a_success_closes_it(threshold, open_s):
    breaker = Breaker(BreakerConfig(threshold, open_s))
    for n in range(threshold):
        assert breaker.state(float(n)) is BreakerState.CLOSED
        breaker = breaker.failed(float(n))
    opened = float(threshold - 1)
    assert breaker.state(opened) is BreakerState.OPEN
    assert breaker.probe_at() == opened + open_s
    assert not breaker.attempt(opened + open_s / 2)[0]
    allowed, probing = breaker.attempt(opened + open_s)
    assert allowed
    assert not probing.attempt(opened + open_s)[0]  # one probe at a time
    assert probing.failed(opened + open_s).state(opened + open_s) is BreakerState.OPEN
    assert probing.succeeded(opened + open_s).state(opened + open_s) is BreakerState.CLOSED


def test_refusal_only_when_the_ack_deadline_comes_before_the_next_probe():
    now = [0.0]
    breakers = PeerBreakers(BreakerConfig(2, 60.0), clock=lambda: now[0])
    peer = "ab" * 32
    breakers.link_failed(peer)
    assert breakers.refusal(peer, 5) is None  # closed: one failure is no verdict
    breakers.link_failed(peer)
    assert breakers.state(peer) is BreakerState.OPEN
    why = breakers.refusal(peer, 30)
    assert why is not None
    assert "failed 2 times in a row" in why
    assert breakers.refusal(peer, 90) is None  # it will have been tried by then
    now[0] = 50.0
    assert breakers.refusal(peer, 15) is None
    breakers.link_up(peer)
    assert breakers.state(peer) is BreakerState.CLOSED
    assert breakers.snapshot() == {}


async def test_dials_wait_while_open_and_one_probe_goes_half_open(autojump_clock):
    breakers = PeerBreakers(BreakerConfig(1, 30.0))
    peer = "cd" * 32
    breakers.link_failed(peer)
    start = trio.current_time()
    await breakers.before_dial(peer)  # waits until half-open
    assert trio.current_time() - start == pytest.approx(30.0)
    assert breakers.get(peer).probing == 1
    with trio.move_on_after(100) as second:
        await breakers.before_dial(peer)  # the probe is under way: no second dial
    assert second.cancelled_caught
    async with trio.open_nursery() as nursery:  # a link the peer dialled closes the breaker
        breakers.link_failed(peer)
        nursery.start_soon(breakers.before_dial, peer)
        await trio.testing.wait_all_tasks_blocked()
        breakers.link_up(peer)
    assert trio.current_time() - start < 200 + 1
    assert breakers.state(peer) is BreakerState.CLOSED


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_state(breakers: PeerBreakers, peer: str, state: BreakerState) -> None:
    with trio.fail_after(60):
        while breakers.state(peer) is not state:
            await breakers.changed.wait()


async def test_a_peer_that_keeps_failing_fails_jobs_fast_until_its_link_is_up(
    node_factory, mock_clock, wall_clock_on_trio
):
    alice = await node_factory("alice", breaker_failures=2, breaker_open_s=600.0)
    # trio's clock jumps over idle waits (conftest.py), and on a loaded machine often enough
    # while the patient job waits in alice's outbox that bob would refuse it as older than
    # the default 300 s: bob's freshness bound outlasts what this test waits, not its point
    bob = await node_factory("bob", max_age_s=86_400)
    state = alice.info.state
    assert state is not None
    actor = read_key_file(alice.config.actor_key_path)
    await bob.client.register_actor(1, actor.public_hex)
    await bob.client.register_context(1, admins=[1], executors=[1])
    # alice knows bob at an address where nobody listens
    await alice.client.add_peer(bob.node_id, f"ws://127.0.0.1:{closed_port()}", name="bob")
    await wait_state(state.peers.breakers, bob.node_id, BreakerState.OPEN)

    async def job(timeout_ack_s: int):
        return await alice.client.submit_job(
            actor, 1, to="bob", context_id=1, script_type="sh", script="echo hi",
            timeout_ack_s=timeout_ack_s,
        )  # fmt: skip

    fast = await job(30)  # its ack deadline comes long before the breaker lets a dial go
    with trio.fail_after(10):
        [failed] = await alice.client.wait_results(fast, timeout_s=10)
    assert failed.status is JobStatus.ERROR
    assert failed.reason.startswith("peer_unavailable: the link to")
    [letter] = await alice.store.dead_letters(1)
    assert (letter["key"], letter["reason"]) == (fast.key, "peer_unavailable")
    patient = await job(3600)  # may wait for the next probe: queued for bob
    await trio.sleep(2 * PUBLISH_EVERY_S)  # trio's clock: the publisher's bound
    facts = await status_facts(alice.client)
    [peer] = facts["peers"]
    assert peer["breaker"]["state"] == "open"
    assert peer["breaker"]["failures"] >= 2
    published = json.loads((await alice.store.hgetall(0, keys.NODE_INFO))[BREAKERS_FIELD])
    assert published[bob.node_id]["state"] == "open"
    # bob dials alice: a link is up, the breaker closes, the queued job runs on bob
    await alice.client.register_actor(1, actor.public_hex)
    await bob.client.add_peer(alice.node_id, alice.info.ws_url, name="alice")
    await wait_state(state.peers.breakers, bob.node_id, BreakerState.CLOSED)
    with trio.fail_after(60):
        [result] = await alice.client.wait_results(patient, timeout_s=60)
    assert result.stdout == "hi\n"

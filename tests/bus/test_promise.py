"""How many replicas' fsyncs a promise waits for (bus/store/promise.py): the one decision the
node's barrier and the runner processes share, on trio's clock (no servers: the failover
suite, tests/host/test_failover.py, runs it against real ones)."""

from __future__ import annotations

import trio

from bus.store.promise import (
    DOWN_REFRESH_S,
    EVERY_REPLICA,
    ONE_REPLICA,
    REFRESH_S,
    ReplicasWanted,
    address,
    counted_out,
    down_in,
    elsewhere,
    flagged_down,
)


async def test_every_replica_counts_the_set_and_a_forgotten_replica_does_not_lower_it(
    autojump_clock,
):
    counted = ReplicasWanted(EVERY_REPLICA, 1, trio.current_time)
    assert counted.stale()
    assert counted.unknown() is not None  # never asked: no promise can be given
    counted.learn(2)
    assert counted.wanted == 2
    assert not counted.stale()
    assert counted.unknown() is None
    await trio.sleep(REFRESH_S)
    assert counted.stale()  # asked again every REFRESH_S
    counted.learn(1)  # a replica the Sentinels no longer list: the set is still two
    assert counted.wanted == 2
    counted.learn(0)
    assert counted.wanted == 2


async def test_a_replica_flagged_down_is_counted_out_and_asked_for_again_soon(autojump_clock):
    counted = ReplicasWanted(EVERY_REPLICA, 1, trio.current_time)
    counted.learn(2, down=1)  # the Sentinels would not promote it: writes go on without it
    assert counted.wanted == 1
    assert not counted.stale()
    await trio.sleep(DOWN_REFRESH_S)
    assert counted.stale()  # counted again as soon as it answers, not REFRESH_S later
    counted.learn(2, down=0)
    assert counted.wanted == 2
    counted.learn(2, down=2)  # none up: the URL's floor, which nothing confirms
    assert counted.wanted == 1


async def test_a_sentinel_event_or_silence_counts_every_replica_again(autojump_clock):
    counted = ReplicasWanted(EVERY_REPLICA, 1, trio.current_time)
    counted.learn(2, down=1)
    counted.changed()  # -sdown: ask before the next promise
    assert counted.stale()
    counted.unanswered()  # no Sentinel answered: the one counted out may be back unseen
    assert counted.wanted == 2


async def test_every_replica_waits_for_at_least_the_urls_count(autojump_clock):
    counted = ReplicasWanted(EVERY_REPLICA, 1, trio.current_time)
    counted.learn(0)  # Sentinels that have not found the replicas yet
    assert counted.wanted == 1


async def test_one_replica_never_asks_and_waits_for_the_urls_count(autojump_clock):
    counted = ReplicasWanted(ONE_REPLICA, 1, trio.current_time)
    assert not counted.stale()
    assert counted.unknown() is None
    assert counted.wanted == 1
    await trio.sleep(REFRESH_S * 3)
    assert not counted.stale()


def test_flags_read_from_each_shape_a_client_returns():
    assert flagged_down({"flags": "s_down,slave"})
    assert flagged_down({"flags": {"slave", "s_down", "disconnected"}})
    # the replica being promoted: the promotion's CLIENT KILL cut every Sentinel's link to it
    assert not flagged_down({"flags": {"slave", "disconnected"}})
    assert flagged_down([b"name", b"x", b"flags", b"o_down,slave"])
    assert not flagged_down({"flags": "slave"})
    assert not flagged_down(["flags", "slave,promoted"])


def test_a_replica_is_counted_out_only_if_every_sentinel_flags_it_and_it_is_detached():
    rows = [
        {"ip": "10.0.0.2", "port": "6379", "flags": "s_down,slave"},
        {"ip": "10.0.0.3", "port": 6379, "flags": "slave"},
    ]
    assert down_in(rows) == {"10.0.0.2:6379"}
    assert counted_out([down_in(rows)], set()) == 1
    # another Sentinel, which may lead the next failover, sees it up
    assert counted_out([down_in(rows), set()], set()) == 0
    # still attached to the primary: WAITAOF would count its fsync for a promotable one's
    assert counted_out([down_in(rows)], {"10.0.0.2:6379"}) == 0
    assert counted_out([down_in(rows)], None) == 0  # the primary did not answer


def test_writes_are_elsewhere_only_when_every_answering_sentinel_names_another_primary():
    # the shapes a primary's address comes in: redis-py's list of bytes, coredis' pair
    assert address([b"10.0.0.1", b"6379"]) == address(("10.0.0.1", 6379)) == "10.0.0.1:6379"
    assert address(None) == address(("", 0)) == ""  # a Sentinel that knows no primary
    assert elsewhere({"10.0.0.2:6379"}, "10.0.0.1:6379") == (
        "the Sentinels name primary 10.0.0.2:6379, the writes went to 10.0.0.1:6379"
    )
    assert elsewhere({"10.0.0.1:6379"}, "10.0.0.1:6379") is None  # the one they name
    # they disagree (a failover in progress), one knows none, or where the writes went is
    # not known: the replica count decides, as before
    assert elsewhere({"10.0.0.1:6379", "10.0.0.2:6379"}, "10.0.0.1:6379") is None
    assert elsewhere({""}, "10.0.0.1:6379") is None
    assert elsewhere({"10.0.0.2:6379"}, None) is None

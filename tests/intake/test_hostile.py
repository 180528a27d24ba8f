"""Property: whatever a hostile writer puts on any queue a node pops, each entry is judged alone.

Generated entries (hashes with missing, extra or hostile fields, keys of another type, keys
with no hash, bytes that are not UTF-8, lone surrogates through JSON escapes, huge values,
deep JSON, negative and enormous numbers) go onto ``msg_out``, ``msg_in``, ``queue:python``,
``results``, ``flow_events`` and a peer's outbox of a running node, before valid messages of
the same queue. Then every valid message runs exactly once, every hostile entry is in the dlq
with a reason, and no service restarted.

One pair of nodes serves every example: hypothesis runs in a worker thread and hands each
example to the trio loop that runs the nodes (``trio.from_thread.run``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bus.core import keys
from bus.core.ids import new_id
from bus.core.models import Message, decode_hash
from bus.core.text import printable
from bus.errors import ModelError
from crypto import KeyPair
from tests.intake.test_rejections import job_message
from tests.nodes import link_to

QUEUES = ("msg_out", "msg_in", "queue", "results", "flow_events", "outbox")

# -- hostile values ------------------------------------------------------------------------------

SPECIAL_VALUES = [
    "",
    "null",
    "{}",
    "[]",
    '"\\ud800"',
    '[{"id":1,"caller_id":1,"context_id":1,"script":"echo \\ud800","script_type":"sh"}]',
    '[{"script":"\\udc00x","script_type":"python"}]',
    "[" * 20_000 + "]" * 20_000,
    '{"a":' * 5_000 + "1" + "}" * 5_000,
    "9" * 5_000,
    str(2**64),
    str(-(2**63)),
    "-1",
    "1e308",
    "x" * 300_000,
    "message:1:1",
    "job:1:1",
]
values = st.one_of(
    st.sampled_from(SPECIAL_VALUES),
    st.text(max_size=30),
    st.binary(max_size=20),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.lists(st.integers(), max_size=3).map(json.dumps),
)
FIELD_NAMES = sorted(set(Message.FIELDS) | {"script", "script_type", "attempt", "answered"})
field_names = st.one_of(st.sampled_from(FIELD_NAMES), st.text(min_size=1, max_size=12))
WRONG_TYPES = ("string", "list", "set", "zset")


@dataclass
class Hostile:
    """One entry for a queue, and what to write under the key it names first."""

    entry: str | bytes
    kind: str = "raw"  # "hash", "missing", one of WRONG_TYPES, or "raw" (nothing written)
    fields: dict[str, Any] = field(default_factory=dict)
    key: str = ""  # the key written, if not the entry itself (a flow event names flow:<id>)


def hostile_key(prefix: str, caller: int = 9) -> st.SearchStrategy[str]:
    """Keys of a namespace no valid message of the suite uses (caller 9; the outbox's caller
    8 names keys nothing writes, so its entries never name another example's hash)."""
    return st.integers(min_value=1, max_value=10**12).map(lambda n: f"{prefix}:{caller}:{n}")


def keyed(prefix: str, hashes: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Hostile]:
    return st.one_of(
        st.builds(Hostile, hostile_key(prefix), st.just("hash"), hashes),
        st.builds(Hostile, hostile_key(prefix), st.sampled_from(WRONG_TYPES)),
        st.builds(Hostile, hostile_key(prefix), st.just("missing")),
        st.builds(Hostile, st.binary(min_size=1, max_size=12).map(lambda b: b"\xff" + b)),
    )


random_hashes = st.dictionaries(field_names, values, max_size=6)


@st.composite
def mutated_message(draw: st.DrawFn, template: dict[str, str]) -> dict[str, Any]:
    """A signed message's hash with a signed field broken, plus any other damage."""
    fields: dict[str, Any] = dict(template)
    broken = draw(st.sampled_from([*Message.SIGNED, "job", "signatures"]))
    if draw(st.booleans()):
        fields.pop(broken, None)
    else:
        fields[broken] = draw(values.filter(lambda v: v != template.get(broken)))
    for name, value in draw(st.dictionaries(field_names, values, max_size=3)).items():
        if name != broken:  # extra or unsigned fields: damage that may not matter alone
            fields[name] = value
    return fields


def still_signed(fields: dict[str, Any], template: dict[str, str]) -> bool:
    """Whether damage left the signed content as it was (a field dropped that parses to its
    default, an integer spelt another way): such a message is valid, not hostile."""
    try:
        damaged = Message.from_hash(decode_hash(fields))  # as the node reads it
    except ModelError:
        return False
    original = Message.from_hash(template)
    return (damaged.key, damaged.signed_content()) == (original.key, original.signed_content())


def job_hashes(statuses: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Job-like hashes whose status is one that gets them judged (not a duplicate's)."""
    return st.builds(
        lambda base, status: base | ({"status": status} if status else {}),
        random_hashes.map(lambda h: {k: v for k, v in h.items() if k != "status"}),
        st.sampled_from(statuses),
    )


def entries_for(queue: str, template: dict[str, str]) -> st.SearchStrategy[Hostile]:
    if queue in ("msg_out", "msg_in"):
        own_key = keys.message(int(template["caller_id"]), int(template["id"]))
        return st.one_of(
            keyed("message", random_hashes),
            st.builds(
                Hostile,
                st.just(own_key),
                st.just("hash"),
                mutated_message(template).filter(lambda f: not still_signed(f, template)),
            ),
        )
    if queue == "queue":  # a final job's entry is a duplicate, dropped quietly by design
        return keyed("job", job_hashes(["", "dispatched", "started", "junk"]))
    if queue == "results":  # likewise a job not final yet, or answered already
        unanswered = job_hashes(["finished", "error"]).map(
            lambda h: {k: v for k, v in h.items() if k != "answered"}
        )
        return keyed("job", unanswered)
    if queue == "flow_events":
        return st.one_of(
            st.builds(Hostile, st.text(min_size=1, max_size=20)),
            st.builds(Hostile, st.integers(min_value=10**13, max_value=10**15).map(str)),
            st.integers(min_value=10**13, max_value=10**15).flatmap(
                lambda n: st.builds(
                    Hostile,
                    st.just(str(n)),
                    st.sampled_from(WRONG_TYPES),
                    key=st.just(keys.flow(n)),
                )
            ),
            st.builds(Hostile, st.binary(min_size=1, max_size=8).map(lambda b: b"\xfe" + b)),
        )
    return st.one_of(  # an outbox: "<context>|<message key>" or anything else
        st.builds(Hostile, st.text(max_size=30)),
        st.builds(
            Hostile,
            st.tuples(st.integers(-5, 300) | st.integers(), hostile_key("message", 8)).map(
                lambda t: f"{t[0]}|{t[1]}"
            ),
        ),
        st.builds(Hostile, st.binary(min_size=1, max_size=8).map(lambda b: b"1|\xff" + b)),
    )


# -- the running pair ----------------------------------------------------------------------------


class Bus:
    """alice (the node under attack) and bob (her peer), one python slot each."""

    def __init__(self, alice: Any, bob: Any, actor: KeyPair) -> None:  # noqa: ANN401
        self.alice, self.bob, self.actor = alice, bob, actor

    def template(self) -> dict[str, str]:
        msg = job_message(self.actor, 1, self.alice.node_id, self.alice.node_id, "print(0)")
        return msg.to_hash()

    async def write(self, db: int, queue: str, items: list[Hostile]) -> None:
        store = self.alice.store
        for h in items:
            name = h.key or h.entry
            if h.kind != "raw":
                await store.call(db, lambda r, n=name: r.delete([n]))
            if h.kind == "hash" and h.fields:
                await store.call(db, lambda r, n=name, f=h.fields: r.hset(n, f))
            elif h.kind == "string":
                await store.call(db, lambda r, n=name: r.set(n, "a string"))
            elif h.kind == "list":
                await store.call(db, lambda r, n=name: r.rpush(n, ["a", "list"]))
            elif h.kind == "set":
                await store.call(db, lambda r, n=name: r.sadd(n, ["a"]))
            elif h.kind == "zset":
                await store.call(db, lambda r, n=name: r.zadd(n, {"a": 1.0}))
        await store.call(db, lambda r: r.lpush(queue, [h.entry for h in items]))

    async def valid(self, queue: str) -> Callable[[], Any]:
        """Queue a valid message that takes the same path; returns how to await its proof."""
        a, client = self.alice, self.alice.client
        if queue in ("msg_out", "queue"):
            msg = await client.submit_job(
                self.actor, 1, to=a.node_id, context_id=1, script_type="python", script="print(1)"
            )
            return lambda: self.ran_once(msg, "1\n")
        if queue == "msg_in":
            msg = job_message(self.actor, 1, a.node_id, a.node_id, "print(2)")
            async with a.store.transaction(1) as tx:
                tx.hset(msg.key, msg.to_hash())
                tx.lpush(keys.MSG_IN, [msg.key])
            return lambda: self.ran_once(msg, "2\n")
        if queue == "outbox":
            msg = await client.submit_job(
                self.actor,
                1,
                to=self.bob.node_id,
                context_id=1,
                script_type="python",
                script="print(3)",
            )
            return lambda: self.ran_once(msg, "3\n")
        if queue == "results":
            return await self.answered_job()
        flow = {"id": "a", "node": a.node_id, "context": 1, "type": "python", "script": "print(4)"}
        flow_id = await client.submit_flow(self.actor, 1, {"jobs": [flow]}, context_id=1)
        return lambda: self.flow_finished(flow_id)

    async def ran_once(self, msg: Message, stdout: str) -> None:
        [result] = await self.alice.client.wait_results(msg, timeout_s=20)
        assert (result.stdout, result.result.get("attempts")) == (stdout, "1"), result
        assert await self.alice.store.llen(1, keys.reply(msg.key)) == 0

    async def answered_job(self) -> Callable[[], Any]:
        """A job an external runner finished (its final hash, its key on ``results``)."""
        job_id, request = new_id(), keys.message(1, new_id())
        job = {
            "id": str(job_id),
            "caller_id": "1",
            "context_id": "1",
            "script": "x",
            "script_type": "ext",
            "status": "finished",
            "result": '{"stdout": "5"}',
            "message_key": request,
            "attempt": "1",
        }
        await self.alice.store.hset(1, keys.job(1, job_id), job)
        await self.alice.store.lpush(1, keys.RESULTS, keys.job(1, job_id))

        async def proof() -> None:
            reply = keys.reply(request)
            popped = await self.alice.store.call(1, lambda r: r.blpop([reply], timeout=20))
            assert popped is not None
            assert json.loads(popped[1])["status"] == "finished"
            assert await self.alice.store.llen(1, reply) == 0

        return proof

    async def flow_finished(self, flow_id: int) -> None:
        state = await self.alice.client.wait_flow(flow_id, 1, timeout_s=20)
        assert state.status.value == "finished", state


async def run_example(bus: Bus, plan: list[tuple[str, list[Hostile]]]) -> set[str]:
    """Run one example; the dead letters' reasons (for hypothesis' statistics)."""
    a = bus.alice
    for db in (0, 1):
        await a.store.call(db, lambda r: r.delete([keys.DLQ]))
    proofs = []
    for queue, items in plan:
        db, name = {
            "outbox": (0, keys.outbox(bus.bob.node_id)),
            "queue": (1, keys.queue("python")),
        }.get(queue, (1, queue))
        await bus.write(db, name, items)
        proofs.append(await bus.valid(queue))
    with trio.fail_after(60):
        for proof in proofs:
            await proof()
    letters = {0: await a.store.dead_letters(0), 1: await a.store.dead_letters(1)}
    for queue, items in plan:
        db = 0 if queue == "outbox" else 1
        reasons = {e["key"]: e["reason"] for e in letters[db]}
        for h in items:
            assert reasons.get(printable(h.entry, 1000)), (queue, h, letters[db])
    for node in (bus.alice, bus.bob):
        assert node.info.state.counters.restarts == {}
    return {f"{e['queue'] or '-'}: {e['reason']}" for db in (0, 1) for e in letters[db]}


plans = st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3, unique=True)


async def test_every_hostile_entry_is_judged_alone(node_factory) -> None:
    one_slot = {"runners": {"python": 1, "sh": 1, "ext": 0}}
    alice = await node_factory("alice", **one_slot)
    bob = await node_factory("bob", **one_slot)
    bus = Bus(alice, bob, await link_to(alice, bob))

    @st.composite
    def plan(draw: st.DrawFn) -> list[tuple[str, list[Hostile]]]:
        template = bus.template()  # a fresh signed message to damage
        return [
            (q, draw(st.lists(entries_for(q, template), min_size=1, max_size=4)))
            for q in draw(plans)
        ]

    @settings(
        max_examples=100,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )
    @given(plan())
    def check(p: list[tuple[str, list[Hostile]]]) -> None:
        for reason in trio.from_thread.run(run_example, bus, p):
            event(reason)
            seen[reason] += 1

    seen: Counter[str] = Counter()
    await trio.to_thread.run_sync(check)
    print("dead letters by queue and reason:", dict(sorted(seen.items())))

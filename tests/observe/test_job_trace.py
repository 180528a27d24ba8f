"""``hero-node job trace`` through real nodes: a cross-node job, a diamond flow over three
nodes with a retried job, a peer that refuses to tell about a context the asking actor may not
read (and one that is gone), and hostile asks and tells from a peer over a real link."""

from __future__ import annotations

import json
import sys

import jsonschema
import trio

from bus.core.ids import new_nonce, now
from bus.core.traces import Ask
from bus.wire.transport import Link
from crypto import KeyPair, read_key_file, write_key_file
from node.cli.output import schema_path
from tests.fake_peer import FakePeer, link_fake_peer
from tests.flows.test_flows import job, mesh

# fails its first attempt (exit 3), leaving a marker in its work dir; the retry finds it
FAIL_ONCE = (
    "import os, sys\n"
    "mark = 'tried-' + os.environ['HERO_MARK']\n"
    "if not os.path.exists(mark):\n"
    "    open(mark, 'w').close()\n"
    "    sys.exit(3)\n"
    "print('ok')\n"
)


async def trace(node, *args: str) -> tuple[int, dict, str]:  # noqa: ANN001 - a RunningNode
    done = await trio.run_process(
        [sys.executable, "-m", "node.cli", "--home", str(node.config.home), "job", "trace", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    out = done.stdout.decode()
    return done.returncode, json.loads(out) if "--json" in args else {}, out + done.stderr.decode()


def valid(doc: dict) -> dict:
    schema = json.loads(schema_path("job trace").read_text(encoding="utf-8"))
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]
    assert errors == []
    return doc


async def test_trace_follows_a_job_and_a_diamond_with_a_retry_across_three_nodes(node_factory):
    alice, bob, carol = [await node_factory(n) for n in ("alice", "bob", "carol")]
    actor = await mesh(alice, bob, carol)
    spec = {
        "name": "diamond",
        "jobs": [
            job("A", "self", "print(6)"),
            job("B", "bob", FAIL_ONCE, depends=["A"], retries=1, env={"HERO_MARK": "flow"}),
            job("C", "carol", "echo c", kind="sh", depends=["A"]),
            job("D", "alice", "print('d')", depends=["B", "C"]),
        ],
    }
    with trio.fail_after(50):
        message = await alice.client.submit_job(
            actor, 1, to=bob.node_id, context_id=1, script_type="python", script="print(1)"
        )
        await alice.client.wait_results(message, 20)
        flow_id = await alice.client.submit_flow(actor, 1, spec, context_id=1)
        await alice.client.wait_flow(flow_id, 1, timeout_s=30)

        # a job sent to bob, by its message: submitted and acknowledged on alice, received and
        # run on bob
        [sent] = message.job
        code, doc, _ = await trace(alice, message.key, "--json")
        assert code == 0
        [traced] = valid(doc)["jobs"]
        assert (traced["key"], traced["node"], traced["status"], traced["attempts"]) == (
            sent.key,
            bob.node_id,
            "finished",
            1,
        )
        steps = [(h["node"], h["what"]) for h in traced["hops"]]
        assert steps[0] == (alice.node_id, "job message submitted")
        assert (bob.node_id, "received") in steps
        assert steps.index((bob.node_id, "received")) < steps.index((bob.node_id, "attempt"))
        assert doc["nodes"][bob.node_id]["told"] is True

        # the flow: each job on its node, B's two attempts on bob
        code, doc, _ = await trace(alice, str(flow_id), "--json")
        code_text, _, text = await trace(alice, f"flow:{flow_id}")
    assert code == code_text == 0
    assert valid(doc)["flow"]["status"] == "finished"
    jobs = {j["flow_job"]: j for j in doc["jobs"]}
    placed = {k: (j["node"], j["attempts"], j["depends"]) for k, j in jobs.items()}
    assert placed == {
        "A": (alice.node_id, 1, []),
        "B": (bob.node_id, 2, ["A"]),
        "C": (carol.node_id, 1, ["A"]),
        "D": (alice.node_id, 1, ["B", "C"]),
    }
    attempts = [h for h in jobs["B"]["hops"] if h["what"] == "attempt"]
    assert [(h["node"], h["attempt"], h["outcome"]) for h in attempts] == [
        (bob.node_id, 1, "error"),
        (bob.node_id, 2, "finished"),
    ]
    assert attempts[0]["detail"] == "exit code 3"
    assert all(doc["nodes"][n]["told"] for n in (bob.node_id, carol.node_id))
    assert "os.environ" not in json.dumps(doc)  # never a script
    assert f"B job:1:{spec_job_id(doc, 'B')} on bob" in text
    assert "#2 finished" in text


def spec_job_id(doc: dict, flow_job: str) -> str:
    return next(j["key"] for j in doc["jobs"] if j["flow_job"] == flow_job).rsplit(":", 1)[1]


async def test_a_peer_refuses_an_actor_that_may_not_read_the_context(node_factory, tmp_path):
    alice, bob = await node_factory("alice"), await node_factory("bob")
    actor = await mesh(alice, bob)
    outsider = KeyPair.generate()
    write_key_file(tmp_path / "outsider.key", outsider)
    await bob.client.register_actor(7, outsider.public_hex)  # known to bob, not in context 1
    with trio.fail_after(40):
        message = await alice.client.submit_job(
            actor, 1, to=bob.node_id, context_id=1, script_type="python", script="print(1)"
        )
        await alice.client.wait_results(message, 20)
        [sent] = message.job
        as_outsider = ("--actor", "7", "--key", str(tmp_path / "outsider.key"), "--json")
        code, doc, _ = await trace(alice, sent.key, *as_outsider)
        # a reader is told: the same ask signed by the context's admin
        _, told, _ = await trace(alice, sent.key, "--json")
    assert code == 0
    said = valid(doc)["nodes"][bob.node_id]
    assert (said["told"], said["reason"]) == (False, "permission_denied")
    assert "may not read context 1" in said["detail"]
    assert not [h for h in doc["jobs"][0]["hops"] if h["node"] == bob.node_id]
    assert bob.info.state.counters.metrics["trace_refused_permission_denied"] == 1
    assert told["nodes"][bob.node_id]["told"] is True
    assert [h for h in told["jobs"][0]["hops"] if h["node"] == bob.node_id]
    with trio.fail_after(30):
        for bad in ("flow:abc", "actor:1"):
            code, _, said = await trace(alice, bad)
            assert (code, "is not a job, message or flow key" in said) == (2, True)
            assert "Traceback" not in said
    # bob gone: named as unavailable at once (no link), alice's own part still shown
    await bob.stopped()
    with trio.fail_after(30):
        _, alone, _ = await trace(alice, sent.key, "--json")
    assert valid(alone)["nodes"][bob.node_id]["reason"] == "peer_unavailable"
    assert alone["jobs"][0]["hops"][0]["what"] == "job message submitted"


async def linked_peer(nursery, node) -> tuple[FakePeer, Link, KeyPair]:  # noqa: ANN001
    """A fake peer dialling ``node``, and actor 50, an executor of context 1 there."""
    actor = KeyPair.generate()
    await node.client.register_actor(50, actor.public_hex)
    await node.client.register_context(1, admins=[node.config.actor_id], executors=[50])
    peer, link = await link_fake_peer(nursery, node)
    return peer, link, actor


async def test_asks_and_tells_from_a_peer_get_reasons_never_a_traceback(node_factory, nursery):
    """A peer on an authenticated link: a malformed ask, an ask naming another node, an ask of
    an executor (told, without the script), and a tell nobody asked for."""
    alice = await node_factory("alice")
    peer, link, actor = await linked_peer(nursery, alice)
    with trio.fail_after(30):
        message = await alice.client.submit_job(
            read_key_file(alice.config.actor_key_path), 1, to=alice.node_id, context_id=1,
            script_type="python", script="print('secret')",
        )  # fmt: skip
        await alice.client.wait_results(message, 20)
        [sent] = message.job
        me = peer.key.public_hex

        def ask(ask_id: int, **changes: object) -> dict:
            fields: dict = dict(
                id=ask_id, caller_id=50, context_id=1, node=me, target=alice.node_id,
                keys=(sent.key,), created_at=now(), nonce=new_nonce(),
            )  # fmt: skip
            return Ask(**(fields | changes)).signed(actor).to_dict()

        await link.send("ask", ask=ask(1) | {"keys": ["actor:1"]})  # only jobs, messages, flows
        await link.send("ask", ask=ask(2, node="c" * 64))
        await link.send("ask", ask=ask(3))
        await link.send("tell", tell={"ask": 99, "node": me, "records": {}})
        await alice.store.lpush(1, "job:9:9", "not a hash")
        await link.send("ask", ask=ask(4, keys=("job:9:9", "job:9:10", sent.key)))
        refused_shape, refused_node, answer, mixed = [await peer.told(n) for n in (1, 2, 3, 4)]
    assert (refused_shape["reason"], refused_node["reason"]) == ("malformed", "wrong_origin")
    job = answer["records"][sent.key]
    assert (job["fields"]["status"], job["fields"]["attempt"]) == ("finished", "1")
    assert answer["records"][message.key]["fields"]["status"] == "processed"  # its message
    assert "secret" not in json.dumps(answer)  # neither its script nor its output
    assert set(mixed["records"]) == {sent.key, message.key}  # a list and an absent key: untold
    counted = alice.info.state.counters.metrics
    assert counted["trace_refused_malformed"] == counted["trace_refused_wrong_origin"] == 1
    assert counted["trace_tells_unasked"] == 1
    assert not await alice.store.call(0, lambda r: r.keys("trace:told:*"))  # nothing handed on

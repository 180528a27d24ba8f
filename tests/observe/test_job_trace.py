"""``hero-node job trace`` through real nodes: a cross-node job, a cross-node flow with a
retried job, and a peer that refuses to tell about a context the asking actor may not read."""

from __future__ import annotations

import json
import sys

import jsonschema
import trio

from crypto import KeyPair, write_key_file
from node.cli.output import schema_path
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


async def test_trace_follows_a_job_and_a_flow_with_a_retry_across_nodes(node_factory):
    alice, bob = await node_factory("alice"), await node_factory("bob")
    actor = await mesh(alice, bob)
    spec = {
        "name": "pair",
        "jobs": [
            job("A", "self", "print(6)"),
            job("B", "bob", FAIL_ONCE, depends=["A"], retries=1, env={"HERO_MARK": "flow"}),
        ],
    }
    with trio.fail_after(45):
        message = await alice.client.submit_job(
            actor, 1, to=bob.node_id, context_id=1, script_type="python", script="print(1)"
        )
        await alice.client.wait_results(message, 20)
        flow_id = await alice.client.submit_flow(actor, 1, spec, context_id=1)
        await alice.client.wait_flow(flow_id, 1, timeout_s=30)

        # a job sent to bob: submitted and acknowledged on alice, received and run on bob
        [sent] = message.job
        code, doc, _ = await trace(alice, sent.key, "--json")
        assert code == 0
        [traced] = valid(doc)["jobs"]
        assert (traced["node"], traced["status"], traced["attempts"]) == (
            bob.node_id,
            "finished",
            1,
        )
        steps = [(h["node"], h["what"]) for h in traced["hops"]]
        assert (alice.node_id, "job message submitted") in steps
        assert (bob.node_id, "received") in steps
        assert (bob.node_id, "attempt") in steps
        assert steps.index((alice.node_id, "job message submitted")) < steps.index(
            (bob.node_id, "attempt")
        )
        assert doc["nodes"][bob.node_id]["told"] is True

        # the flow: each job on its node, B's two attempts on bob
        code, doc, _ = await trace(alice, str(flow_id), "--json")
        code_text, _, text = await trace(alice, f"flow:{flow_id}")
    assert code == code_text == 0
    assert valid(doc)["flow"]["status"] == "finished"
    jobs = {j["flow_job"]: j for j in doc["jobs"]}
    assert (jobs["A"]["node"], jobs["A"]["attempts"]) == (alice.node_id, 1)
    assert (jobs["B"]["node"], jobs["B"]["attempts"], jobs["B"]["depends"]) == (
        bob.node_id,
        2,
        ["A"],
    )
    attempts = [h for h in jobs["B"]["hops"] if h["what"] == "attempt"]
    assert [(h["node"], h["attempt"], h["outcome"]) for h in attempts] == [
        (bob.node_id, 1, "error"),
        (bob.node_id, 2, "finished"),
    ]
    assert attempts[0]["detail"] == "exit code 3"
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

"""Lists and registry commands: job/flow list with filters, peer/actor/context list and
remove, ``peer add`` validation, and the ``--json`` shapes (docs/use/json-output.md)."""

from __future__ import annotations

import json

from bus.core.breaker import BreakerState
from crypto import KeyPair
from tests.cli.test_cli import cli, running_node  # noqa: F401 (fixture)


def as_json(result) -> object:  # noqa: ANN001
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_job_list_filters_by_type_status_caller_and_since(running_node):  # noqa: F811
    home, _node = running_node
    py = cli(home, "job", "submit", "--script", "print(1)", "--wait")
    sh = cli(home, "job", "submit", "--type", "sh", "--script", "exit 2", "--wait")
    assert (py.returncode, sh.returncode) == (0, 2)
    rows = as_json(cli(home, "job", "list", "--json"))
    assert {r["script_type"]: r["status"] for r in rows} == {"python": "finished", "sh": "error"}
    assert set(rows[0]) == {
        "key",
        "status",
        "script_type",
        "caller_id",
        "created_at",
        "updated_at",
        "reason",
        "exit_code",
        "message_key",
    }
    [failed] = as_json(cli(home, "job", "list", "--json", "--status", "error"))
    assert (failed["script_type"], failed["exit_code"]) == ("sh", 2)
    assert failed["reason"] == "exit code 2"
    [only_py] = as_json(cli(home, "job", "list", "--json", "--type", "python"))
    assert only_py["status"] == "finished"
    assert as_json(cli(home, "job", "list", "--json", "--caller", "2")) == []
    assert len(as_json(cli(home, "job", "list", "--json", "--since", "1h"))) == 2
    assert as_json(cli(home, "job", "list", "--json", "--since", "4102444800")) == []
    text = cli(home, "job", "list", "--limit", "1")
    assert text.stdout.count("job:1:") == 1
    bad = cli(home, "job", "list", "--since", "yesterday")
    assert bad.returncode == 2
    assert "want 30s, 10m, 2h, 7d or a unix time" in bad.stderr


def test_flow_list_and_flow_status_json(running_node, tmp_path):  # noqa: F811
    home, _node = running_node
    doc = {
        "name": "one",
        "jobs": [{"id": "A", "node": "self", "context": 1, "type": "python", "script": "print(7)"}],
    }
    path = tmp_path / "one.json"
    path.write_text(json.dumps(doc))
    submitted = cli(home, "flow", "submit", str(path), "--wait")
    assert submitted.returncode == 0, submitted.stderr
    flow_id = int(submitted.stdout.split()[1])
    [row] = as_json(cli(home, "flow", "list", "--json"))
    assert row | {"created_at": 0, "updated_at": 0} == {
        "id": flow_id,
        "key": f"flow:{flow_id}",
        "name": "one",
        "status": "finished",
        "caller_id": 1,
        "created_at": 0,
        "updated_at": 0,
        "jobs": 1,
        "reason": "",
    }
    assert as_json(cli(home, "flow", "list", "--json", "--type", "sh")) == []
    assert as_json(cli(home, "flow", "list", "--json", "--status", "error")) == []
    state = as_json(cli(home, "flow", "status", str(flow_id), "--json"))
    assert state["status"] == "finished"
    [job] = state["jobs"]
    assert (job["id"], job["status"], job["result"]["stdout"]) == ("A", "finished", "7\n")


def test_peer_add_validates_and_peers_are_listed_and_removed(running_node):  # noqa: F811
    home, _node = running_node
    own = cli(home, "id").stdout.strip()
    refused = cli(home, "peer", "add", own, "ws://127.0.0.1:7999")
    assert refused.returncode == 2
    assert "this node's own id" in refused.stderr
    other = KeyPair.generate().public_hex
    for bad in ("http://127.0.0.1:7999", "ws://127.0.0.1", "ws://:7999", "ws://h:7999/x", "h:1"):
        result = cli(home, "peer", "add", other, bad)
        assert result.returncode == 2, bad
        assert "Traceback" not in result.stderr
    assert cli(home, "peer", "add", other, "ws://[::1]:7999", "--name", "six").returncode == 0
    [peer] = as_json(cli(home, "peer", "list", "--json"))
    assert peer["id"] == other
    assert (peer["name"], peer["address"], peer["outbox"]) == ("six", "ws://[::1]:7999", 0)
    assert peer["link"] in ("down", "unknown")
    assert set(peer) == {
        "id",
        "name",
        "address",
        "outbox",
        "link",
        "since",
        "last_seen",
        "rtt_ms",
        "error",
        "breaker",
        "encryption",
        "plaintext",
    }
    # nothing listens there: how many dials failed by now depends on the machine's pace, so
    # the breaker may already be open, but only after a failure
    breaker = peer["breaker"]
    assert breaker["state"] in {s.value for s in BreakerState}
    assert breaker["state"] == "closed" or breaker["failures"] > 0
    dials_us = KeyPair.generate().public_hex  # a peer without an address: it dials this node
    added = cli(home, "peer", "add", dials_us, "--name", "in")
    assert added.returncode == 0, added.stderr
    assert cli(home, "peer", "remove", "in").returncode == 0
    removed = cli(home, "peer", "remove", "six")
    assert removed.returncode == 0, removed.stderr
    assert as_json(cli(home, "peer", "list", "--json")) == []


def test_actors_and_contexts_are_listed_and_an_actor_removed(running_node):  # noqa: F811
    home, _node = running_node
    key = KeyPair.generate().public_hex
    assert cli(home, "actor", "add", "--id", "7", "--pubkey", key).returncode == 0  # old name
    actors = as_json(cli(home, "actor", "list", "--json"))
    assert [a["id"] for a in actors] == [1, 7]
    assert actors[1]["pubkey"] == key
    assert cli(home, "actor", "remove", "7").returncode == 0
    assert [a["id"] for a in as_json(cli(home, "actor", "list", "--json"))] == [1]
    assert cli(home, "actor", "remove", "7").returncode == 1
    assert cli(home, "context", "add", "2", "--executor", "1").returncode == 0
    contexts = as_json(cli(home, "context", "list", "--json"))
    assert contexts == [
        {"id": 1, "admins": [1], "executors": [], "readers": []},
        {"id": 2, "admins": [], "executors": [1], "readers": []},
    ]

"""Every ``--json`` output of hero-node (and hero-verify) validates against its JSON Schema
(node/cli/schemas/<command>.json, docs/use/json-output.md): the commands are found in the
parsers, so a new one without a schema, or without a run here, fails."""

from __future__ import annotations

import json
import sys

import jsonschema
import trio

from crypto import KeyPair, read_key_file, write_key_file
from crypto import cli as verify_cli
from node.cli.main import build_parser
from node.cli.output import SCHEMAS, schema_path
from node.cli.parsing import walk


def json_commands() -> set[str]:
    """``job list``, ``status``, ..., ``hero-verify verify``: every command of the two
    programs' parsers that takes ``--json`` (hero-node's without the program's name)."""
    return {
        parser.prog.removeprefix("hero-node ")
        for root in (build_parser(), verify_cli.build_parser())
        for parser in walk(root)
        if any("--json" in action.option_strings for action in parser._actions)
    }


def validator(command: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_path(command).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_every_json_command_has_a_schema_and_every_schema_a_command():
    commands = json_commands()
    assert {"status", "job list", "msg status", "hero-verify verify"} <= commands
    assert sorted(c for c in commands if not schema_path(c).is_file()) == []
    named = {schema_path(c).name for c in commands}
    assert sorted(p.name for p in SCHEMAS.glob("*.json") if p.name not in named) == []
    for command in commands:
        program = "" if command.startswith("hero-verify ") else "hero-node "
        assert validator(command).schema["title"].startswith(f"{program}{command} ")


async def hero_node(node, *args: str) -> tuple[int, object]:  # noqa: ANN001 - a RunningNode
    done = await trio.run_process(
        [sys.executable, "-m", "node.cli", "--home", str(node.config.home), *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.stdout, done.stderr.decode()
    return done.returncode, json.loads(done.stdout)


async def test_each_commands_json_validates_against_its_schema(node_factory, tmp_path):
    """A node with something of everything: a finished job, a failed one (exit 3), a flow,
    a dead letter (a refused actor), a peer."""
    # its jobs run one at a time: one slot of each type (each slot a process its start waits for)
    alice = await node_factory("alice", runners={"python": 1, "sh": 1})
    actor = read_key_file(alice.config.actor_key_path)
    client = alice.client
    with trio.fail_after(60):
        for script_type, script in (("python", "print(1)"), ("sh", "exit 3")):
            msg = await client.submit_job(
                actor, 1, to=alice.node_id, context_id=1, script_type=script_type, script=script
            )
            await client.wait_results(msg, 30)
        newcomer = KeyPair.generate()
        await client.register_actor(9, newcomer.public_hex)
        refused = await client.submit_job(
            newcomer, 9, to=alice.node_id, context_id=1, script_type="sh", script="true"
        )
        await client.wait_results(refused, 30)
        await client.add_peer(KeyPair.generate().public_hex, "", name="quiet")
        flow = {
            "name": "pair",
            "jobs": [
                {"id": "A", "node": "self", "context": 1, "type": "sh", "script": "echo a"},
                {"id": "B", "node": "alice", "context": 1, "type": "sh", "script": "exit 4"},
            ],
        }
        flow_id = await client.submit_flow(actor, 1, flow, context_id=1)
        await client.wait_flow(flow_id, 1, 30)
    jobs = (await hero_node(alice, "job", "list", "--json"))[1]
    assert isinstance(jobs, list)
    failed = next(j for j in jobs if j["reason"] == "exit code 3")
    runs = {
        "status": ["status"],
        "peer list": ["peer", "list"],
        "actor list": ["actor", "list"],
        "context list": ["context", "list"],
        "job list": ["job", "list"],
        "job show": ["job", "show", failed["key"]],
        "flow list": ["flow", "list"],
        "flow status": ["flow", "status", str(flow_id)],
        "flow show": ["flow", "show", str(flow_id)],
        "dlq list": ["dlq", "list"],
        "dlq show": ["dlq", "show", refused.key],
        "msg status": ["msg", "status", failed["message_key"]],
        "job trace": ["job", "trace", str(flow_id)],
    }
    hero_verify = {"hero-verify verify"}  # test_hero_verify_verify_json_validates
    assert set(runs) | hero_verify == json_commands(), "a --json command with no run here"
    outputs = {}
    for command, argv in runs.items():
        _, outputs[command] = await hero_node(alice, *argv, "--json")
        errors = [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator(command).iter_errors(outputs[command])
        ]
        assert errors == [], f"{command} --json:\n" + "\n".join(errors)
    # the values the schemas type, seen where they used to be text
    assert failed["exit_code"] == 3
    assert outputs["flow status"]["jobs"][1]["result"]["exit_code"] == 4
    assert outputs["flow status"]["result"]["A"]["result"]["attempts"] == 1
    assert outputs["status"]["node"]["pid"] > 0
    assert outputs["status"]["node"]["started_at"] > 0
    assert outputs["dlq list"][0]["reason"].startswith("permission_denied")


def test_hero_verify_verify_json_validates(tmp_path, capsys):
    key_path, key = tmp_path / "a.key", KeyPair.generate()
    write_key_file(key_path, key)
    (tmp_path / "job.json").write_text('{"script": "print(1)"}')
    assert verify_cli.main(["sign", str(tmp_path / "job.json"), "--key", str(key_path)]) == 0
    (tmp_path / "job.signed.json").write_text(capsys.readouterr().out)
    check = validator("hero-verify verify")
    for pubkey, valid in ((key.public_hex, True), (KeyPair.generate().public_hex, False)):
        argv = ["verify", str(tmp_path / "job.signed.json"), "--pubkey", pubkey, "--json"]
        assert verify_cli.main(argv) == (0 if valid else 1)
        verdict = json.loads(capsys.readouterr().out)
        assert list(check.iter_errors(verdict)) == []
        assert verdict["valid"] is valid

"""`hero-verify keygen --algorithm secp256k1`, sign and verify with such keys,
`hero-node actor add --algorithm`, and the `[algorithms]` table of config.toml."""

from __future__ import annotations

import json

import pytest

from bus.core import keys
from bus.errors import ClientError
from crypto import Secp256k1KeyPair, read_signing_key_file
from crypto.cli import main
from crypto.secp256k1 import CURVE_ORDER
from node.cli.main import build_parser
from node.cli.registry import actor_add
from node.config import NodeConfig, load_config
from node.errors import ConfigError
from node.host.home import init_home


def run(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_keygen_sign_and_verify_with_a_secp256k1_key(tmp_path, capsys):
    path = tmp_path / "actor.key"
    code, out, _ = run(capsys, "keygen", "--out", path, "--algorithm", "secp256k1")
    assert code == 0
    public = out.strip()
    assert len(public) == 66
    assert public[:2] in ("02", "03")
    key = read_signing_key_file(path)
    assert isinstance(key, Secp256k1KeyPair)
    assert key.public_hex == public
    assert run(capsys, "pubkey", path)[1].strip() == public
    doc = tmp_path / "job.json"
    doc.write_text('{"job": "render", "frames": [1, 2]}')
    code, out, _ = run(capsys, "sign", doc, "--key", path)
    assert code == 0
    envelope = json.loads(out)
    assert envelope["signatures"][0]["algorithm"] == "secp256k1"
    signed = tmp_path / "job.signed.json"
    signed.write_text(out)
    code, out, _ = run(capsys, "verify", signed, "--pubkey", public, "--json")
    assert code == 0
    assert json.loads(out)["signer"] == public
    assert run(capsys, "verify", signed)[0] == 0  # no expected key: any valid signature
    other = Secp256k1KeyPair.generate().public_hex
    code, out, _ = run(capsys, "verify", signed, "--pubkey", other, "--json")
    assert (code, json.loads(out)["reason"]) == (1, "wrong_signer")


def test_verify_refuses_a_high_s_envelope_and_an_uncompressed_pubkey(tmp_path, capsys):
    path = tmp_path / "actor.key"
    public = run(capsys, "keygen", "--out", path, "--algorithm", "secp256k1")[1].strip()
    doc = tmp_path / "doc.json"
    doc.write_text('{"n": 1}')
    envelope = json.loads(run(capsys, "sign", doc, "--key", path)[1])
    entry = envelope["signatures"][0]
    s = CURVE_ORDER - int(entry["signature"][64:], 16)
    entry["signature"] = entry["signature"][:64] + s.to_bytes(32, "big").hex()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(envelope))
    code, out, _ = run(capsys, "verify", bad, "--pubkey", public)
    assert code == 1
    assert out.startswith("INVALID (high_s)")
    uncompressed = "04" + "79be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798" * 2
    code, _, err = run(capsys, "verify", bad, "--pubkey", uncompressed)
    assert code == 2
    assert "uncompressed" in err


def test_keygen_defaults_to_ed25519(tmp_path, capsys):
    code, out, _ = run(capsys, "keygen", "--out", tmp_path / "node.key")
    assert code == 0
    assert len(out.strip()) == 64


async def test_actor_add_registers_the_algorithm(node_factory, capsys):
    alice = await node_factory("alice")
    key = Secp256k1KeyPair.generate()
    args = build_parser().parse_args(
        ["actor", "add", "--actor", "9", "--pubkey", key.public_hex, "--algorithm", "secp256k1"]
    )
    assert await actor_add(alice.client, args) == 0
    stored = await alice.store.hgetall(0, keys.actor(9))
    assert (stored["pubkey"], stored["algorithm"]) == (key.public_hex, "secp256k1")
    args = build_parser().parse_args(["actor", "add", "--actor", "10", "--pubkey", key.public_hex])
    with pytest.raises(ClientError, match="64 hex characters"):
        await actor_add(alice.client, args)
    assert await alice.store.hgetall(0, keys.actor(10)) == {}


def _config_with(tmp_path, table: str):
    config = init_home(tmp_path / "home", name="n", listen_port=0, redis_url="redis://x")
    text = config.config_path.read_text(encoding="utf-8")
    assert "\n[algorithms]\n" in text  # init writes the table, empty, with its help
    config.config_path.write_text(text.replace("\n[algorithms]\n", "\n" + table), "utf-8")
    return load_config(config.home)


def test_algorithms_per_context_from_config(tmp_path):
    config = _config_with(tmp_path, '[algorithms]\ndefault = ["ed25519"]\n"2" = ["secp256k1"]\n')
    table = config.accepted_algorithms
    assert [table.accepted(c) for c in (1, 2, 5)] == [("ed25519",), ("secp256k1",), ("ed25519",)]
    # no [algorithms] at all: every algorithm, in every context
    assert NodeConfig(home=tmp_path).accepted_algorithms.accepted(5) == ("ed25519", "secp256k1")
    # resolved once: what admission reads per message is the same table, not a second rule
    assert config.accepted_algorithms is table


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ('[algorithms]\n"1" = ["rsa"]\n', "a non-empty list of ed25519, secp256k1"),
        ('[algorithms]\n"1" = []\n', "a non-empty list"),
        ('[algorithms]\nctx = ["ed25519"]\n', "keys are context ids or 'default'"),
    ],
)
def test_a_bad_algorithms_table_stops_the_node_from_starting(tmp_path, table, words):
    with pytest.raises(ConfigError, match=words):
        _config_with(tmp_path, table)

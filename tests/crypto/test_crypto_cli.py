"""The hero-verify command line, run in-process."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import nacl.pwhash.argon2id as argon2id
import pytest

from crypto.cli import main
from crypto.envelope import verify_envelope
from crypto.keyfiles import read_key_file, write_key_file
from crypto.signing import KeyPair

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fast_kdf(monkeypatch):
    """Keep the stored INTERACTIVE limits but run argon2id at its minimum cost."""
    real_kdf = argon2id.kdf

    def kdf(size, password, salt, *, opslimit, memlimit):
        return real_kdf(size, password, salt, opslimit=1, memlimit=argon2id.MEMLIMIT_MIN)

    monkeypatch.setattr(argon2id, "kdf", kdf)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def key_file(tmp_path) -> tuple[Path, KeyPair]:
    path = tmp_path / "node.key"
    key = KeyPair.generate()
    write_key_file(path, key)
    return path, key


@pytest.fixture
def signed(tmp_path, key_file, capsys) -> Path:
    path, _ = key_file
    doc = tmp_path / "job.json"
    doc.write_text('{"job": "render", "frames": [1, 2, 3], "owner": {"id": 7}}')
    code, out, _ = run(capsys, "sign", doc, "--key", path)
    assert code == 0
    envelope = tmp_path / "job.signed.json"
    envelope.write_text(out)
    return envelope


def test_keygen_then_pubkey(tmp_path, capsys):
    path = tmp_path / "node.key"
    code, out, err = run(capsys, "keygen", "--out", path)
    assert code == 0
    assert "wrote key file" in err
    public_hex = out.strip()
    assert len(public_hex) == 64
    assert path.stat().st_mode & 0o777 == 0o600
    code, out, _ = run(capsys, "pubkey", path)
    assert code == 0
    assert out.strip() == public_hex
    assert read_key_file(path).public_hex == public_hex


def test_keygen_refuses_overwrite_without_force(tmp_path, capsys):
    path = tmp_path / "node.key"
    assert run(capsys, "keygen", "--out", path)[0] == 0
    before = path.read_bytes()
    code, out, err = run(capsys, "keygen", "--out", path)
    assert code == 2
    assert "already exists" in err
    assert out == ""
    assert path.read_bytes() == before
    code, out, _ = run(capsys, "keygen", "--out", path, "--force")
    assert code == 0
    assert path.read_bytes() != before
    assert read_key_file(path).public_hex == out.strip()


def test_keygen_encrypted_via_env(tmp_path, capsys, monkeypatch, fast_kdf):
    monkeypatch.setenv("MY_PASS", "hunter2")
    monkeypatch.delenv("HERO_KEY_PASSPHRASE", raising=False)
    path = tmp_path / "node.key"
    code, out, _ = run(capsys, "keygen", "--out", path, "--passphrase-env", "MY_PASS")
    assert code == 0
    public_hex = out.strip()
    assert "ciphertext" in json.loads(path.read_text())

    code, out, err = run(capsys, "pubkey", path)  # no passphrase, no terminal
    assert code == 2
    assert "passphrase is needed" in err
    assert "HERO_KEY_PASSPHRASE" in err

    code, out, _ = run(capsys, "pubkey", path, "--passphrase-env", "MY_PASS")
    assert code == 0
    assert out.strip() == public_hex
    monkeypatch.setenv("HERO_KEY_PASSPHRASE", "hunter2")
    assert run(capsys, "pubkey", path)[1].strip() == public_hex
    monkeypatch.setenv("HERO_KEY_PASSPHRASE", "wrong")
    code, _, err = run(capsys, "pubkey", path)
    assert code == 2
    assert "wrong passphrase" in err


def test_keygen_passphrase_env_unset(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NOPE_VAR", raising=False)
    code, _, err = run(capsys, "keygen", "--out", tmp_path / "k", "--passphrase-env", "NOPE_VAR")
    assert code == 2
    assert "NOPE_VAR" in err
    assert not (tmp_path / "k").exists()


def test_pubkey_refuses_world_readable_file(key_file, capsys):
    path, _ = key_file
    path.chmod(0o644)
    code, out, err = run(capsys, "pubkey", path)
    assert code == 2
    assert out == ""
    assert f"chmod 600 {path}" in err


def test_sign_then_verify(signed, key_file, capsys):
    _, key = key_file
    envelope = json.loads(signed.read_text())
    assert envelope["domain"] == "envelope"
    assert envelope["payload"] == {"job": "render", "frames": [1, 2, 3], "owner": {"id": 7}}
    [entry] = envelope["signatures"]
    assert entry["algorithm"] == "ed25519"
    assert entry["public_key"] == key.public_hex
    assert len(entry["signature"]) == 128

    code, out, _ = run(capsys, "verify", signed)
    assert code == 0
    assert "VALID" in out
    assert key.public_hex in out
    code, out, _ = run(capsys, "verify", signed, "--pubkey", key.public_hex)
    assert code == 0
    assert key.public_hex in out
    assert verify_envelope(envelope, key.public_hex).ok


def test_sign_and_verify_via_stdin(tmp_path, key_file, capsys, monkeypatch):
    path, key = key_file
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"a": [1, "\xc3\xa9"]}')))
    code, out, _ = run(capsys, "sign", "-", "--key", path, "--domain", "job-v2")
    assert code == 0
    assert json.loads(out)["domain"] == "job-v2"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(out.encode())))
    code, verdict_out, _ = run(capsys, "verify", "--json")
    assert code == 0
    assert json.loads(verdict_out) == {
        "valid": True,
        "reason": "ok",
        "detail": f"valid signature by {key.public_hex}",
        "signer": key.public_hex,
    }


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ('{"price": 1.5}', "float"),
        ('{"a": 1, "a": 2}', "duplicate object key"),
        ('{"n": 9007199254740993}', "2**53"),
        ("not json", "invalid JSON"),
    ],
)
def test_sign_refuses_non_canonical_input(tmp_path, key_file, capsys, document, message):
    path, _ = key_file
    doc = tmp_path / "doc.json"
    doc.write_text(document)
    code, out, err = run(capsys, "sign", doc, "--key", path)
    assert code == 2
    assert out == ""
    assert message in err


def test_sign_refuses_bad_domain(tmp_path, key_file, capsys):
    path, _ = key_file
    doc = tmp_path / "doc.json"
    doc.write_text("{}")
    code, _, err = run(capsys, "sign", doc, "--key", path, "--domain", "Bad Domain")
    assert code == 2
    assert "invalid signing domain" in err


def test_sign_with_missing_key_file(tmp_path, capsys):
    doc = tmp_path / "doc.json"
    doc.write_text("{}")
    code, _, err = run(capsys, "sign", doc, "--key", tmp_path / "none.key")
    assert code == 2
    assert "does not exist" in err
    assert "hero-verify keygen" in err


def _rewrite(path: Path, change) -> None:
    envelope = json.loads(path.read_text())
    change(envelope)
    path.write_text(json.dumps(envelope))


def test_tampered_payload_is_invalid(signed, capsys):
    _rewrite(signed, lambda env: env["payload"]["frames"].append(4))
    code, out, _ = run(capsys, "verify", signed)
    assert code == 1
    assert "INVALID" in out
    assert "bad signature" in out


def test_changed_domain_is_invalid(signed, capsys):
    _rewrite(signed, lambda env: env.update(domain="job"))
    code, out, _ = run(capsys, "verify", signed, "--json")
    assert code == 1
    assert json.loads(out)["reason"] == "bad_signature"


def test_tampered_signature_is_invalid(signed, capsys):
    def flip(env):
        sig = env["signatures"][0]["signature"]
        env["signatures"][0]["signature"] = ("0" if sig[0] != "0" else "1") + sig[1:]

    _rewrite(signed, flip)
    code, out, _ = run(capsys, "verify", signed)
    assert code == 1
    assert "bad signature" in out


def test_other_expected_key_is_wrong_signer(signed, key_file, capsys):
    _, key = key_file
    other = KeyPair.generate().public_hex
    code, out, _ = run(capsys, "verify", signed, "--pubkey", other)
    assert code == 1
    assert "another key" in out
    assert key.public_hex in out
    assert other in out
    code, out, _ = run(capsys, "verify", signed, "--pubkey", other, "--json")
    result = json.loads(out)
    assert code == 1
    assert result["valid"] is False
    assert result["reason"] == "wrong_signer"
    assert result["signer"] == key.public_hex
    assert set(result) == {
        "valid",
        "reason",
        "detail",
        "signer",
    }


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda env: env.update(signatures=[]), "no_signature"),
        (lambda env: env.update(signatures="abc"), "malformed_signature"),
        (lambda env: env["signatures"][0].update(signature="zz"), "malformed_signature"),
        (
            lambda env: env["signatures"][0].update(public_key="01" + "00" * 31),
            "malformed_signature",
        ),
        (lambda env: env["signatures"][0].update(algorithm="rsa"), "unsupported_algorithm"),
        (lambda env: env["payload"].update(price=1.5), "malformed_content"),
    ],
)
def test_malformed_envelopes_are_invalid(signed, capsys, change, reason):
    _rewrite(signed, change)
    code, out, _ = run(capsys, "verify", signed, "--json")
    result = json.loads(out)
    assert code == 1
    assert result["reason"] == reason
    assert result["valid"] is False
    code, out, _ = run(capsys, "verify", signed)
    assert code == 1
    assert out.startswith(f"INVALID ({reason})")


def test_duplicate_key_envelope_is_malformed_content(signed, capsys):
    text = signed.read_text().replace('"job": "render"', '"job": "render", "job": "other"')
    signed.write_text(text)
    code, out, _ = run(capsys, "verify", signed)
    assert code == 1
    assert "malformed encoding" in out
    assert "duplicate object key" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"this is not json", "not JSON"),
        (b"\xff\xfe garbage", "not JSON"),
        (b"[1, 2, 3]", "not an envelope"),
        (b'{"payload": {}, "signatures": []}', "missing field(s) domain"),
        (b'{"domain": "NOT OK", "payload": {}, "signatures": []}', "invalid signing domain"),
        (b'{"domain": 5, "payload": {}, "signatures": []}', "must be a string"),
    ],
)
def test_garbage_input_is_usage_error(tmp_path, capsys, content, message):
    path = tmp_path / "garbage.json"
    path.write_bytes(content)
    code, out, err = run(capsys, "verify", path)
    assert code == 2
    assert out == ""
    assert message in err


def test_missing_file_is_usage_error(tmp_path, capsys):
    code, out, err = run(capsys, "verify", tmp_path / "missing.json")
    assert code == 2
    assert out == ""
    assert "cannot read" in err
    assert "missing.json" in err


def test_invalid_pubkey_option_is_usage_error(signed, capsys):
    code, _, err = run(capsys, "verify", signed, "--pubkey", "1234")
    assert code == 2
    assert "--pubkey" in err
    assert "64 hex characters" in err


def test_help_and_usage_errors(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "exit codes" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["verify", "--help"])
    assert info.value.code == 0
    assert "--pubkey" in capsys.readouterr().out


def test_module_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "crypto.cli", "verify", "/nonexistent/envelope.json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "cannot read /nonexistent/envelope.json" in result.stderr

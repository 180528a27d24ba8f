"""Public-key parsing, key pairs and key files."""

from __future__ import annotations

import json
import os
import stat

import nacl.bindings
import nacl.pwhash.argon2id as argon2id
import pytest

from crypto.errors import CryptoError, KeyFileError, KeyFormatError, PassphraseRequiredError
from crypto.keyfiles import (
    passphrase_from_env,
    prompt_passphrase,
    read_key_file,
    write_key_file,
)
from crypto.public_keys import parse_public_key
from crypto.signing import KeyPair

# --------------------------------------------------------------- pure-Python curve arithmetic
# Used only to prove that the literals below really are what the tests claim they are.
P = 2**255 - 19
D = -121665 * pow(121666, P - 2, P) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)
IDENTITY = (0, 1)


def decode_point(raw: bytes) -> tuple[int, int] | None:
    """Decode leniently (y taken mod p); None if no curve point has this y."""
    value = int.from_bytes(raw, "little")
    y, sign = (value & ((1 << 255) - 1)) % P, value >> 255
    x2 = (y * y - 1) * pow(D * y * y + 1, P - 2, P) % P
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P:
        x = x * SQRT_M1 % P
    if (x * x - x2) % P:
        return None
    if x % 2 != sign:
        x = (P - x) % P
    return x, y


def add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    (x1, y1), (x2, y2) = a, b
    t = D * x1 * x2 * y1 * y2 % P
    x3 = (x1 * y2 + x2 * y1) * pow(1 + t, P - 2, P) % P
    y3 = (y1 * y2 + x1 * x2) * pow(1 - t, P - 2, P) % P
    return x3, y3


def times8(point: tuple[int, int]) -> tuple[int, int]:
    for _ in range(3):
        point = add(point, point)
    return point


# The 8 torsion points (order 1, 2, 4, 4, 8, 8, 8, 8), canonically encoded.
SMALL_ORDER_POINTS = [
    "0100000000000000000000000000000000000000000000000000000000000000",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0000000000000000000000000000000000000000000000000000000000000080",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
]
# y >= p (the y+p aliases of small-order points and the largest values), or x = 0 with the
# sign bit set: all are encodings that a strict decoder must refuse.
NON_CANONICAL = [
    "ed" + "ff" * 30 + "7f",  # y = p      (alias of y = 0)
    "ee" + "ff" * 30 + "7f",  # y = p + 1  (alias of the identity)
    "ed" + "ff" * 31,  # y = p, sign bit set
    "ee" + "ff" * 31,  # y = p + 1, sign bit set
    "ff" * 31 + "7f",  # y = 2**255 - 1
    "ff" * 32,  # y = 2**255 - 1, sign bit set
    "01" + "00" * 30 + "80",  # identity (x = 0) with the sign bit set
    "ec" + "ff" * 31,  # order-2 point (x = 0) with the sign bit set
]
BASE_POINT = "5866666666666666666666666666666666666666666666666666666666666666"


def test_small_order_list_is_the_torsion_subgroup():
    points = [decode_point(bytes.fromhex(h)) for h in SMALL_ORDER_POINTS]
    assert all(point is not None for point in points)
    assert len(set(points)) == 8
    assert all(times8(point) == IDENTITY for point in points)
    assert decode_point(bytes.fromhex(BASE_POINT)) is not None
    assert times8(decode_point(bytes.fromhex(BASE_POINT))) != IDENTITY


@pytest.mark.parametrize("hex_key", SMALL_ORDER_POINTS)
def test_parse_public_key_refuses_small_order(hex_key):
    with pytest.raises(KeyFormatError, match="is a small-order point"):
        parse_public_key(hex_key)
    with pytest.raises(KeyFormatError, match="is a small-order point"):
        parse_public_key(bytes.fromhex(hex_key))


@pytest.mark.parametrize("hex_key", NON_CANONICAL)
def test_parse_public_key_refuses_non_canonical(hex_key):
    with pytest.raises(KeyFormatError, match="non-canonical"):
        parse_public_key(hex_key)


def test_non_canonical_aliases_decode_to_small_order_points():
    # y = p and y = p + 1 really are aliases of torsion points, so only the encoding check
    # stops them (libsodium also refuses them).
    for hex_key in ("ed" + "ff" * 30 + "7f", "ee" + "ff" * 30 + "7f"):
        point = decode_point(bytes.fromhex(hex_key))
        assert point is not None
        assert times8(point) == IDENTITY
        assert not nacl.bindings.crypto_core_ed25519_is_valid_point(bytes.fromhex(hex_key))


def test_parse_public_key_refuses_point_not_on_curve():
    raw = next(
        y.to_bytes(32, "little")
        for y in range(2, 100)
        if decode_point(y.to_bytes(32, "little")) is None
    )
    with pytest.raises(KeyFormatError, match="not a point on the Ed25519 curve"):
        parse_public_key(raw)


def test_parse_public_key_refuses_mixed_order_point():
    mixed = nacl.bindings.crypto_core_ed25519_add(
        bytes.fromhex(BASE_POINT), bytes.fromhex(SMALL_ORDER_POINTS[-1])
    )
    assert decode_point(mixed) is not None
    with pytest.raises(KeyFormatError, match="prime-order subgroup"):
        parse_public_key(mixed)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("00" * 31, "64 hex characters"),
        ("0" * 65, "64 hex characters"),
        ("", "64 hex characters"),
        ("zz" * 32, "not hexadecimal"),
        ("0 " * 32, "not hexadecimal"),
        ("+" + "0" * 63, "not hexadecimal"),
        (b"\x01" * 31, "32 bytes"),
        (b"\x01" * 33, "32 bytes"),
        (12345, "hex str or bytes"),
    ],
)
def test_parse_public_key_refuses_bad_format(value, reason):
    with pytest.raises(KeyFormatError, match=reason):
        parse_public_key(value)


def test_parse_public_key_accepts_real_keys():
    key = KeyPair.generate()
    assert parse_public_key(key.public_hex) == key.public_bytes
    assert parse_public_key(key.public_hex.upper()) == key.public_bytes
    assert parse_public_key(key.public_bytes) == key.public_bytes
    assert parse_public_key(BASE_POINT) == bytes.fromhex(BASE_POINT)


def test_key_format_error_is_crypto_error():
    with pytest.raises(CryptoError):
        parse_public_key("00")


# ------------------------------------------------------------------------------- KeyPair


def test_keypair_basics():
    key = KeyPair.generate()
    other = KeyPair.generate()
    assert key.public_bytes != other.public_bytes
    assert len(key.seed) == 32
    assert len(key.public_bytes) == 32
    assert key.public_hex == key.public_hex.lower()
    assert len(key.public_hex) == 64
    assert KeyPair.from_seed(key.seed).public_bytes == key.public_bytes
    assert len(key.sign(b"data")) == 64
    assert key.seed.hex() not in repr(key)
    assert key.public_hex in repr(key)


@pytest.mark.parametrize("seed", [b"", b"\x00" * 31, b"\x00" * 33, "00" * 32])
def test_from_seed_refuses_bad_length(seed):
    with pytest.raises(KeyFormatError, match="32 bytes"):
        KeyPair.from_seed(seed)


# ----------------------------------------------------------------------------- key files

FAST = {"opslimit": argon2id.OPSLIMIT_MIN, "memlimit": argon2id.MEMLIMIT_MIN}


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_write_creates_0600_even_with_permissive_umask(tmp_path):
    path = tmp_path / "node.key"
    key = KeyPair.generate()
    old = os.umask(0)
    try:
        write_key_file(path, key)
    finally:
        os.umask(old)
    assert mode_of(path) == 0o600
    doc = json.loads(path.read_text())
    assert doc == {
        "kind": "hero-ed25519-key",
        "version": 1,
        "public_key": key.public_hex,
        "seed": key.seed.hex(),
    }
    assert read_key_file(path).seed == key.seed


def test_write_refuses_overwrite_without_flag(tmp_path):
    path = tmp_path / "node.key"
    first, second = KeyPair.generate(), KeyPair.generate()
    write_key_file(path, first)
    with pytest.raises(KeyFileError, match="already exists"):
        write_key_file(path, second)
    assert read_key_file(path).seed == first.seed
    write_key_file(path, second, overwrite=True)
    assert read_key_file(path).seed == second.seed
    assert mode_of(path) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.key"]


def test_write_refuses_through_existing_symlink(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("precious")
    link = tmp_path / "node.key"
    link.symlink_to(target)
    with pytest.raises(KeyFileError, match="already exists"):
        write_key_file(link, KeyPair.generate())
    assert target.read_text() == "precious"


def test_write_into_missing_directory_is_key_file_error(tmp_path):
    with pytest.raises(KeyFileError, match="cannot write key file"):
        write_key_file(tmp_path / "nope" / "node.key", KeyPair.generate())


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o601])
def test_read_refuses_group_or_other_bits(tmp_path, mode):
    path = tmp_path / "node.key"
    write_key_file(path, KeyPair.generate())
    os.chmod(path, mode)
    with pytest.raises(KeyFileError) as info:
        read_key_file(path)
    message = str(info.value)
    assert f"chmod 600 {path}" in message
    assert f"mode {mode:04o}" in message
    assert "group or others" in message


def test_read_accepts_0400(tmp_path):
    path = tmp_path / "node.key"
    key = KeyPair.generate()
    write_key_file(path, key)
    os.chmod(path, 0o400)
    assert read_key_file(path).public_hex == key.public_hex


def test_read_missing_file_says_how_to_create(tmp_path):
    path = tmp_path / "missing.key"
    with pytest.raises(KeyFileError) as info:
        read_key_file(path)
    message = str(info.value)
    assert str(path) in message
    assert "does not exist" in message
    assert "hero-node init" in message
    assert "hero-verify keygen" in message


def test_read_refuses_directory(tmp_path):
    with pytest.raises(KeyFileError, match="not a regular file"):
        read_key_file(tmp_path)


def test_passphrase_round_trip(tmp_path):
    path = tmp_path / "node.key"
    key = KeyPair.generate()
    write_key_file(path, key, passphrase=b"correct horse", **FAST)
    assert mode_of(path) == 0o600
    text = path.read_text()
    doc = json.loads(text)
    assert key.seed.hex() not in text
    assert "seed" not in doc
    assert doc["kdf"] == "argon2id"
    assert doc["public_key"] == key.public_hex
    assert doc["opslimit"] == FAST["opslimit"]
    assert doc["memlimit"] == FAST["memlimit"]
    assert len(bytes.fromhex(doc["salt"])) == 16
    assert read_key_file(path, passphrase=b"correct horse").seed == key.seed


def test_default_kdf_limits_are_interactive_and_stored(tmp_path, monkeypatch):
    calls = []
    real_kdf = argon2id.kdf

    def fast_kdf(size, password, salt, *, opslimit, memlimit):
        calls.append((opslimit, memlimit))
        return real_kdf(size, password, salt, opslimit=1, memlimit=argon2id.MEMLIMIT_MIN)

    monkeypatch.setattr(argon2id, "kdf", fast_kdf)
    path = tmp_path / "node.key"
    key = KeyPair.generate()
    write_key_file(path, key, passphrase=b"pw")
    doc = json.loads(path.read_text())
    interactive = (argon2id.OPSLIMIT_INTERACTIVE, argon2id.MEMLIMIT_INTERACTIVE)
    assert (doc["opslimit"], doc["memlimit"]) == interactive
    assert read_key_file(path, passphrase=b"pw").seed == key.seed
    assert calls == [interactive, interactive]


def test_wrong_passphrase_refused(tmp_path):
    path = tmp_path / "node.key"
    write_key_file(path, KeyPair.generate(), passphrase=b"right", **FAST)
    with pytest.raises(KeyFileError, match="wrong passphrase"):
        read_key_file(path, passphrase=b"wrong")


def test_encrypted_without_passphrase_refused(tmp_path):
    path = tmp_path / "node.key"
    write_key_file(path, KeyPair.generate(), passphrase=b"right", **FAST)
    with pytest.raises(PassphraseRequiredError, match="HERO_KEY_PASSPHRASE") as info:
        read_key_file(path)
    assert isinstance(info.value, KeyFileError)
    assert "passphrase is needed" in str(info.value)


def test_empty_passphrase_refused_on_write(tmp_path):
    with pytest.raises(KeyFileError, match="non-empty"):
        write_key_file(tmp_path / "k", KeyPair.generate(), passphrase=b"")
    assert not (tmp_path / "k").exists()


def test_tampered_public_key_detected(tmp_path):
    path = tmp_path / "node.key"
    write_key_file(path, KeyPair.generate())
    doc = json.loads(path.read_text())
    doc["public_key"] = KeyPair.generate().public_hex
    path.write_text(json.dumps(doc))
    with pytest.raises(KeyFileError, match="does not match"):
        read_key_file(path)


def test_tampered_public_key_detected_when_encrypted(tmp_path):
    path = tmp_path / "node.key"
    write_key_file(path, KeyPair.generate(), passphrase=b"pw", **FAST)
    doc = json.loads(path.read_text())
    doc["public_key"] = KeyPair.generate().public_hex
    path.write_text(json.dumps(doc))
    with pytest.raises(KeyFileError, match="does not match"):
        read_key_file(path, passphrase=b"pw")


def test_tampered_ciphertext_detected(tmp_path):
    path = tmp_path / "node.key"
    write_key_file(path, KeyPair.generate(), passphrase=b"pw", **FAST)
    doc = json.loads(path.read_text())
    flipped = bytearray(bytes.fromhex(doc["ciphertext"]))
    flipped[-1] ^= 1
    doc["ciphertext"] = flipped.hex()
    path.write_text(json.dumps(doc))
    with pytest.raises(KeyFileError, match="wrong passphrase .* corrupted"):
        read_key_file(path, passphrase=b"pw")


def _write_raw(tmp_path, text: str):
    path = tmp_path / "node.key"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return path


GOOD = KeyPair.from_seed(bytes(range(32)))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "not valid JSON"),
        ("[]", "not a hero-ed25519-key file"),
        ('{"kind": "other"}', "not a hero-ed25519-key file"),
        ('{"kind": "hero-ed25519-key", "version": 2}', "unsupported version 2"),
        (
            '{"kind": "hero-ed25519-key", "version": 1, "version": 1}',
            "duplicate object key",
        ),
        (
            json.dumps({"kind": "hero-ed25519-key", "version": 1, "public_key": GOOD.public_hex}),
            "neither 'seed' nor 'ciphertext'",
        ),
        (
            json.dumps(
                {
                    "kind": "hero-ed25519-key",
                    "version": 1,
                    "public_key": GOOD.public_hex,
                    "seed": "00" * 31,
                }
            ),
            "'seed' must be 32 bytes",
        ),
        (
            json.dumps(
                {"kind": "hero-ed25519-key", "version": 1, "public_key": "xy", "seed": "00"}
            ),
            "'public_key' is missing or not hex",
        ),
        (
            json.dumps(
                {
                    "kind": "hero-ed25519-key",
                    "version": 1,
                    "public_key": GOOD.public_hex,
                    "kdf": "argon2id",
                    "salt": "00" * 16,
                    "opslimit": 10**12,
                    "memlimit": 8192,
                    "ciphertext": "00" * 72,
                }
            ),
            "'opslimit' must be an integer",
        ),
        (
            json.dumps(
                {
                    "kind": "hero-ed25519-key",
                    "version": 1,
                    "public_key": GOOD.public_hex,
                    "kdf": "scrypt",
                    "ciphertext": "00" * 72,
                }
            ),
            "unsupported kdf 'scrypt'",
        ),
    ],
)
def test_malformed_key_files_refused(tmp_path, text, reason):
    path = _write_raw(tmp_path, text)
    with pytest.raises(KeyFileError, match=reason):
        read_key_file(path, passphrase=b"pw")


def test_handwritten_key_file_is_read(tmp_path):
    text = json.dumps(
        {
            "kind": "hero-ed25519-key",
            "version": 1,
            "public_key": GOOD.public_hex,
            "seed": GOOD.seed.hex(),
        }
    )
    assert read_key_file(_write_raw(tmp_path, text)).public_hex == GOOD.public_hex


# ---------------------------------------------------------------------------- passphrases


def test_passphrase_from_env(monkeypatch):
    monkeypatch.delenv("HERO_KEY_PASSPHRASE", raising=False)
    assert passphrase_from_env() is None
    monkeypatch.setenv("HERO_KEY_PASSPHRASE", "")
    assert passphrase_from_env() is None
    monkeypatch.setenv("HERO_KEY_PASSPHRASE", "sécret")
    assert passphrase_from_env() == "sécret".encode()
    monkeypatch.setenv("OTHER_VAR", "x")
    assert passphrase_from_env("OTHER_VAR") == b"x"


def test_prompt_passphrase(monkeypatch):
    answers = iter(["one", "one", "one", "two", ""])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    assert prompt_passphrase(confirm=True) == b"one"
    with pytest.raises(KeyFileError, match="do not match"):
        prompt_passphrase(confirm=True)
    with pytest.raises(KeyFileError, match="must not be empty"):
        prompt_passphrase()


def test_prompt_passphrase_eof(monkeypatch):
    def eof(prompt=""):
        raise EOFError

    monkeypatch.setattr("getpass.getpass", eof)
    with pytest.raises(KeyFileError, match="no passphrase"):
        prompt_passphrase()

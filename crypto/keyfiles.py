"""Key files on disk: an actor's or a node's key (crypto/signing.py: KeyPair; crypto/secp256k1.py)
written and read back, optionally under a passphrase.

Key file format (JSON text, mode 0600)::

    {"kind": "hero-ed25519-key", "version": 1, "public_key": <hex>, "seed": <hex>}

A secp256k1 actor key (crypto/secp256k1.py) has the same format with kind
``hero-secp256k1-key``, its compressed public key, and its 32-byte secret scalar as ``seed``.

or, when protected by a passphrase (argon2id + XSalsa20-Poly1305 ``SecretBox``)::

    {"kind": "hero-ed25519-key", "version": 1, "public_key": <hex>, "kdf": "argon2id",
     "salt": <hex>, "opslimit": <int>, "memlimit": <int>, "ciphertext": <hex>}
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import secrets
import stat
import sys
from pathlib import Path

import nacl.exceptions
import nacl.pwhash.argon2id as argon2id
import nacl.secret

from crypto import secp256k1
from crypto.errors import CanonicalError, KeyFileError, KeyFormatError, PassphraseRequiredError
from crypto.public_keys import ALGORITHM_ED25519, PUBLIC_KEY_BYTES
from crypto.secp256k1 import ALGORITHM_SECP256K1, Secp256k1KeyPair
from crypto.signing import SEED_BYTES, KeyPair, Signer
from crypto.strict_json import loads_strict

__all__ = [
    "KEY_FILE_KIND",
    "KEY_FILE_VERSION",
    "load_key_file",
    "load_signing_key_file",
    "passphrase_from_env",
    "prompt_passphrase",
    "read_key_file",
    "read_signing_key_file",
    "write_key_file",
]

KEY_FILE_KIND = "hero-ed25519-key"
_KINDS = {ALGORITHM_ED25519: KEY_FILE_KIND, ALGORITHM_SECP256K1: "hero-secp256k1-key"}
KEY_FILE_VERSION = 1
_MAX_KEY_FILE_BYTES = 64 * 1024
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _write_new_file(path: Path, data: bytes) -> None:
    """Create ``path`` exclusively with mode 0600 and write ``data`` durably.

    Raises:
        FileExistsError: ``path`` already exists. OSError: any other OS failure.
    """
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        os.fchmod(fd, 0o600)  # umask can only remove bits; make the mode exact
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_replacing(path: Path, data: bytes) -> None:
    """Write ``data`` to a 0600 temp file beside ``path`` then atomically rename it over."""
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")
    try:
        _write_new_file(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _check_passphrase(passphrase: bytes) -> None:
    if not isinstance(passphrase, bytes) or not passphrase:
        raise KeyFileError("the passphrase must be non-empty bytes")


def _encrypt_seed(
    seed: bytes, passphrase: bytes, opslimit: int, memlimit: int
) -> dict[str, object]:
    """Return the encrypted fields of a key file.

    Raises:
        KeyFileError: the argon2id limits are out of range.
    """
    salt = secrets.token_bytes(argon2id.SALTBYTES)
    try:
        box_key = argon2id.kdf(
            nacl.secret.SecretBox.KEY_SIZE, passphrase, salt, opslimit=opslimit, memlimit=memlimit
        )
    except nacl.exceptions.CryptoError as exc:
        raise KeyFileError(f"cannot derive a key from the passphrase: {exc}") from exc
    ciphertext = nacl.secret.SecretBox(box_key).encrypt(seed)
    return {
        "kdf": "argon2id",
        "salt": salt.hex(),
        "opslimit": opslimit,
        "memlimit": memlimit,
        "ciphertext": bytes(ciphertext).hex(),
    }


def write_key_file(
    path: str | os.PathLike[str],
    key: Signer,
    *,
    passphrase: bytes | None = None,
    overwrite: bool = False,
    opslimit: int = argon2id.OPSLIMIT_INTERACTIVE,
    memlimit: int = argon2id.MEMLIMIT_INTERACTIVE,
) -> None:
    """Write ``key`` to ``path`` as a JSON key file, created with mode 0600 from the start.

    With ``passphrase`` the seed is encrypted (argon2id with ``opslimit``/``memlimit``, which
    are stored in the file, then SecretBox). With ``overwrite`` an existing file is replaced
    atomically (temp file in the same directory + ``os.replace``).

    Raises:
        KeyFileError: the file exists and ``overwrite`` is false, the passphrase is empty,
            the argon2id limits are invalid, or the file cannot be written.
    """
    target = Path(path)
    doc: dict[str, object] = {
        "kind": _KINDS[key.algorithm],
        "version": KEY_FILE_VERSION,
        "public_key": key.public_hex,
    }
    if passphrase is None:
        doc["seed"] = key.seed.hex()
    else:
        _check_passphrase(passphrase)
        doc.update(_encrypt_seed(key.seed, passphrase, opslimit, memlimit))
    data = (json.dumps(doc, indent=2) + "\n").encode("ascii")
    try:
        if overwrite:
            _write_replacing(target, data)
        else:
            _write_new_file(target, data)
    except FileExistsError as exc:
        raise KeyFileError(
            f"key file {target} already exists; refusing to overwrite it "
            "(remove it first, or use --force / overwrite=True)"
        ) from exc
    except OSError as exc:
        raise KeyFileError(f"cannot write key file {target}: {exc.strerror or exc}") from exc


def _read_private_file(path: Path) -> bytes:
    """Read a key file after checking it is a regular file that only its owner can access.

    Raises:
        KeyFileError: missing, not a regular file, group/other permission bits, too large,
            or unreadable.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise KeyFileError(
            f"key file {path} does not exist; create one with `hero-node init` "
            f"or `hero-verify keygen --out {path}`"
        ) from exc
    except OSError as exc:
        raise KeyFileError(f"cannot open key file {path}: {exc.strerror or exc}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"key file {path} is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise KeyFileError(
                f"key file {path} is readable by group or others (mode {mode:04o}); "
                f"fix it with: chmod 600 {path}"
            )
        data = os.read(fd, _MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"key file {path} is too large to be a key file")
    return data


def _hex_field(doc: dict[str, object], name: str, size: int | None, path: Path) -> bytes:
    value = doc.get(name)
    if not isinstance(value, str) or not _HEX_DIGITS.issuperset(value) or len(value) % 2:
        raise KeyFileError(f"key file {path}: field {name!r} is missing or not hex")
    raw = bytes.fromhex(value)
    if size is not None and len(raw) != size:
        raise KeyFileError(f"key file {path}: field {name!r} must be {size} bytes")
    return raw


def _int_field(doc: dict[str, object], name: str, low: int, high: int, path: Path) -> int:
    value = doc.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise KeyFileError(f"key file {path}: field {name!r} must be an integer in [{low}, {high}]")
    return value


def _decrypt_seed(doc: dict[str, object], passphrase: bytes | None, path: Path) -> bytes:
    """Decrypt the seed of an encrypted key file.

    Raises:
        PassphraseRequiredError: no passphrase given. KeyFileError: bad fields, wrong passphrase.
    """
    if doc.get("kdf") != "argon2id" or "seed" in doc:
        raise KeyFileError(f"key file {path}: unsupported kdf {doc.get('kdf')!r}")
    salt = _hex_field(doc, "salt", argon2id.SALTBYTES, path)
    ciphertext = _hex_field(doc, "ciphertext", None, path)
    ops = _int_field(doc, "opslimit", argon2id.OPSLIMIT_MIN, argon2id.OPSLIMIT_SENSITIVE, path)
    mem = _int_field(doc, "memlimit", argon2id.MEMLIMIT_MIN, argon2id.MEMLIMIT_SENSITIVE, path)
    if passphrase is None:
        raise PassphraseRequiredError(
            f"key file {path} is encrypted; a passphrase is needed "
            "(set HERO_KEY_PASSPHRASE or enter it at the prompt)"
        )
    _check_passphrase(passphrase)
    try:
        box_key = argon2id.kdf(
            nacl.secret.SecretBox.KEY_SIZE, passphrase, salt, opslimit=ops, memlimit=mem
        )
        seed = nacl.secret.SecretBox(box_key).decrypt(ciphertext)
    except nacl.exceptions.CryptoError as exc:
        raise KeyFileError(
            f"wrong passphrase for key file {path} (or the file is corrupted)"
        ) from exc
    if len(seed) != SEED_BYTES:
        raise KeyFileError(f"key file {path}: decrypted seed has the wrong length")
    return seed


def _parse_key_doc(data: bytes, path: Path) -> dict[str, object]:
    try:
        doc = loads_strict(data)
    except CanonicalError as exc:
        raise KeyFileError(f"key file {path} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("kind") not in _KINDS.values():
        secp = _KINDS[ALGORITHM_SECP256K1]
        raise KeyFileError(f"key file {path} is not a {KEY_FILE_KIND} file (nor a {secp} file)")
    if doc.get("version") != KEY_FILE_VERSION:
        raise KeyFileError(
            f"key file {path} has unsupported version {doc.get('version')!r} "
            f"(this program reads version {KEY_FILE_VERSION})"
        )
    return doc


def read_key_file(path: str | os.PathLike[str], *, passphrase: bytes | None = None) -> KeyPair:
    """Load an Ed25519 key pair (a node's key, or an actor's) from a key file written by
    :func:`write_key_file`; a secp256k1 key file is refused (KeyFileError).

    ``passphrase`` is only used (and only required) if the file is encrypted.

    Raises:
        PassphraseRequiredError: the file is encrypted and ``passphrase`` is None.
        KeyFileError: the file is missing (the message says how to create one), is accessible
            by group/others (the message says ``chmod 600 <path>``), is malformed, the
            passphrase is wrong, or its public_key does not match its seed.
    """
    key = read_signing_key_file(path, passphrase=passphrase)
    if not isinstance(key, KeyPair):
        raise KeyFileError(f"key file {path} holds a {key.algorithm} key; an Ed25519 key is needed")
    return key


def read_signing_key_file(
    path: str | os.PathLike[str], *, passphrase: bytes | None = None
) -> Signer:
    """Load an actor's key of either algorithm (the file's ``kind`` says which).

    Raises:
        as :func:`read_key_file`.
    """
    target = Path(path)
    doc = _parse_key_doc(_read_private_file(target), target)
    secp = doc["kind"] == _KINDS[ALGORITHM_SECP256K1]
    size = secp256k1.PUBLIC_KEY_BYTES if secp else PUBLIC_KEY_BYTES
    public = _hex_field(doc, "public_key", size, target)
    if "seed" in doc and "ciphertext" not in doc:
        seed = _hex_field(doc, "seed", SEED_BYTES, target)
    elif "ciphertext" in doc:
        seed = _decrypt_seed(doc, passphrase, target)
    else:
        raise KeyFileError(f"key file {target} has neither 'seed' nor 'ciphertext'")
    try:
        key: Signer = Secp256k1KeyPair.from_seed(seed) if secp else KeyPair.from_seed(seed)
    except KeyFormatError as exc:
        raise KeyFileError(f"key file {target}: {exc}") from exc
    if not secrets.compare_digest(key.public_bytes, public):
        raise KeyFileError(
            f"key file {target}: public_key does not match the secret seed "
            "(the file was tampered with or corrupted)"
        )
    return key


def passphrase_from_env(var: str = "HERO_KEY_PASSPHRASE") -> bytes | None:
    """Return the passphrase from environment variable ``var`` (UTF-8), or None if unset/empty."""
    value = os.environb.get(os.fsencode(var)) if os.supports_bytes_environ else None
    if value is None:
        text = os.environ.get(var)
        value = text.encode("utf-8") if text is not None else None
    return value or None


def prompt_passphrase(confirm: bool = False) -> bytes:
    """Ask for a key passphrase on the terminal (no echo); with ``confirm``, ask twice.

    Raises:
        KeyFileError: empty passphrase, the two entries differ, or no input is available.
    """
    try:
        first = getpass.getpass("Key passphrase: ")
        if confirm and getpass.getpass("Repeat passphrase: ") != first:
            raise KeyFileError("the two passphrases do not match")
    except EOFError as exc:
        raise KeyFileError("no passphrase entered (end of input)") from exc
    if not first:
        raise KeyFileError("the passphrase must not be empty")
    return first.encode("utf-8")


def load_signing_key_file(
    path: str | os.PathLike[str], *, env_var: str = "HERO_KEY_PASSPHRASE"
) -> Signer:
    """:func:`load_key_file` for an actor's key of either algorithm."""
    try:
        return read_signing_key_file(path, passphrase=passphrase_from_env(env_var))
    except PassphraseRequiredError:
        if not sys.stdin.isatty():
            raise
    return read_signing_key_file(path, passphrase=prompt_passphrase())


def load_key_file(path: str | os.PathLike[str], *, env_var: str = "HERO_KEY_PASSPHRASE") -> KeyPair:
    """Read a key file for a command-line tool: the passphrase comes from ``env_var``, or, for an
    encrypted key without it, from a prompt when standard input is a terminal.

    Raises:
        KeyFileError: as :func:`read_key_file`; PassphraseRequiredError when no passphrase can
            be had (no env var, no terminal).
    """
    try:
        return read_key_file(path, passphrase=passphrase_from_env(env_var))
    except PassphraseRequiredError:
        if not sys.stdin.isatty():
            raise
    return read_key_file(path, passphrase=prompt_passphrase())

"""``hero-verify``: generate keys, sign JSON documents and verify signed envelopes offline.

Exit codes: 0 success / valid, 1 invalid signature, 2 usage or input error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from crypto.envelope import DEFAULT_DOMAIN, check_envelope, sign_envelope, verify_envelope
from crypto.errors import CanonicalError, CryptoError, InputError, PassphraseRequiredError
from crypto.keyfiles import (
    passphrase_from_env,
    prompt_passphrase,
    read_signing_key_file,
    write_key_file,
)
from crypto.public_keys import ALGORITHM_ED25519, ALGORITHMS, parse_public_key_for
from crypto.secp256k1 import ALGORITHM_SECP256K1, Secp256k1KeyPair
from crypto.signing import KeyPair, Signer, Verdict, verify_object
from crypto.strict_json import loads_strict

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_ERROR = 2
DEFAULT_PASSPHRASE_ENV = "HERO_KEY_PASSPHRASE"
_MAX_INPUT_BYTES = 64 * 1024 * 1024

_EPILOG = """\
exit codes: 0 = ok / signature valid, 1 = signature invalid, 2 = usage or input error

examples:
  hero-verify keygen --out node.key
  hero-verify keygen --out actor.key --algorithm secp256k1
  hero-verify sign job.json --key node.key > job.signed.json
  hero-verify verify job.signed.json --pubkey <64-hex ed25519 / 66-hex secp256k1 key>
  cat job.signed.json | hero-verify verify - --json
  hero-verify verify message:1:123 --redis redis://127.0.0.1:6379 --db 1
"""


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``hero-verify``."""
    parser = argparse.ArgumentParser(
        prog="hero-verify",
        description="Offline tool for hero-bus keys (Ed25519, secp256k1) and signed JSON "
        "envelopes.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_keygen(sub)
    _add_pubkey(sub)
    _add_sign(sub)
    _add_verify(sub)
    return parser


def _add_passphrase_env(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--passphrase-env",
        metavar="VAR",
        default=DEFAULT_PASSPHRASE_ENV,
        help="environment variable holding the key passphrase if the key file is encrypted "
        f"(default: {DEFAULT_PASSPHRASE_ENV}; prompts on a terminal if unset)",
    )


def _add_keygen(sub: Any) -> None:
    parser = sub.add_parser(
        "keygen",
        help="generate a new key file (Ed25519, or secp256k1 for an actor)",
        description="Generate a new key, write it to a mode-0600 key file and print its public "
        "key (hex; secp256k1: the 33-byte compressed form).",
    )
    parser.add_argument("--out", required=True, metavar="FILE", help="key file to create")
    parser.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default=ALGORITHM_ED25519,
        help="key algorithm (default: ed25519; node keys must be ed25519, actor keys may be "
        "secp256k1)",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--passphrase-env",
        metavar="VAR",
        help="encrypt the key with the passphrase in environment variable VAR",
    )
    group.add_argument(
        "--passphrase-prompt",
        action="store_true",
        help="encrypt the key with a passphrase typed at the terminal",
    )
    parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists")


def _add_pubkey(sub: Any) -> None:
    parser = sub.add_parser(
        "pubkey",
        help="print the public key of a key file",
        description="Print the public key (hex) of a key file.",
    )
    parser.add_argument("file", metavar="FILE", help="key file")
    _add_passphrase_env(parser)


def _add_sign(sub: Any) -> None:
    parser = sub.add_parser(
        "sign",
        help="sign a JSON document into an envelope",
        description="Read a JSON document (integer-only: no floats, no duplicate keys) and "
        'print a signed envelope {"domain", "payload", "signatures"}.',
    )
    parser.add_argument(
        "file", metavar="FILE", nargs="?", default="-", help="JSON document, or - for stdin"
    )
    parser.add_argument("--key", required=True, metavar="KEYFILE", help="key file to sign with")
    parser.add_argument(
        "--domain",
        default=DEFAULT_DOMAIN,
        help=f"signing domain, a token of [a-z0-9_-] (default: {DEFAULT_DOMAIN})",
    )
    _add_passphrase_env(parser)


def _add_verify(sub: Any) -> None:
    parser = sub.add_parser(
        "verify",
        help="verify a signed envelope",
        description="Verify a signed envelope. Exit 0 if valid, 1 if invalid, 2 on input errors.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "file", metavar="FILE", nargs="?", default="-", help="envelope, or - for stdin"
    )
    parser.add_argument(
        "--pubkey",
        metavar="HEX",
        help="require the signature to be by this public key (64 hex: ed25519; 66 hex: "
        "compressed secp256k1)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--redis",
        metavar="URL",
        help="verify the message hash whose key is FILE (message:<caller>:<id>) in this Redis, "
        "against the signer registered there (actor:<caller> in DB 0, or the origin node)",
    )
    parser.add_argument(
        "--db", type=int, default=1, metavar="N", help="with --redis: the context DB (default 1)"
    )
    parser.add_argument(
        "--max-age",
        type=int,
        metavar="S",
        help="with --redis: also refuse a message created more than S seconds ago",
    )


def _read_input(source: str) -> bytes:
    """Read ``source`` (a path, or ``-`` for stdin).

    Raises:
        InputError: the file cannot be read or is too large.
    """
    try:
        if source == "-":
            stream = getattr(sys.stdin, "buffer", None)
            data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8")
        else:
            with open(source, "rb") as handle:
                data = handle.read(_MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read {_display(source)}: {exc.strerror or exc}") from exc
    if len(data) > _MAX_INPUT_BYTES:
        raise InputError(f"{_display(source)} is larger than {_MAX_INPUT_BYTES} bytes")
    return data


def _display(source: str) -> str:
    return "<stdin>" if source == "-" else source


def _stdin_is_tty() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, OSError, ValueError):
        return False


def _load_key(path: str, env_var: str) -> Signer:
    """Read a key file, taking the passphrase from ``env_var`` or the terminal if needed.

    Raises:
        KeyFileError: see :func:`crypto.keyfiles.read_key_file`.
    """
    try:
        return read_signing_key_file(path, passphrase=passphrase_from_env(env_var))
    except PassphraseRequiredError as exc:
        if not _stdin_is_tty():
            raise PassphraseRequiredError(
                f"{exc}; set {env_var} (no terminal to prompt on)"
            ) from exc
    return read_signing_key_file(path, passphrase=prompt_passphrase())


def _cmd_keygen(args: argparse.Namespace) -> int:
    passphrase: bytes | None = None
    if args.passphrase_env:
        passphrase = passphrase_from_env(args.passphrase_env)
        if passphrase is None:
            raise InputError(f"environment variable {args.passphrase_env} is unset or empty")
    elif args.passphrase_prompt:
        passphrase = prompt_passphrase(confirm=True)
    secp = args.algorithm == ALGORITHM_SECP256K1
    key: Signer = Secp256k1KeyPair.generate() if secp else KeyPair.generate()
    write_key_file(args.out, key, passphrase=passphrase, overwrite=args.force)
    print(f"wrote key file {args.out}", file=sys.stderr)
    print(key.public_hex)
    return EXIT_OK


def _cmd_pubkey(args: argparse.Namespace) -> int:
    print(_load_key(args.file, args.passphrase_env).public_hex)
    return EXIT_OK


def _cmd_sign(args: argparse.Namespace) -> int:
    data = _read_input(args.file)
    try:
        payload = loads_strict(data)
    except CanonicalError as exc:
        raise InputError(f"cannot sign {_display(args.file)}: {exc}") from exc
    key = _load_key(args.key, args.passphrase_env)
    envelope = sign_envelope(key, payload, domain=args.domain)
    print(json.dumps(envelope, indent=2))
    return EXIT_OK


def _parse_envelope_input(data: bytes, source: str) -> tuple[object, Verdict | None]:
    """Parse verify input strictly; JSON that is valid but not strict gives a failure Verdict.

    Raises:
        InputError: the input is not JSON at all.
    """
    try:
        return loads_strict(data), None
    except CanonicalError as strict_error:
        try:
            lenient = json.loads(data.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{_display(source)} is not JSON: {strict_error}") from exc
        detail = f"not strict integer-only JSON: {strict_error}"
        return lenient, Verdict(False, "malformed_content", detail=detail)


def _describe(verdict: Verdict, expected: str | None) -> str:
    """Return a plain-English line for ``verdict``."""
    if verdict.ok:
        return f"VALID: signed by {verdict.signer}"
    text = {
        "bad_signature": "bad signature (the payload or the signature was changed after signing)",
        "wrong_signer": f"signed by another key ({verdict.signer}) than expected ({expected})",
        "malformed_signature": "malformed signature",
        "unsupported_algorithm": "no signature with a supported algorithm (ed25519, secp256k1)",
        "wrong_algorithm": "signed with another algorithm than the expected key's",
        "malformed_key": "malformed secp256k1 public key",
        "uncompressed_key": "uncompressed secp256k1 public key (only 02/03 + x is accepted)",
        "invalid_point": "the public key is not a point on the curve",
        "high_s": "high-S secp256k1 signature (only low-S is accepted)",
        "no_signature": "the envelope carries no signature",
        "malformed_content": "malformed encoding of the signed content",
        "malformed": "malformed message (fields missing or of the wrong type)",
        "unknown_signer": "unknown signer (no registered key for the message's sender)",
        "expired": "expired (older than the allowed age)",
        "from_future": "dated too far in the future",
    }.get(verdict.reason, verdict.reason)
    if verdict.reason == "wrong_signer" or not verdict.detail:
        return f"INVALID ({verdict.reason}): {text}"
    return f"INVALID ({verdict.reason}): {text}; {verdict.detail}"


# ``hero-verify verify --redis`` needs the bus package (data model, Redis); crypto must not
# import it, so the console script installs this hook (see bus/client/verify_cli.py).
RedisVerifier = Callable[[argparse.Namespace], Verdict]
_redis_verifier: RedisVerifier | None = None


def _cmd_verify(args: argparse.Namespace) -> int:
    if args.redis:
        if _redis_verifier is None:
            raise InputError("--redis needs the hero-node bus package (run hero-verify)")
        return _report(_redis_verifier(args), None, args.json)
    expected, algorithm = _expected_key(args.pubkey)
    doc, verdict = _parse_envelope_input(_read_input(args.file), args.file)
    try:
        domain, payload, signatures = check_envelope(doc)
    except CanonicalError as exc:
        raise InputError(f"{_display(args.file)}: {exc}") from exc
    if verdict is None and algorithm == ALGORITHM_ED25519:
        verdict = verify_envelope(doc, expected)
    elif verdict is None:
        verdict = verify_object(
            signatures, domain, payload, expected_public_key=expected, expected_algorithm=algorithm
        )
    return _report(verdict, expected, args.json)


def _expected_key(pubkey: str | None) -> tuple[str | None, str]:
    """``--pubkey`` parsed, with its algorithm told by its length (66 hex: secp256k1).

    Raises:
        InputError: the key is not valid for that algorithm.
    """
    if pubkey is None:
        return None, ALGORITHM_ED25519
    text = pubkey.strip()
    algorithm = ALGORITHM_SECP256K1 if len(text) in (66, 130) else ALGORITHM_ED25519
    try:
        return parse_public_key_for(algorithm, text).hex(), algorithm
    except CryptoError as exc:
        raise InputError(f"--pubkey: {exc}") from exc


def _report(verdict: Verdict, expected: str | None, as_json: bool) -> int:
    if as_json:
        result = {
            "valid": verdict.ok,
            "reason": verdict.reason,
            "detail": verdict.detail,
            "signer": verdict.signer,
        }
        print(json.dumps(result))
    else:
        print(_describe(verdict, expected))
    return EXIT_OK if verdict.ok else EXIT_INVALID


_COMMANDS = {
    "keygen": _cmd_keygen,
    "pubkey": _cmd_pubkey,
    "sign": _cmd_sign,
    "verify": _cmd_verify,
}


def main(argv: list[str] | None = None, *, redis_verifier: RedisVerifier | None = None) -> int:
    """Run ``hero-verify``; return the exit code (argparse exits with 2 on usage errors)."""
    global _redis_verifier
    _redis_verifier = redis_verifier
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except (CryptoError, InputError) as exc:
        print(f"hero-verify: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())

"""Canonical encoding, Ed25519 and secp256k1 keys, key files and signatures for hero-bus.

Pure library code: no network, no Redis, and no imports of ``bus`` or ``node``.
"""

from crypto.envelope import DEFAULT_DOMAIN, check_envelope, sign_envelope, verify_envelope
from crypto.errors import (
    CanonicalError,
    CryptoError,
    KeyFileError,
    KeyFormatError,
    PassphraseRequiredError,
)
from crypto.keyfiles import (
    load_key_file,
    load_signing_key_file,
    passphrase_from_env,
    prompt_passphrase,
    read_key_file,
    read_signing_key_file,
    write_key_file,
)
from crypto.public_keys import (
    ALGORITHM_ED25519,
    ALGORITHMS,
    parse_public_key,
    parse_public_key_for,
)
from crypto.secp256k1 import ALGORITHM_SECP256K1, Secp256k1KeyPair
from crypto.signing import (
    DOMAIN_PREFIX,
    Canonical,
    KeyPair,
    Signer,
    Verdict,
    canonical_json,
    sign_object,
    signing_input,
    verify_object,
    verify_raw,
)
from crypto.strict_json import loads_strict

__all__ = [
    "ALGORITHM_ED25519",
    "ALGORITHM_SECP256K1",
    "ALGORITHMS",
    "Secp256k1KeyPair",
    "Signer",
    "load_signing_key_file",
    "parse_public_key_for",
    "read_signing_key_file",
    "DEFAULT_DOMAIN",
    "DOMAIN_PREFIX",
    "Canonical",
    "CanonicalError",
    "CryptoError",
    "KeyFileError",
    "KeyFormatError",
    "KeyPair",
    "load_key_file",
    "PassphraseRequiredError",
    "Verdict",
    "canonical_json",
    "check_envelope",
    "loads_strict",
    "parse_public_key",
    "passphrase_from_env",
    "prompt_passphrase",
    "read_key_file",
    "sign_envelope",
    "sign_object",
    "signing_input",
    "verify_envelope",
    "verify_object",
    "verify_raw",
    "write_key_file",
]

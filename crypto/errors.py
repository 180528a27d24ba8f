"""Exception hierarchy of the crypto package.

Every error raised on purpose by ``crypto`` derives from :class:`CryptoError`; errors raised by
the underlying libraries (rfc8785, PyNaCl, json, the OS) are translated where they enter, so
callers only ever need to catch ``CryptoError`` (or one of its subclasses).
"""

from __future__ import annotations


class CryptoError(Exception):
    """Root of all errors raised by the crypto package."""


class CanonicalError(CryptoError):
    """Content cannot be canonically encoded (RFC 8785, integer-only) or strictly parsed."""


class KeyFormatError(CryptoError):
    """Public or secret key material is malformed (length, hex, curve point, ...)."""


class KeyFileError(CryptoError):
    """A key file is missing, has unsafe permissions, is malformed, or the passphrase is wrong."""


class PassphraseRequiredError(KeyFileError):
    """The key file is encrypted and no passphrase was supplied."""


class InputError(CryptoError):
    """Input could not be read or is not what a ``hero-verify`` subcommand needs (exit code 2)."""

"""Self-signed TLS certificates and the TLS contexts of node links (wss://, the default).

Peers do not trust the certificate through a CA: the node handshake binds its fingerprint
under both nodes' Ed25519 signatures (bus/core/handshake.py), so a relay that terminates TLS
with a certificate of its own is refused. Both sides require TLS 1.3: every key exchange is an
ephemeral (EC)DHE, so a node key or certificate key stolen later decrypts no recorded link.
Key files are written with mode 0600.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from crypto.errors import KeyFileError

VALID_DAYS = 3650
# forward secrecy: TLS 1.3 has no static-RSA or static-DH key exchange; 1.2 would allow them
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_3


def make_self_signed(cert_path: Path, key_path: Path, common_name: str) -> str:
    """Write a P-256 key (0600) and a self-signed certificate; return its SHA-256 fingerprint."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    pem_key = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem_key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return fingerprint(cert_path)


def fingerprint(cert_path: Path) -> str:
    """SHA-256 (hex) of the certificate's DER encoding; KeyFileError if unreadable."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"cannot read TLS certificate {cert_path}: {exc}") from exc
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def server_context(cert_path: Path, key_path: Path) -> ssl.SSLContext:
    """An SSL context to listen with; refuses a key readable by group or others."""
    mode = key_path.stat().st_mode & 0o777 if key_path.exists() else 0
    if mode & 0o077:
        raise KeyFileError(
            f"TLS key {key_path} is readable by group or others (mode {mode:04o}); "
            f"fix it with: chmod 600 {key_path}"
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = MINIMUM_VERSION
    try:
        context.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as exc:
        raise KeyFileError(f"cannot load TLS certificate/key {cert_path}: {exc}") from exc
    return context


def client_context() -> ssl.SSLContext:
    """An SSL context to dial peers with: TLS 1.3 for confidentiality and forward secrecy.
    No CA and no host name: the handshake checks, under the peer's node key, the certificate
    this connection was shown (bus/core/handshake.py ``Session.tls``)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # no CA store to load: none is used
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.minimum_version = MINIMUM_VERSION
    return context

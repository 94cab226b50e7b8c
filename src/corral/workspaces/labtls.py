"""Pinned TLS between the server and a workspace's JupyterLab on a Slurm node (docs/workspaces.md,
"Why pinned TLS").

On Slurm, JupyterLab listens on a TCP port of its node, and the node is shared: another user's
job can bind that port whenever JupyterLab does not hold it (in the seconds between the launcher
picking it and JupyterLab binding it, or after JupyterLab exits while its job lives on). So the
server does not trust the port; it trusts a key. At each start the launcher, as the job's user,
makes a fresh key and a self-signed certificate in a directory only that user can open
(`make_certificate`), starts JupyterLab with them, and writes the certificate's SHA-256
fingerprint into the endpoint file beside the port. The server connects with TLS and accepts the
peer only when its certificate is that one (`pinned_context`): the check runs inside the TLS
handshake, before the request's first byte is written, so whatever else holds the port gets a
TLS ClientHello and nothing more (no request, no header, no workspace token), and the failure
says so. A squatter cannot answer with the certificate: TLS has the server prove that it holds
the certificate's key, which never leaves the owner's directory. No CA and no host name take
part; the pin is the whole of the trust. The token no longer crosses the cluster network in
clear text either.

Imported by the launcher inside the job's environment: the standard library, plus `cryptography`
when the environment has it (Corral depends on it), else the `openssl` command.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import shutil
import ssl
import subprocess
import tempfile
from typing import Any

CERT_NAME = "jupyter-cert.pem"
KEY_NAME = "jupyter-key.pem"
FINGERPRINT = re.compile(r"[0-9a-f]{64}")  # a certificate's SHA-256, as the endpoint file gives it
CERT_DAYS = 3650  # no expiry is checked (the pin is the trust); a workspace may run for months
OPENSSL_TIMEOUT_S = 30
OPENSSL_REQ = ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
OPENSSL_REQ += ["-subj", "/CN=corral-workspace"]


class PinMismatch(ssl.SSLCertVerificationError):
    """The peer's certificate is not the pinned one: not the workspace's JupyterLab."""

    def __str__(self) -> str:  # SSLError's own shows the args tuple
        return str(self.args[0]) if self.args else "the peer's certificate is not the pinned one"


def fingerprint_of_der(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def fingerprint_of_pem(pem: str) -> str:
    return fingerprint_of_der(ssl.PEM_cert_to_DER_cert(pem))


def make_certificate(directory: str | None = None) -> tuple[str, str, str]:
    """(certificate file, key file, certificate fingerprint): a fresh EC P-256 key and a
    self-signed certificate for it, in a new directory (0700, its files 0600) below `directory`
    (default: the temp dir, the sandbox's own tmpfs), so the key never reaches the shared storage.
    RuntimeError naming what is missing when neither `cryptography` nor `openssl` is at hand."""
    where = tempfile.mkdtemp(prefix="corral-jupyter-tls-", dir=directory)  # 0700, the caller's own
    cert, key = os.path.join(where, CERT_NAME), os.path.join(where, KEY_NAME)
    try:
        cert_pem, key_pem = _with_cryptography()
    except ImportError:
        cert_pem, key_pem = _with_openssl(where)
    for path, data in ((key, key_pem), (cert, cert_pem)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return cert, key, fingerprint_of_pem(cert_pem.decode("ascii"))


def _with_cryptography() -> tuple[bytes, bytes]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral-workspace")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _with_openssl(where: str) -> tuple[bytes, bytes]:
    """The same with the `openssl` command (an environment without `cryptography`); its files are
    made in `where` (0700) and read back."""
    binary = shutil.which("openssl")
    if binary is None:
        raise RuntimeError(
            "cannot make the workspace's TLS certificate: the job's python has no `cryptography` "
            "package and there is no `openssl` command on the node; install either"
        )
    cert, key = os.path.join(where, "openssl-cert.pem"), os.path.join(where, "openssl-key.pem")
    old_umask = os.umask(0o077)
    try:
        done = subprocess.run(
            [binary, *OPENSSL_REQ, "-keyout", key, "-out", cert, "-days", str(CERT_DAYS)],
            capture_output=True,
            text=True,
            timeout=OPENSSL_TIMEOUT_S,
        )
    finally:
        os.umask(old_umask)
    if done.returncode != 0:
        raise RuntimeError(f"openssl could not make the workspace's TLS certificate: {done.stderr.strip()}")
    try:
        with open(cert, "rb") as c, open(key, "rb") as k:
            return c.read(), k.read()
    finally:
        os.unlink(cert)
        os.unlink(key)


def _check_pin(der: bytes | None, context: Any) -> None:
    pinned = getattr(context, "pinned", "")
    if not pinned:  # a PinnedContext always has one: nothing here may pass unpinned
        raise PinMismatch("no certificate fingerprint is pinned for this connection")
    if der is None:
        raise PinMismatch("the peer presented no certificate")
    seen = fingerprint_of_der(der)
    if not hmac.compare_digest(seen, pinned):
        raise PinMismatch(
            f"the peer's TLS certificate (sha256 {seen[:16]}...) is not the one the workspace's "
            f"JupyterLab reported (sha256 {pinned[:16]}...): another process holds its port"
        )


class _PinnedObject(ssl.SSLObject):
    """asyncio's TLS (the proxy's HTTP pool and its WebSockets): the handshake fails unless the
    peer's certificate is the pinned one, before the connection is handed to anyone."""

    def do_handshake(self) -> None:
        super().do_handshake()
        _check_pin(self.getpeercert(binary_form=True), self.context)


class _PinnedSocket(ssl.SSLSocket):
    """Blocking sockets' TLS (the idle policy's reader, through httpcore): the same check."""

    def do_handshake(self, block: bool = False) -> None:
        super().do_handshake(block)
        _check_pin(self.getpeercert(binary_form=True), self.context)


class PinnedContext(ssl.SSLContext):
    """A client context that trusts exactly one certificate, by its SHA-256 (`pinned`)."""

    sslobject_class = _PinnedObject
    sslsocket_class = _PinnedSocket
    pinned: str = ""


def pinned_context(fingerprint: str) -> ssl.SSLContext:
    """A TLS client context accepting only the peer whose certificate has this SHA-256 (64 lower
    hex digits; ValueError otherwise). No CA, no host name: the pin replaces both."""
    if FINGERPRINT.fullmatch(fingerprint) is None:
        raise ValueError(f"not a certificate's SHA-256 (64 lower-case hex digits): {fingerprint[:80]!r}")
    context = PinnedContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # no chain to check: the handshake checks the pin instead
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.pinned = fingerprint
    return context

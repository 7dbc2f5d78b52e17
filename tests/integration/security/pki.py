"""A throwaway PKI for TLS tests, made with the openssl command line: a CA, a broker certificate it signed
for 127.0.0.1 (PEM, its PKCS#8 key encrypted), and an unrelated CA that trusts nothing of it."""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

_DAYS = "2"
_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]  # fast to generate, unlike RSA


@dataclass(frozen=True)
class Pki:
    ca: Path
    """The CA certificate clients and the broker trust."""
    other_ca: Path
    """A CA that signed nothing here: a client trusting only it must refuse the broker."""
    keystore: Path
    """The broker's encrypted PKCS#8 key followed by its certificate."""
    key_password: str = field(repr=False)


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def _self_signed_ca(name: str, cwd: Path) -> Path:
    _openssl(
        "req",
        "-x509",
        *_EC,
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        _DAYS,
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=cwd,
    )
    return cwd / f"{name}.pem"


def make_pki(folder: Path) -> Pki:
    """Write the PKI into `folder` (about 0.1 s). The key password goes to openssl through a file, never argv."""
    ca = _self_signed_ca("retrytopics-test-ca", folder)
    other_ca = _self_signed_ca("retrytopics-other-ca", folder)
    _openssl("req", *_EC, "-nodes", "-keyout", "broker.key", "-out", "broker.csr", "-subj", "/CN=127.0.0.1", cwd=folder)
    # clients verify the host name (ssl.endpoint.identification.algorithm=https): the address they dial
    (folder / "broker.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n"
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "broker.csr",
        "-CA",
        ca.name,
        "-CAkey",
        "retrytopics-test-ca.key",
        "-CAcreateserial",
        "-out",
        "broker.crt",
        "-days",
        _DAYS,
        "-extfile",
        "broker.ext",
        cwd=folder,
    )
    key_password = secrets.token_urlsafe(18)
    password_file = folder / "key-password"
    password_file.write_text(key_password)
    # Kafka's PEM keystore reads the key with Java's SecretKeyFactory, which on Java 17 has no PBES2 (the
    # openssl default): PBES1 with 3DES is what it can decrypt
    _openssl(
        "pkcs8",
        "-topk8",
        "-v1",
        "PBE-SHA1-3DES",
        "-in",
        "broker.key",
        "-out",
        "broker.p8",
        "-passout",
        f"file:{password_file.name}",
        cwd=folder,
    )
    keystore = folder / "broker.pem"
    keystore.write_text((folder / "broker.p8").read_text() + (folder / "broker.crt").read_text())
    for unencrypted in ("broker.key", "retrytopics-test-ca.key", "retrytopics-other-ca.key", password_file.name):
        (folder / unencrypted).unlink()
    return Pki(ca=ca, other_ca=other_ca, keystore=keystore, key_password=key_password)

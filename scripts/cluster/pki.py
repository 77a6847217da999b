"""Certificates and keys of the local control plane (``cryptography``), written once per state dir.

``ca.{crt,key}`` signs everything (and is the controller-manager's cluster signer);
``apiserver.{crt,key}`` serves 127.0.0.1/localhost and the in-cluster names;
``admin.{crt,key}`` is the client identity ``admin`` in ``system:masters`` used by every component
and the kubeconfig; ``sa.{key,pub}`` signs and verifies service-account tokens.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_IP = "10.96.0.1"  # first address of --service-cluster-ip-range 10.96.0.0/16
APISERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
NODE_IP = "10.200.0.1"  # where the API server listens when the real node runs (node_config)
APISERVER_IPS = ("127.0.0.1", SERVICE_IP, NODE_IP)
VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def apiserver_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_crt(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def complete(self) -> bool:
        files = (self.ca_crt, self.ca_key, self.apiserver_crt, self.apiserver_key,
                 self.admin_crt, self.admin_key, self.sa_key, self.sa_pub)
        return all(f.is_file() for f in files)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def _leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName] | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    b = (
        _builder(subject, ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_encipherment=False, content_commitment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return b.sign(ca_key, hashes.SHA256()), key


def ensure(pki_dir: Path) -> Pki:
    """Create the PKI in ``pki_dir`` unless it is already complete; returns its paths."""
    pki = Pki(pki_dir)
    if pki.complete():
        return pki
    pki_dir.mkdir(parents=True, exist_ok=True)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("radixserve-local-ca")
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_encipherment=False, content_commitment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(pki.ca_crt, _cert_pem(ca_cert))
    _write(pki.ca_key, _key_pem(ca_key), private=True)

    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in APISERVER_DNS]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in APISERVER_IPS]
    cert, key = _leaf(ca_cert, ca_key, _name("kube-apiserver"),
                      ExtendedKeyUsageOID.SERVER_AUTH, sans)
    _write(pki.apiserver_crt, _cert_pem(cert))
    _write(pki.apiserver_key, _key_pem(key), private=True)

    cert, key = _leaf(ca_cert, ca_key, _name("admin", "system:masters"),
                      ExtendedKeyUsageOID.CLIENT_AUTH)
    _write(pki.admin_crt, _cert_pem(cert))
    _write(pki.admin_key, _key_pem(key), private=True)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(pki.sa_key, _key_pem(sa_key), private=True)
    _write(pki.sa_pub, sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki

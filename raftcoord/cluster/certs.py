"""A cluster's certificates: a CA, one certificate per node, client certificates.

``raftcoord cluster up --tls`` makes all of them in ``DIR/tls/``;
``raftcoord certs`` makes them one at a time for a real deployment
(deploy/README.md). Keys are EC P-256, written with mode 0600; the CA is
valid for 5 years, the others for 397 days (the longest a public CA may
issue). A node's certificate names the hosts it is reached at (IP addresses
or DNS names, as the cluster config writes them) and serves as its client
certificate too; a client certificate names only its principal (common
name ``NAME``: principal ``User:NAME``), which is never a node's
(:func:`client_name_refusal`).
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from raftcoord.protocol.data_dir import write_durably

CA_DAYS = 5 * 365
LEAF_DAYS = 397
CA_CERT = "ca.pem"
CA_KEY = "ca.key"
#: The name of a node's certificate (``node-<id>``): its principal is the cluster's.
_NODE_NAME = re.compile(r"node-\d+")


@dataclass(frozen=True)
class Authority:
    """A CA that can sign."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def make_ca(directory: Path, name: str = "raftcoord cluster CA") -> Authority:
    """A new CA, written to ``directory/ca.pem`` and ``ca.key`` (0600)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    write_durably(directory / CA_CERT, cert.public_bytes(serialization.Encoding.PEM))
    write_durably(directory / CA_KEY, _key_pem(key), 0o600)
    return Authority(cert, key)


def load_ca(directory: Path) -> Authority:
    """The CA in ``directory``.

    Raises:
        OSError: its files cannot be read.
        ValueError: they are not a certificate and an EC key.
    """
    cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
    key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / CA_KEY} is not an EC private key")
    return Authority(cert, key)


def is_node_name(name: str) -> bool:
    """Whether ``name`` is a node's certificate's (``node-<id>``)."""
    return _NODE_NAME.fullmatch(name) is not None


def client_name_refusal(name: str) -> str | None:
    """Why ``name`` cannot name a client certificate, or None: a node's name
    (``node-<id>``, whatever the config: a client holding it would act as
    that node, with the cluster's rights), or not a plain file name."""
    if is_node_name(name):
        return (
            f"{name!r} is a node's name (node-<id>): its principal acts as the cluster, "
            "so a client certificate never takes it"
        )
    if not name or name.startswith(".") or "/" in name or "\0" in name:
        return f"{name!r} is not a plain file name"
    return None


def issue(
    ca: Authority, directory: Path, file_name: str, common_name: str, hosts: list[str]
) -> tuple[Path, Path]:
    """A certificate for ``common_name`` signed by ``ca``, valid for TLS
    servers at ``hosts`` (none: a client only) and as a client; written to
    ``directory/file_name.pem`` and ``.key`` (0600). Returns both paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if hosts:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(h) for h in dict.fromkeys(hosts)]),
            critical=False,
        )
    cert = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False).sign(
        ca.key, hashes.SHA256()
    )
    cert_path, key_path = directory / f"{file_name}.pem", directory / f"{file_name}.key"
    directory.mkdir(parents=True, exist_ok=True)
    write_durably(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    write_durably(key_path, _key_pem(key), 0o600)
    return cert_path, key_path


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_cluster_certs(
    directory: Path, nodes: dict[int, list[str]], clients: tuple[str, ...]
) -> Authority:
    """A new CA in ``directory``, a certificate ``node-<id>`` for each of
    ``nodes`` (id -> the hosts it is reached at) and one per client name."""
    ca = make_ca(directory)
    for node_id, hosts in nodes.items():
        issue(ca, directory, f"node-{node_id}", f"node-{node_id}", hosts)
    for name in clients:
        issue(ca, directory, name, name, [])
    return ca


def host_of(address: str) -> str:
    """The host of a ``host:port`` address (an IPv6 one in brackets)."""
    return address.rsplit(":", 1)[0].strip("[]")


def node_certificate_refusal(
    ca_file: Path, cert_file: Path, key_file: Path, hosts: list[str]
) -> str | None:
    """Why a node could not serve with ``cert_file`` and ``key_file``: a file
    that cannot be read or is not PEM, a key that is not the certificate's,
    a certificate the CA of ``ca_file`` did not sign, one out of its
    validity, or one that does not name each of ``hosts`` (the hosts the node
    is reached at). None when it could."""
    try:
        ca = x509.load_pem_x509_certificate(_read(ca_file, "certificate"))
        cert = x509.load_pem_x509_certificate(_read(cert_file, "certificate"))
        key = serialization.load_pem_private_key(_read(key_file, "key"), password=None)
    except _Unreadable as exc:
        return str(exc)
    except (ValueError, TypeError) as exc:  # the PEM's contents
        return f"{cert_file} or its CA or key is not valid ({exc})"
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        return f"{key_file} is not the key of {cert_file}"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return f"{cert_file} is not signed by the CA of {ca_file}"
    now = _now()
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        return (
            f"{cert_file} is valid from {cert.not_valid_before_utc:%Y-%m-%d %H:%M} "
            f"to {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC only"
        )
    try:
        names = list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        names = []
    missing = [h for h in dict.fromkeys(hosts) if _general_name(h) not in names]
    if missing:
        return (
            f"{cert_file} does not name {', '.join(missing)}, where the node is reached "
            "(raftcoord certs node --host)"
        )
    return None


class _Unreadable(Exception):
    """A file of a certificate check that cannot be read or holds no PEM block."""


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _Unreadable(f"cannot read {path} ({exc.strerror or exc})") from None
    if b"-----BEGIN" not in data:
        raise _Unreadable(f"{path} holds no PEM {what}")
    return data

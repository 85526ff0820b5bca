"""The benchmark suite still runs end to end (``python -m bench --smoke``).

No timing is checked: only that the scenarios ran, measured something and
wrote it down. The suite starts its own Valkey server, so REDIS_URL is
removed from its environment (the test server's database is not its to flush).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import ROOT


def test_bench_smoke_writes_positive_rates(tmp_path):
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "queue-add", "worker-generic", "--smoke", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr}"
    data = json.loads(out.read_text())
    assert data["smoke"] is True
    assert data["failures"] == {}
    rows = {(m["label"], m["system"]): m for m in data["measurements"]}
    for scenario in ("queue-add", "worker-generic"):
        row = rows[(scenario, "chasqui")]
        assert row["unit"] == "jobs/s"
        assert len(row["samples"]) == 1
        assert row["median"] > 0, row
        assert row["jobs"] > 0, row
        assert row["fraction_of_ceiling"] > 0, row
    assert data["ceiling_jobs_per_s"] > 0
    assert data["server"]["embedded"] is True
    assert data["server"]["appendonly"] == "no"


def test_bench_rejects_unknown_scenario():
    proc = subprocess.run([sys.executable, "-m", "bench", "no-such-scenario"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown scenario(s) no-such-scenario" in proc.stderr


DJANGO_ROWS = {  # Django-path row -> its engine twin
    "django-enqueue (loop)": "queue-add (beside django-enqueue)",  # measured in turns with it, in one scenario
    "django-enqueue-many": "queue-add-bulk (beside django-enqueue-many)",  # in turns, chunk by chunk
    "runworker-async": "worker-concurrent (beside runworker-async)",  # each runworker drain takes turns with
    "runworker-sync": "worker-sync (beside runworker-sync)",  # a drain of its engine twin
    "runworker-retry": "worker-retry (beside runworker-retry)",
}


def test_bench_smoke_measures_the_django_path_beside_its_engine_twins(tmp_path):
    """Every Django-path scenario runs in the same run as its twin and is reported as a fraction of it.

    The runworker rows come from the real ``manage.py runworker`` process: the note says so and gives the
    process's CPU per job, which only the tasks it ran could have measured; a worker that did not drain every
    job, left anything behind or did not exit cleanly on SIGTERM would have failed the scenario.
    """
    out, page = tmp_path / "bench.json", tmp_path / "benchmarks.md"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    scenarios = ["queue-add", "queue-add-bulk", "worker-concurrent", "worker-sync", "worker-retry",
                 "worker-delayed-e2e", "django-enqueue", "django-enqueue-many", "runworker-async", "runworker-sync",
                 "runworker-retry"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *scenarios, "--smoke", "--json", str(out), "--markdown", str(page)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr}"
    data = json.loads(out.read_text())
    assert data["failures"] == {}
    rows = {m["label"]: m for m in data["measurements"] if m["system"] == "chasqui"}
    for label, twin in DJANGO_ROWS.items():
        row = rows[label]
        assert not row["skipped"] and row["median"] > 0 and row["jobs"] > 0, row
        assert row["engine_twin"] == twin
        assert row["fraction_of_twin"] == row["median"] / rows[twin]["median"]
        assert row["jobs"] == rows[twin]["jobs"], "a Django-path row does the same work as its twin"
    # worker-retry and worker-delayed-e2e are shown against worker-concurrent drained in turns with each
    for label in ("worker-retry", "worker-delayed-e2e"):
        row, beside = rows[label], rows[f"worker-concurrent (beside {label})"]
        assert row["engine_twin"] == f"worker-concurrent (beside {label})"
        assert row["fraction_of_twin"] == row["median"] / beside["median"] and row["jobs"] == beside["jobs"]
        assert f"taking turns with {label}" in beside["note"] and beside["cpu_us_per_job"] > 0, beside
    for label in ("runworker-async", "runworker-sync", "runworker-retry"):
        beside = rows[DJANGO_ROWS[label]]
        assert f"taking turns with {label}" in beside["note"] and beside["cpu_us_per_job"] > 0, beside
    for label in ("django-enqueue (loop)", "django-enqueue-many"):  # each rate beside its own CPU per job
        assert rows[label]["cpu_us_per_job"] > 0 and rows[DJANGO_ROWS[label]]["cpu_us_per_job"] > 0
    for label in ("runworker-async", "runworker-sync", "runworker-retry"):
        note = rows[label]["note"]
        assert "python manage.py runworker bench-django" in note, note
        assert "µs of CPU per job" in note and "start-up to the first job, not counted" in note, note
        assert rows[label]["cpu_us_per_job"] > 0 and rows[label]["cpu_per_job_of_twin"] > 0, rows[label]
    assert "--concurrency 100" in rows["runworker-async"]["note"]
    assert "--concurrency 10 " in rows["runworker-sync"]["note"]
    assert "of worker-concurrent" in proc.stdout
    markdown = page.read_text()
    assert "| of engine twin |" in markdown
    lines = {line.split(" | ")[0][2:]: line for line in markdown.splitlines() if line.startswith("| ")}
    for label, twin in DJANGO_ROWS.items():
        assert f"of {twin}" in lines[label], lines[label]


def test_bench_smoke_measures_runworker_processes_beside_the_single_process_row(tmp_path):
    """``runworker --processes 2`` drains the same backlog as ``runworker-async`` and is reported against it.

    Both worker processes must have run jobs (the window opens once both have started one), and the scenario
    fails if the supervisor does not stop cleanly on SIGTERM or leaves anything in the queue.
    """
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "runworker-async", "runworker-processes-2", "--smoke", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr}"
    data = json.loads(out.read_text())
    assert data["failures"] == {}
    rows = {m["label"]: m for m in data["measurements"] if m["system"] == "chasqui"}
    row = rows["runworker-processes-2"]
    assert row["median"] > 0 and row["cpu_us_per_job"] > 0, row
    assert row["jobs"] == rows["runworker-async"]["jobs"]
    assert row["engine_twin"] == "runworker-async"
    assert row["fraction_of_twin"] == row["median"] / rows["runworker-async"]["median"]
    assert "runworker bench-django --processes 2" in row["note"], row["note"]
    assert "2 of 2 processes ran jobs in every drain" in row["note"], row["note"]


def test_bench_smoke_measures_signed_runworker_beside_the_plain_one(tmp_path):
    """``runworker-signed`` drains the same backlog as ``runworker-async``, signed, and is reported against it.

    The scenario fails if the backlog is not signed, or if any job ends in the dead-letter queue (a signature
    the worker refused), so a passing row measured signed jobs that the worker checked and ran.
    """
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "runworker-async", "runworker-signed", "--smoke", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr}"
    data = json.loads(out.read_text())
    assert data["failures"] == {}
    rows = {m["label"]: m for m in data["measurements"] if m["system"] == "chasqui"}
    row = rows["runworker-signed"]
    assert row["median"] > 0 and row["cpu_us_per_job"] > 0, row
    assert row["jobs"] == rows["runworker-async"]["jobs"]
    assert row["engine_twin"] == "runworker-async"
    assert row["fraction_of_twin"] == row["median"] / rows["runworker-async"]["median"]
    assert "CHASQUI['SIGNING_KEYS'] set" in row["note"], row["note"]

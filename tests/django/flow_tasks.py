"""Django Tasks of the workflow tests (imported by them, so they register); each records its runs in RUNS."""

from __future__ import annotations

from django.tasks import task

from chasqui_core.flows import add_to_batch, step

RUNS: list[tuple] = []


@task(queue_name="default")
def square(x: int) -> int:
    RUNS.append(("square", x))
    return x * x


@task(queue_name="default")
def total(values: list[int]) -> int:
    RUNS.append(("total", values))
    return sum(values)


@task(queue_name="default")
def fetch(url: str) -> str:
    RUNS.append(("fetch", url))
    return f"<p>{url}</p>"


@task(queue_name="default")
def parse(html: str) -> list[str]:
    RUNS.append(("parse", html))
    return [html.removeprefix("<p>").removesuffix("</p>")]


@task(queue_name="default")
def store(rows: list[str], table: str) -> str:
    RUNS.append(("store", rows, table))
    return f"{len(rows)} row(s) in {table}"


@task(queue_name="default")
def notify(who: str) -> None:
    RUNS.append(("notify", who))


@task(queue_name="default", takes_context=True)
def lister(context, n: int) -> int:
    """The fan-out pattern: one child lists n rows and adds a job per row to its own batch."""
    RUNS.append(("lister", n))
    add_to_batch(context, *[step(square, i) for i in range(n)])
    return n


@task(queue_name="emails")
def elsewhere() -> None:
    RUNS.append(("elsewhere",))


@task(queue_name="default", max_attempts=1)
def broken(value: str) -> None:
    RUNS.append(("broken", value))
    raise ValueError(f"cannot handle {value}")


FIXED: set[str] = set()
"""Values ``fragile`` handles: until a test adds one, its job fails (and, with one run, dies)."""


@task(queue_name="default", max_attempts=1)
def fragile(value: str) -> str:
    RUNS.append(("fragile", value))
    if value not in FIXED:
        raise ValueError(f"{value} is not fixed yet")
    return value

"""A task declared with Chasqui's options, imported afresh by test_testing_backends under a test backend."""

from django.tasks import task


@task(max_attempts=5, backoff=500)
def multiply(a: int, b: int) -> int:
    return a * b


@task(max_attempts=3, takes_context=True)
def steps(context, n: int) -> list:
    """Uses Chasqui's context methods, which a test backend must offer too."""
    for i in range(n):
        context.check_cancelled()
        context.report_progress(100 * (i + 1) / n, f"step {i + 1}")
    return [context.cancelled, context.reports]

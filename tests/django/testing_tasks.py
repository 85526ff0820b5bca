"""A task declared with Chasqui's options, imported afresh by test_testing_backends under a test backend."""

from django.tasks import task


@task(max_attempts=5, backoff=500)
def multiply(a: int, b: int) -> int:
    return a * b

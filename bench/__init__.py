"""Chasqui's benchmark suite: ``python -m bench [scenario ...] [--json out.json] [--smoke]``.

Numbers a user can check: every scenario starts from an empty database,
runs a warm-up that is not counted, reports jobs divided by the seconds of
the measured window only, and keeps the median of several repeats. Each rate
is also given as a fraction of the Redis ceiling measured in the same run, so
results from different machines can be compared.
"""

"""Where a run's outcome is written: the attempt rules (``retry``: may it start, what follows a failure),
each outcome recorded (``outcomes``), and the batched settle that acknowledges, retries through the delayed
set or dead-letters in one script call per batch (``settler``)."""

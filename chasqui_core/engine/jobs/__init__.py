"""What a job is and carries, on every side: the envelope that travels through Redis, valid ids, the
registry of handlers, signing, redaction, retry policies (backoff), priorities, progress and stored results,
idempotency keys, lifecycle events, and the exceptions a handler raises to steer its job."""

"""pyinfra operations: change one thing idempotently, yielding nothing when the host is right."""

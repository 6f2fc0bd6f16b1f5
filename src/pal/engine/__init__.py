"""The durable-execution protocol: runtime, step protocol, run lifecycle, waiting, recovery
sweep and the lease heartbeat. It never imports Celery, the API or the CLI."""

"""strata's functions tier: env simulators as services (serverless handlers, env service, local runtime)."""

__all__: list[str] = []

"""strata's edge tier: the edge agent, its MQTT link, policy cache, simulators and telemetry."""

__all__: list[str] = []

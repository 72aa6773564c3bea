"""strata's cloud tier: learners, parameter server, exporter, rollout sources, switcher and the CLI."""

__all__: list[str] = []

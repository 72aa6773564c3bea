"""strata's infra tier: plan, apply and destroy of the AWS resources strata runs on."""

__all__: list[str] = []

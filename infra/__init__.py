"""strata's infra tier: plan, apply and destroy of the AWS resources strata runs on."""

from infra._errors import FunctionNotFoundError, InfraError, PayloadTooLargeError, ThrottledError

__all__ = ["FunctionNotFoundError", "InfraError", "PayloadTooLargeError", "ThrottledError"]

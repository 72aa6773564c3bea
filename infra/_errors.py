"""The infra tier's exceptions: everything infra raises on purpose derives from `InfraError`.

    StrataError (device)
     └── InfraError                  an AWS call failed in a way the caller can act on
          ├── FunctionNotFoundError   Lambda answered ResourceNotFoundException (no such function/qualifier)
          ├── PayloadTooLargeError    Lambda answered RequestTooLargeException (6 MB sync / 1 MB async)
          └── ThrottledError          Lambda kept answering 429 after strata's own backoff gave up

Messages name the call, the bad value and the fix.
"""

from __future__ import annotations

from device import StrataError


class InfraError(StrataError):
    """Base class of the infra tier's errors."""


class FunctionNotFoundError(InfraError):
    """The Lambda function (or the qualifier: version/alias) does not exist at the endpoint called."""


class PayloadTooLargeError(InfraError):
    """The invocation payload is over Lambda's limit (6 MB RequestResponse, 1 MB Event)."""


class ThrottledError(InfraError):
    """Lambda answered 429 TooManyRequestsException on every attempt strata's backoff allowed."""

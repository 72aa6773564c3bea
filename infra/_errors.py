"""The infra tier's exceptions: everything infra raises on purpose derives from `InfraError`.

    StrataError (device)
     └── InfraError                  an AWS call failed in a way the caller can act on
          ├── FunctionNotFoundError   Lambda answered ResourceNotFoundException (no such function/qualifier)
          ├── PayloadTooLargeError    Lambda answered 413 RequestEntityTooLarge (6 MB sync / 1 MB async)
          ├── ThrottledError          Lambda kept answering 429 after strata's own backoff gave up
          ├── DeployConfigError       a deployment setting AWS would refuse (also ConfigError / ValueError)
          ├── PackageError            building a function package failed (pip, sources)
          │    └── PackageTooLargeError   over Lambda's 50 MB zipped / 250 MB unzipped limit
          ├── StateError              a stage's state file is unreadable, newer, or lacks what is needed
          ├── UnknownResourceKindError  a resource kind with no registered handler
          └── AwsCallError            a control-plane call failed while planning or applying

Messages name the call, the bad value and the fix.
"""

from __future__ import annotations

from device import ConfigError, StrataError


class InfraError(StrataError):
    """Base class of the infra tier's errors."""


class FunctionNotFoundError(InfraError):
    """The Lambda function (or the qualifier: version/alias) does not exist at the endpoint called."""


class PayloadTooLargeError(InfraError):
    """The invocation payload is over Lambda's limit (6 MB RequestResponse, 1 MB Event)."""


class ThrottledError(InfraError):
    """Lambda answered 429 TooManyRequestsException on every attempt strata's backoff allowed."""


class DeployConfigError(InfraError, ConfigError):
    """A deployment setting is outside what AWS accepts (memory, timeout, names, concurrency)."""


class PackageError(InfraError):
    """Building a function's deployment package failed (pip, missing sources)."""


class PackageTooLargeError(PackageError):
    """The built package is over Lambda's 50 MB zipped or 250 MB unzipped limit."""


class StateError(InfraError):
    """A stage's state file is unreadable, from a newer strata, or lacks what a command needs."""


class UnknownResourceKindError(InfraError):
    """A plan, state file or template names a resource kind this strata has no handler for."""


class AwsCallError(InfraError):
    """An AWS control-plane call made while planning or applying failed."""

"""strata's infra tier: plan, apply and destroy of the AWS resources strata runs on.

The deploy pipeline (models -> read-only plan -> executor -> state file) is described in
``infra/_deploy.py``; `infra.aws` is the one module that wraps boto3.
"""

from infra._deploy import apply, destroy, destroy_plan, plan, rollback, rollback_plan
from infra._errors import (
    AwsCallError,
    DeployConfigError,
    FunctionNotFoundError,
    InfraError,
    PackageError,
    PackageTooLargeError,
    PayloadTooLargeError,
    StateError,
    ThrottledError,
    UnknownResourceKindError,
)
from infra._executor import AwsExecutor, DryRunExecutor
from infra._models import DeployConfig
from infra._plan import FieldChange, Plan, Step
from infra._readback import DeployedCode, DeployedFunctions, read_back
from infra._template import template, write_template

__all__ = [
    "AwsCallError",
    "AwsExecutor",
    "DeployConfig",
    "DeployConfigError",
    "DeployedCode",
    "DeployedFunctions",
    "DryRunExecutor",
    "FieldChange",
    "FunctionNotFoundError",
    "InfraError",
    "PackageError",
    "PackageTooLargeError",
    "PayloadTooLargeError",
    "Plan",
    "StateError",
    "Step",
    "ThrottledError",
    "UnknownResourceKindError",
    "apply",
    "destroy",
    "destroy_plan",
    "plan",
    "read_back",
    "rollback",
    "rollback_plan",
    "template",
    "write_template",
]

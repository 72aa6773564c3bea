"""strata's exception tree; every error a caller can act on derives from `StrataError`.

    StrataError
     ├── ConfigError (also ValueError)        a bad value in a config, flag or request
     ├── MissingDependencyError (ImportError)  an optional extra is not installed
     └── ... each tier adds its own subtree under its own base class:
         BundleError (device), EdgeError (edge), FunctionsError (functions), InfraError (infra),
         CloudError (cloud)

Messages name the call, the bad value and the fix.
"""

from __future__ import annotations


class StrataError(Exception):
    """Base class of every error strata raises on purpose."""


class ConfigError(StrataError, ValueError):
    """A configuration value, CLI flag or request field is invalid."""


class MissingDependencyError(StrataError, ImportError):
    """An optional dependency (a tier's extra) is not installed."""

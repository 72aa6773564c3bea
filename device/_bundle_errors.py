"""The policy-bundle exception tree: every refusal a bundle consumer can meet, each naming its reason.

    StrataError
     └── BundleError (also ValueError)   a bundle, key or model cannot be used
          ├── BundleFormatError          bytes are not a well-formed strata bundle (parse only)
          ├── UnsignedBundleError        the bundle carries no signature
          ├── UnknownKeyError            signed by a key the trust store does not hold
          ├── TamperedBundleError        signature or model digest does not match
          ├── ExpiredBundleError         past the manifest's ``expires_at``
          ├── WrongTierError             the manifest targets another tier
          ├── RollbackError              version not newer than the highest accepted before
          ├── VerifierStateError         the anti-rollback state file is unreadable
          ├── KeyFileError               a key file is missing, malformed or would be overwritten
          └── ModelError                 ONNX bytes the numpy executor cannot parse or run
               └── UnsupportedOperatorError   an operator the executor does not implement

A consumer that catches `BundleError` keeps its previous policy running and logs the message.
"""

from __future__ import annotations

from device._errors import StrataError


class BundleError(StrataError, ValueError):
    """Base class of every policy-bundle refusal."""


class BundleFormatError(BundleError):
    """The bytes are not a well-formed strata bundle."""


class UnsignedBundleError(BundleError):
    """The bundle has no signature."""


class UnknownKeyError(BundleError):
    """The bundle was signed by a key that is not in the trust store."""


class TamperedBundleError(BundleError):
    """The signature does not match the manifest, or the model does not match the manifest's digest."""


class ExpiredBundleError(BundleError):
    """The bundle's ``expires_at`` has passed."""


class WrongTierError(BundleError):
    """The bundle targets a different tier than the verifier's."""


class RollbackError(BundleError):
    """The bundle's version is not newer than the highest version accepted before."""


class VerifierStateError(BundleError):
    """The verifier's persisted anti-rollback state cannot be read or written."""


class KeyFileError(BundleError):
    """A key file is missing or malformed, or writing one would overwrite an existing key."""


class ModelError(BundleError):
    """ONNX model bytes that the numpy executor cannot parse or run."""


class UnsupportedOperatorError(ModelError):
    """The model uses an ONNX operator (or operator form) the numpy executor does not implement."""

"""The cloud tier's exceptions; every one derives from `CloudError`, itself a `StrataError`.

    StrataError (device)
     └── CloudError                      anything the cloud tier raises on purpose
          └── ColocatedError              the shared-memory env worker pool (cloud/rollout/_colocated.py)
               ├── PoolStateError          a call out of order (step_wait without step_async, use after close)
               ├── UnsupportedSpaceError   (kept for callers; the pool now carries every space gymnasium can batch)
               ├── EnvWorkerError          an env raised inside a worker (carries env_index and the traceback)
               ├── WorkerFailedError       a worker process crashed or hung past its timeout
               │    └── WorkerTimeoutError  ... past the caller's *_wait timeout (a multiprocessing.TimeoutError)
               └── InfoEncodingError       an env info value that cannot cross the pool's pickle-free info channel
          └── HybridError                 hybrid units disagree or lost each other (cloud/hybrid/)

The pool is a drop-in for gymnasium's AsyncVectorEnv, so `cloud.rollout._pool_errors` (loaded with the pool, as it
imports gymnasium) adds subclasses that are also gymnasium's error types: `PoolClosedError`
(ClosedEnvironmentError), `NoPendingCallError` (NoAsyncCallError), `PendingCallError` (AlreadyPendingCallError),
each a `PoolStateError`; and an env's exception is re-raised as an `EnvWorkerError` that is also an instance of
the env's own exception type.

Other cloud modules add their own subclasses of `CloudError` here. Messages name the call, the bad value
and the fix.
"""

from __future__ import annotations

import multiprocessing

from device import StrataError


class CloudError(StrataError):
    """Base class of every error the cloud tier raises on purpose."""


class ColocatedError(CloudError):
    """Base class of the shared-memory env worker pool's errors."""


class PoolStateError(ColocatedError):
    """A pool method was called in the wrong state (e.g. `step_wait` with no step in flight)."""


class UnsupportedSpaceError(ColocatedError, TypeError):
    """An observation or action space cannot be laid out as one fixed-shape numpy array."""


class EnvWorkerError(ColocatedError):
    """An environment raised inside a worker process.

    Attributes:
        env_index: Index of the failing env in the vector (0 .. num_envs-1).
        worker_index: Index of the worker process that held it.
        remote_traceback: The formatted traceback from the worker.
    """

    def __init__(self, message: str, *, env_index: int, worker_index: int, remote_traceback: str) -> None:
        super().__init__(message)
        self.env_index = env_index
        self.worker_index = worker_index
        self.remote_traceback = remote_traceback


class WorkerFailedError(ColocatedError):
    """A worker process died or did not answer within its timeout.

    Attributes:
        worker_index: Index of the worker process.
    """

    def __init__(self, message: str, *, worker_index: int) -> None:
        super().__init__(message)
        self.worker_index = worker_index


class WorkerTimeoutError(WorkerFailedError, multiprocessing.TimeoutError):
    """A worker did not answer within the timeout the caller passed to a ``*_wait`` call (it was restarted)."""


class InfoEncodingError(ColocatedError, TypeError):
    """An env returned an info value that cannot cross the pool's info channel (`cloud.rollout._infocodec`)."""


class HybridError(CloudError):
    """Hybrid learner units cannot go on together (different starting policies, a lost unit, a failed launch)."""

"""What a hybrid run is made of: `HybridConfig` (the CLI's flags) and `UnitSpec` (everything one unit is told)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloud.runs._stop import ROLLING_EVERY_S
from device import ConfigError

if TYPE_CHECKING:
    from cloud.learners._ppo_config import PPOConfig
    from cloud.switching._modes import SwitchingConfig

HYBRID_MODE = "hybrid"
"""The ``--modes`` word that selects hybrid units; the modes after it are what each unit's rollouts use."""

DEFAULT_UNITS = 2
"""Units strata starts on this host when neither ``--units`` nor torchrun says otherwise."""

TORCHRUN_VARIABLES = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""Environment a launcher of torch.distributed workers (torchrun, elastic_launch) gives every unit."""


@dataclass(frozen=True, kw_only=True)
class HybridConfig:
    """How many learner units train together, what each one runs, and how the group copes with faults."""

    # --- units ---
    units: int | None = None
    """Unit processes strata starts on this host (None: 2). Under torchrun the world size decides; a --units that
    differs from it is an error."""
    workers_per_unit: int | None = None
    """Env worker processes in each unit's co-located pool (None: the co-located mode's own choice)."""

    # --- faults ---
    max_restarts: int = 0
    """When strata starts the units itself: how often the whole group is restarted after a unit fails (torchrun's
    --max-restarts); every restart resumes from the last checkpoint. Under torchrun, pass torchrun's flag instead."""
    collective_timeout_s: float = 300.0
    """A unit that waits longer than this for the others in a collective gives up and the run stops."""

    # --- rank 0's services ---
    param_server_host: str = "127.0.0.1"
    """Address rank 0's parameter server listens on (every version is pushed to it)."""
    param_server_port: int = 0
    """Port of rank 0's parameter server (0: a free one, written to RUN_DIR/paramserver.json)."""
    param_server_health_port: int | None = None
    """Also answer grpc.health.v1 in plaintext on this port of rank 0 (nothing else), for probes that speak no TLS
    (Kubernetes' gRPC probes). None: no such port."""

    def __post_init__(self) -> None:
        if self.units is not None and self.units < 1:
            raise ConfigError(f"HybridConfig: units must be >= 1, got {self.units}")
        if self.workers_per_unit is not None and self.workers_per_unit < 1:
            raise ConfigError(f"HybridConfig: workers_per_unit must be >= 1, got {self.workers_per_unit}")
        if self.max_restarts < 0:
            raise ConfigError(f"HybridConfig: max_restarts must be >= 0, got {self.max_restarts}")
        if self.collective_timeout_s <= 0:
            raise ConfigError(f"HybridConfig: collective_timeout_s must be > 0, got {self.collective_timeout_s}")
        if not 0 <= self.param_server_port < 65536:
            raise ConfigError(f"HybridConfig: param_server_port must be a TCP port, got {self.param_server_port}")
        if self.param_server_health_port is not None and not 0 <= self.param_server_health_port < 65536:
            raise ConfigError(f"HybridConfig: param_server_health_port must be a TCP port, got "
                              f"{self.param_server_health_port}")


@dataclass(frozen=True, kw_only=True)
class UnitSpec:
    """Everything a unit needs to train, the same value in every unit.

    It travels to spawned units pickled by the local launcher, or is rebuilt from the same command line
    under torchrun.
    """

    env_id: str
    total_steps: int
    """Env-step budget of the whole run, all units together."""
    run_dir: Path
    seed: int = 0
    config: PPOConfig
    """Each unit's PPO hyperparameters: ``num_envs`` and ``num_steps`` are per unit, so one update consumes
    ``units * num_envs * num_steps`` transitions."""
    switching: SwitchingConfig
    """The rollout modes of every unit (``modes`` without ``hybrid``) and whether rank 0 serves control."""
    hybrid: HybridConfig = field(default_factory=HybridConfig)
    resume: bool = False
    target_return: float | None = None
    confirm_episodes: int = 0
    checkpoint_every: int = 100
    rolling_checkpoint_s: float = ROLLING_EVERY_S
    """Seconds between rank 0's rolling checkpoints (`cloud.runs._stop.Checkpointer`; 0: every update)."""
    progress: bool | None = None
    resume_command: str | None = None
    """The command rank 0's stop line tells the user to run (default: the basic ``strata train ... --resume``)."""

    def __post_init__(self) -> None:
        if self.total_steps < 1:
            raise ConfigError(f"train: total_steps must be >= 1, got {self.total_steps}")
        if self.checkpoint_every < 1 or self.confirm_episodes < 0:
            raise ConfigError(f"train: checkpoint_every must be >= 1 and confirm_episodes >= 0, got "
                              f"{self.checkpoint_every} and {self.confirm_episodes}")
        if self.config.target_kl is not None:
            raise ConfigError(f"train --modes hybrid: --target-kl {self.config.target_kl} is not supported: units "
                              "would end their epochs at different minibatches; drop --target-kl")
        if HYBRID_MODE in self.switching.modes:
            raise ConfigError("UnitSpec: switching.modes are the units' rollout modes; leave 'hybrid' out")

    def replace(self, **changes: Any) -> UnitSpec:
        """A copy with `changes`."""
        return dataclasses.replace(self, **changes)


def under_torchrun() -> bool:
    """True when this process is a worker started by torchrun (or torch's elastic launcher)."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES)

"""Hybrid units: co-located PPO learner replicas that train one policy together through torch.distributed.

A unit is one learner process plus its own rollout sources (by default a `SharedMemoryVectorEnv` of
``--workers-per-unit`` env workers). Units join one torch.distributed process group (gloo on CPU), started
by torchrun on one host or many, or by strata itself for ``--units U`` on one host. Each unit runs this
state machine; the arrows that cross units are collectives, which every unit enters at the same point:

    RENDEZVOUS ── c10d: the launcher gives each unit RANK / WORLD_SIZE; the unit builds its sources, joins the
        │         group, takes rank 0's weights (broadcast) and checks every unit holds the same policy digest
        v
    COLLECT ───── its own rollout: num_envs x num_steps transitions from its own envs, with policy version v
        │
        v
    UPDATE ────── PPO epochs; after every backward pass an ALL-REDUCE averages the gradients, so every
        │         replica clips and steps with the same gradient and the weights stay identical
        v
    MERGE ─────── ALL-GATHER of each unit's summary: env steps, finished episodes, observation moments (every
        │         unit folds all of them into its normaliser in rank order: one normalisation everywhere),
        │         status figures, and whether a stop signal arrived
        v
    DECIDE ────── rank 0 BROADCASTs its decision: go on, stop (solved, budget, signal), or switch every unit's
        │         rollout mode to M (a `strata switch` it received), carried out by all at this boundary
        v
    CHECKPOINT ── rank 0 commits version v+1 (`cloud.runs._stop.Checkpointer`: kept every `checkpoint_every`
        │         updates, else the rolling checkpoint), publishes it to its parameter server, logs metrics
        │         and serves status ──> COLLECT, or
        v
    STOP ──────── rank 0 writes the final checkpoint of the last completed update; sources close.
                  A failure anywhere (a unit killed, a collective timeout) raises in the others' next
                  collective: rank 0 checkpoints the last completed update and the group exits; under
                  ``torchrun --max-restarts N`` the launcher restarts every unit, and they resume from it.

Only rank 0 talks to the rest of strata (parameter server, checkpoints, the control endpoint). The run
dir must be storage every unit sees, so a restarted unit resumes from rank 0's checkpoints.
"""

from cloud.hybrid._config import HybridConfig, UnitSpec
from cloud.hybrid._launch import train_hybrid
from cloud.hybrid._unit import HybridResult

__all__ = ["HybridConfig", "HybridResult", "UnitSpec", "train_hybrid"]

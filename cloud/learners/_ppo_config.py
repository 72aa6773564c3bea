"""`PPOConfig`: the hyperparameters of strata's PPO, their checks and the values derived from them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from device import ConfigError, ObsCodec, ObsPipeline, config_from_dict


@dataclass(frozen=True, kw_only=True)
class PPOConfig:
    """Hyperparameters of strata's PPO.

    The defaults are tuned for sample efficiency and wall-clock speed on small classic-control tasks
    (many short rollouts, 20 epochs of one full-batch step each, lr 1e-3 annealed): they solve
    CartPole-v1 (20-episode mean >= 475) in about 30k env steps. Longer-horizon or continuous tasks
    want bigger batches and minibatches (see tests/cloud/test_ppo_solves.py for Pendulum-v1).
    """

    # --- rollout ---
    num_envs: int = 8
    """Parallel environments that feed the learner."""
    num_steps: int = 32
    """Steps per environment in each rollout (the batch is num_envs * num_steps transitions)."""
    env_mode: str = "colocated"
    """Where the envs run: a mode registered in cloud.rollout._envs.VECTOR_ENV_MODES ("colocated" = the shared-memory
    worker pool on this host, "sync" = in the learner process, "decoupled" = gRPC env services)."""

    # --- optimisation ---
    learning_rate: float = 1e-3
    """Adam step size at the start of training."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to zero over the run's total steps."""
    update_epochs: int = 20
    """Passes over each rollout batch."""
    num_minibatches: int = 1
    """Minibatches per pass (the minibatch is batch_size / num_minibatches transitions)."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm to this value."""
    target_kl: float | None = None
    """Stop an update's epochs early once the approximate KL exceeds this (None: never)."""

    # --- PPO objective ---
    gamma: float = 0.98
    """Discount factor."""
    gae_lambda: float = 0.8
    """Lambda of generalised advantage estimation."""
    clip_coef: float = 0.2
    """Surrogate clipping range epsilon (ratio kept within 1 +- clip_coef)."""
    clip_vloss: bool = True
    """Clip the value loss around the old value estimate, with the same clip_coef."""
    norm_adv: bool = True
    """Normalise advantages to mean 0 and std 1 within each minibatch."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    vtrace_rho_bar: float = 1.0
    """Experience acted by an older policy (the edge fleet's, with its behaviour log-probs): truncation of each step's
    importance weight in the V-trace advantages (cloud.learners._losses.compute_vtrace)."""
    vtrace_c_bar: float = 1.0
    """Truncation of the V-trace traces that carry later TD errors back (with gae_lambda)."""

    # --- observations ---
    normalize_obs: bool = True
    """Normalise observations by running mean and std (the statistics are exported inside the ONNX graph)."""
    obs_clip: float = 10.0
    """Clip normalised observations to +- this value."""

    # --- image observations ---
    frame_stack: int = 1
    """Observations stacked per step (gymnasium's FrameStackObservation; 1: none), in every mode and at the edge."""
    obs_codec: Literal["raw", "png", "webp", "jxl"] = "raw"
    """How image observations travel between env hosts and the learner (decoupled, fragments, functions, edge
    experience): raw arrays, or PNG / WebP / JPEG-XL frames (Pillow; `pip install 'strata[images]'`)."""
    obs_quality: int = 0
    """0: the codec is lossless; 1-100: lossy quality (webp, jxl). A lossy codec is applied once where each frame
    is made, so the policy learns from, acts on and is deployed with the decoded frames."""
    network: Literal["auto", "mlp", "cnn"] = "auto"
    """Policy network: auto picks the Nature CNN for image observations and the MLP (hidden_sizes) otherwise."""

    # --- rewards ---
    normalize_reward: bool = False
    """Scale the rewards the update sees by the running std of the discounted return (SB3's VecNormalize reward
    scaling); reported episode returns stay unscaled."""
    reward_clip: float = 10.0
    """Clip scaled rewards to +- this value (with normalize_reward)."""

    # --- network ---
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the actor and of the critic (tanh activations)."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions only)."""
    ortho_init: bool = True
    """Orthogonal weights (gain sqrt(2) for hidden layers, 0.01 for the policy head, 1 for the value head) and zero
    biases; false keeps torch's default nn.Linear initialisation (SB3's ortho_init=False)."""
    use_sde: bool = False
    """Generalised state-dependent exploration (Box actions only; SB3's use_sde): the action noise is the actor's
    last hidden features times a noise matrix redrawn every sde_sample_freq steps; init_log_std (SAC:
    sde_log_std_init) then sets that matrix's scale. PPO: not with the functions or fragments modes, whose remote
    actors add plain Gaussian noise."""
    sde_sample_freq: int = -1
    """Steps between two draws of the gSDE noise matrix; -1 draws it only at the start of each rollout (SAC: of
    each episode)."""

    # --- compute ---
    torch_threads: int = 1
    """Torch intra-op threads; one is fastest for networks this small and leaves cores to the envs."""

    def __post_init__(self) -> None:
        positive = ("num_envs", "num_steps", "update_epochs", "num_minibatches", "torch_threads")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"PPOConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.sde_sample_freq == 0 or self.sde_sample_freq < -1:
            raise ConfigError(f"PPOConfig: sde_sample_freq must be -1 (once per rollout) or >= 1, got "
                              f"{self.sde_sample_freq}")
        if self.batch_size % self.num_minibatches:
            raise ConfigError(f"PPOConfig: num_envs * num_steps = {self.batch_size} must be divisible by "
                              f"num_minibatches = {self.num_minibatches}")
        for name in ("learning_rate", "max_grad_norm", "clip_coef", "obs_clip", "reward_clip", "vtrace_rho_bar",
                     "vtrace_c_bar"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"PPOConfig: {name} must be > 0, got {getattr(self, name)}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"PPOConfig: {name} must be within [0, 1], got {getattr(self, name)}")
        try:
            self.pipeline  # noqa: B018  (checks frame_stack, obs_codec and obs_quality together)
        except ConfigError as exc:
            raise ConfigError(f"PPOConfig: {exc}") from None
        if not self.hidden_sizes or min(self.hidden_sizes) < 1:
            raise ConfigError(f"PPOConfig: hidden_sizes must be positive widths, got {self.hidden_sizes}")

    # --- derived values (computed here only) ---
    @property
    def pipeline(self) -> ObsPipeline:
        """The observation pipeline every env of the run is made with."""
        codec = ObsCodec.from_flags(self.obs_codec, self.obs_quality)
        return ObsPipeline(frame_stack=self.frame_stack, obs_codec=codec.spec)

    @property
    def batch_size(self) -> int:
        """Transitions per rollout: ``num_envs * num_steps``."""
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        """Transitions per gradient step: ``batch_size // num_minibatches``."""
        return self.batch_size // self.num_minibatches

    def num_updates(self, total_steps: int) -> int:
        """Updates (policy versions) in a run of `total_steps` env steps; at least one."""
        return max(1, total_steps // self.batch_size)

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as JSON-able plain values (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PPOConfig:
        """Inverse of `to_dict`; unknown keys are an error."""
        return config_from_dict(cls, values)

    @classmethod
    def from_flags(cls, args: Any, *, base: PPOConfig | None = None) -> PPOConfig:
        """The config `strata train` runs with: the flags given on `args`, over `base` (a resumed run's config).

        A resumed run passes its checkpoint's config as `base`, so it keeps its lineage's hyperparameters.
        """
        given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if getattr(args, f.name) is not None}
        given = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
        return cls(**given) if base is None else dataclasses.replace(base, **given)

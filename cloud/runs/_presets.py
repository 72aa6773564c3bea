"""Tuned presets: per algorithm and env id, the hyperparameters, budget and solved threshold `strata train` uses.

The registry is data shipped with the package, one TOML file per algorithm (``cloud/presets/ppo.toml``,
``cloud/presets/sac.toml``), read with the standard library's `tomllib`. Each entry names where its numbers
came from (mostly RL Baselines3 Zoo's tuned hyperparameter files) and whether strata has verified them.

How `strata train` resolves its settings (`apply_preset`), for a fresh run:

1. ``--preset none``: the plain ``PPOConfig`` / ``SACConfig`` defaults; ``--total-steps`` is required.
2. ``--preset auto`` (the default) and the env has a preset: the preset's config fields and, when
   ``--total-steps`` is not given, its budget and (PPO, unless ``--target-return`` is given) a stop once its
   solved threshold is reached; a run given ``--total-steps`` trains that many steps. Every flag given on the
   command line overrides its single value. One line says which preset is used.
3. No preset for the env: the defaults, with a one-line note.

A resumed run keeps its checkpoint's hyperparameters; only the preset's budget and solved threshold apply to it
(so the command that resumes a preset run needs no more flags than the one that started it).

Envs from gymnasium's Box2D and MuJoCo families need the ``box2d`` / ``mujoco`` extras; `require_env_extra`
turns a missing one into one line naming the extra.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.resources
import importlib.util
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from device import ConfigError, MissingDependencyError

ALGOS = ("ppo", "sac")
"""Algorithms with a presets file (``cloud/presets/{algo}.toml``)."""

ENV_EXTRAS = {"box2d": "Box2D", "mujoco": "mujoco"}
"""strata extra -> the module it installs; an env whose gymnasium entry point lies in
``gymnasium.envs.{extra}`` needs that extra."""

_KEYS = {"budget", "solved", "source", "verified", "config", "extra"}
UNVERIFIED = "not yet verified by strata"
"""What the `Preset.verified` text of a preset nobody has run with strata yet contains."""


@dataclass(frozen=True, kw_only=True)
class Preset:
    """One entry of the registry: settings for training `algo` on `env_id`."""

    algo: str
    """``"ppo"`` or ``"sac"``."""
    env_id: str
    """The gymnasium env id the preset is for."""
    config: Mapping[str, Any]
    """Fields of the algorithm's config dataclass (``PPOConfig`` / ``SACConfig``); others keep their defaults."""
    budget: int
    """Env steps of a run that does not give ``--total-steps``."""
    solved: float
    """Return that counts as solved (gymnasium's reward threshold where it has one)."""
    source: str
    """Where the numbers came from."""
    verified: str
    """What strata measured with these settings, or a text containing `UNVERIFIED`."""
    extra: str | None = None
    """The strata extra the env needs beyond ``[cloud]`` (``"box2d"``, ``"mujoco"``), if any."""

    @property
    def is_verified(self) -> bool:
        """Whether strata has run these settings (the data file says what it measured)."""
        return UNVERIFIED not in self.verified

    def make_config(self, **overrides: Any) -> Any:
        """The algorithm's config dataclass with this preset's fields, then `overrides`."""
        return config_class(self.algo)(**{**self.config, **overrides})


def config_class(algo: str) -> type:
    """``PPOConfig`` for ``"ppo"``, ``SACConfig`` for ``"sac"``."""
    if algo == "ppo":
        from cloud.learners._ppo_config import PPOConfig

        return PPOConfig
    if algo == "sac":
        from cloud.learners._sac import SACConfig

        return SACConfig
    raise ConfigError(f"presets: algo {algo!r} has no presets; choose one of {', '.join(ALGOS)}")


@functools.cache
def load_presets(algo: str) -> Mapping[str, Preset]:
    """Every preset of `algo`, by env id, read from the package's ``presets/{algo}.toml``.

    Raises:
        ConfigError: `algo` is unknown, or the file names a key or config field that does not exist.
    """
    cls = config_class(algo)
    fields = {f.name for f in dataclasses.fields(cls)}
    text = importlib.resources.files("cloud").joinpath("presets", f"{algo}.toml").read_text(encoding="utf-8")
    presets: dict[str, Preset] = {}
    for env_id, entry in tomllib.loads(text).items():
        where = f"presets/{algo}.toml [{env_id}]"
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown keys {unknown}; known: {sorted(_KEYS)}")
        config = {k: tuple(v) if isinstance(v, list) else v for k, v in entry.get("config", {}).items()}
        bad = sorted(set(config) - fields)
        if bad:
            raise ConfigError(f"{where}: {bad} are not {cls.__name__} fields")
        extra = entry.get("extra") or None
        if extra is not None and extra not in ENV_EXTRAS:
            raise ConfigError(f"{where}: extra {extra!r} is not one of {sorted(ENV_EXTRAS)}")
        presets[env_id] = Preset(algo=algo, env_id=env_id, config=MappingProxyType(config),
                                 budget=int(entry["budget"]), solved=float(entry["solved"]),
                                 source=str(entry["source"]), verified=str(entry["verified"]), extra=extra)
    return MappingProxyType(presets)


def find_preset(algo: str, env_id: str) -> Preset | None:
    """The preset of `algo` for `env_id`, or None when the registry has none."""
    return load_presets(algo).get(env_id)


def env_extra(env_id: str) -> str | None:
    """The strata extra (``"box2d"``, ``"mujoco"``) that `env_id` needs beyond ``[cloud]``, or None.

    Read from the env's gymnasium entry point; an env id gymnasium does not know needs none here
    (the caller's own check reports it).
    """
    import gymnasium

    spec = gymnasium.registry.get(env_id)
    entry_point = spec.entry_point if spec is not None else None
    if not isinstance(entry_point, str):
        return None
    for extra in ENV_EXTRAS:
        if entry_point.startswith(f"gymnasium.envs.{extra}."):
            return extra
    return None


def require_env_extra(env_id: str) -> None:
    """Raise `MissingDependencyError`, naming the extra, when `env_id` needs one that is not installed."""
    extra = env_extra(env_id)
    if extra is not None and importlib.util.find_spec(ENV_EXTRAS[extra]) is None:
        raise MissingDependencyError(
            f"train: {env_id!r} needs a package that is not installed: {ENV_EXTRAS[extra]}; install strata's "
            f"{extra} extra: pip install 'strata[{extra}]'")


def apply_preset(args: argparse.Namespace, *, log: Callable[[str], None] = print) -> Preset | None:
    """Fill the `strata train` flags that were not given from the env's preset; return the preset used.

    Reads ``args.algo``, ``args.env``, ``args.preset`` (``"auto"`` or ``"none"``), ``args.resume``,
    ``args.total_steps`` and ``args.target_return``; a flag given on the command line (not None) is never
    replaced, and with ``args.resume`` only the budget and the target come from the preset. Logs one line
    saying which preset is used, or that none is.

    Raises:
        ConfigError: ``--total-steps`` is missing and no preset supplies a budget.
        MissingDependencyError: The env needs the box2d or mujoco extra and it is not installed.
    """
    require_env_extra(args.env)
    preset = find_preset(args.algo, args.env) if args.preset == "auto" else None
    if preset is None and args.preset == "auto" and not args.resume:
        log(f"strata train: no {args.algo} preset for {args.env}; training on {config_class(args.algo).__name__}'s "
            f"defaults (presets: {', '.join(load_presets(args.algo))})")
    if preset is not None:
        if not args.resume:  # a resumed run keeps its checkpoint's hyperparameters
            for name, value in preset.config.items():
                if getattr(args, name, None) is None:
                    setattr(args, name, value)
        if args.total_steps is None:
            # The preset's run: its budget, stopping once solved. A run given --total-steps trains that many.
            args.total_steps = preset.budget
            if args.target_return is None and args.algo == "ppo":
                args.target_return = preset.solved
        checked = "verified by strata" if preset.is_verified else UNVERIFIED
        what = "budget and solved threshold of preset" if args.resume else "preset"
        stop = "" if args.target_return is None else f", stopping once the return reaches {args.target_return:g}"
        log(f"strata train: {what} {args.algo}/{args.env} ({checked}; cloud/presets/{args.algo}.toml): "
            f"{args.total_steps:,} env steps{stop}; flags given override it, --preset none uses the defaults")
    if args.total_steps is None:
        why = "--preset none" if args.preset == "none" else f"no {args.algo} preset for {args.env}"
        raise ConfigError(f"train: --total-steps is required ({why}); give the env-step budget, e.g. "
                          "--total-steps 100000")
    return preset

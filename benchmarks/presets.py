"""Presets: strata with its tuned presets vs Stable-Baselines3 with RL Zoo's settings, per env and algorithm, one run.

For every (algorithm, env) with a preset in ``cloud/presets/``, each seed trains strata (the preset's config,
in-process envs like SB3's DummyVecEnv, one torch thread) and SB3 (RL Baselines3 Zoo's published
hyperparameters for the same env, transcribed in `ZOO` below from hyperparams/ppo.yml and sac.yml at commit
00128b5d46d497b772f3bd891ae9f520919e8971), interleaved so load changes on a shared machine hit both. Both stop
when the mean return of their last 20 training episodes first reaches the preset's solved threshold, or at the
budget (the Zoo's n_timesteps), and we record the env steps, wall-clock seconds and this process's CPU seconds
to that moment (from constructing the learner; CPU seconds vary less on a loaded machine) or, unsolved, the
20-episode mean at the budget. MuJoCo cases (SAC on HalfCheetah-v5,
Hopper-v5) run a fixed 100k steps and compare the mean of the last 10 training episodes.

    .venv/bin/python benchmarks/presets.py                      # classic control + Box2D, 3 seeds
    .venv/bin/python benchmarks/presets.py --family mujoco      # the MuJoCo comparison at 100k steps (slow)
    .venv/bin/python benchmarks/presets.py --only ppo/Pendulum-v1 --only sac/Pendulum-v1 --seeds 3
    .venv/bin/python benchmarks/presets.py --quick              # classic control, 1 seed, each run capped at
                                                                # 1k steps: a smoke pass, not the figures

The last line of output is one JSON object with every run and, per case, strata's and SB3's medians.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WINDOW = 20
MUJOCO_STEPS = 100_000
QUICK_CAP = 1_000
PROGRESS_EVERY_S = 60.0  # a progress line on stderr at most this often: the long cases run for hours

FAMILIES = {
    "classic": ["ppo/CartPole-v1", "ppo/Acrobot-v1", "ppo/MountainCar-v0", "ppo/MountainCarContinuous-v0",
                "ppo/Pendulum-v1", "sac/Pendulum-v1", "sac/MountainCarContinuous-v0"],
    "box2d": ["ppo/LunarLander-v3", "ppo/LunarLanderContinuous-v3", "sac/LunarLanderContinuous-v3"],
    "mujoco": ["sac/HalfCheetah-v5", "sac/Hopper-v5"],
}

# RL Baselines3 Zoo's entries as SB3 keyword arguments. "lin_X" schedules become linear decays from X;
# "normalize: true" is VecNormalize over observations and rewards; the v2 LunarLander entries serve the v3 envs.
ZOO: dict[str, dict[str, Any]] = {
    "ppo/CartPole-v1": {"n_envs": 8, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98,
                        "n_epochs": 20, "ent_coef": 0.0, "learning_rate": "lin_0.001", "clip_range": "lin_0.2"},
    "ppo/Acrobot-v1": {"normalize": True, "n_envs": 16, "n_steps": 256, "gae_lambda": 0.94, "gamma": 0.99,
                       "n_epochs": 4, "ent_coef": 0.0},
    "ppo/MountainCar-v0": {"normalize": True, "n_envs": 16, "n_steps": 16, "gae_lambda": 0.98, "gamma": 0.99,
                           "n_epochs": 4, "ent_coef": 0.0},
    "ppo/MountainCarContinuous-v0": {"normalize": True, "n_envs": 1, "batch_size": 256, "n_steps": 8,
                                     "gamma": 0.9999, "learning_rate": 7.77e-05, "ent_coef": 0.00429,
                                     "clip_range": 0.1, "n_epochs": 10, "gae_lambda": 0.9, "max_grad_norm": 5.0,
                                     "vf_coef": 0.19, "use_sde": True,
                                     "policy_kwargs": {"log_std_init": -3.29, "ortho_init": False}},
    "ppo/Pendulum-v1": {"n_envs": 4, "n_steps": 1024, "gae_lambda": 0.95, "gamma": 0.9, "n_epochs": 10,
                        "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2, "use_sde": True,
                        "sde_sample_freq": 4},
    "ppo/LunarLander-v3": {"n_envs": 16, "n_steps": 1024, "batch_size": 64, "gae_lambda": 0.98, "gamma": 0.999,
                           "n_epochs": 4, "ent_coef": 0.01},
    "ppo/LunarLanderContinuous-v3": {"n_envs": 16, "n_steps": 1024, "batch_size": 64, "gae_lambda": 0.98,
                                     "gamma": 0.999, "n_epochs": 4, "ent_coef": 0.01},
    "sac/Pendulum-v1": {"learning_rate": 1e-3},
    "sac/MountainCarContinuous-v0": {"learning_rate": 3e-4, "buffer_size": 50_000, "batch_size": 512,
                                     "ent_coef": 0.1, "train_freq": 32, "gradient_steps": 32, "gamma": 0.9999,
                                     "tau": 0.01, "learning_starts": 0, "use_sde": True,
                                     "policy_kwargs": {"log_std_init": -3.67, "net_arch": [64, 64]}},
    "sac/LunarLanderContinuous-v3": {"batch_size": 256, "learning_rate": "lin_7.3e-4", "buffer_size": 1_000_000,
                                     "ent_coef": "auto", "gamma": 0.99, "tau": 0.01, "train_freq": 1,
                                     "gradient_steps": 1, "learning_starts": 10_000,
                                     "policy_kwargs": {"net_arch": [400, 300]}},
    "sac/HalfCheetah-v5": {"learning_starts": 10_000},
    "sac/Hopper-v5": {"learning_starts": 10_000},
}


class Window:
    """The moving mean of the last `WINDOW` training returns, and when it first reached `target`."""

    def __init__(self, target: float | None) -> None:
        self.target = target
        self.returns: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.solved: tuple[int, float, float] | None = None

    def add(self, episodic_return: float, step: int, started: float) -> None:
        """Count one finished episode that ended at env step `step`."""
        self.returns.append(episodic_return)
        if (self.solved is None and self.target is not None and len(self.returns) == WINDOW
                and sum(self.returns) / WINDOW >= self.target):
            self.solved = (step, time.perf_counter() - started, time.process_time())

    def mean(self, last: int = WINDOW) -> float:
        """Mean of the last `last` returns (NaN before any)."""
        tail = list(self.returns)[-last:]
        return sum(tail) / len(tail) if tail else float("nan")


class Progress:
    """A line on stderr now and then (env steps, the 20-episode mean, time taken), so an hours-long run shows life."""

    def __init__(self, label: str, budget: int, started: float, every_s: float = PROGRESS_EVERY_S) -> None:
        self.label, self.budget, self.started, self.every_s = label, budget, started, every_s
        self._last = started

    def update(self, step: int, window: Window) -> None:
        """Report the env steps so far and the window's mean, if the last line is `every_s` old."""
        if time.perf_counter() - self._last >= self.every_s:
            mean = "-" if not window.returns else f"{window.mean():.1f}"
            self.line(f"{step:,}/{self.budget:,} env steps  return({WINDOW}) {mean}")

    def line(self, text: str) -> None:
        """Print `text` (also one of strata's own progress lines) if the last line is `every_s` old."""
        now = time.perf_counter()
        if now - self._last >= self.every_s:
            self._last = now
            print(f"  {self.label}: {text}  {now - self.started:,.0f} s", file=sys.stderr, flush=True)


def result(window: Window, steps: int, started: float, cpu_started: float, *, last: int = WINDOW) -> dict[str, Any]:
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    if window.solved is not None:
        return {"solved": True, "steps": window.solved[0], "wall_s": round(window.solved[1], 2),
                "cpu_s": round(window.solved[2] - cpu_started, 2), "return": round(window.mean(last), 1)}
    return {"solved": False, "steps": steps, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "return": round(window.mean(last), 1)}


def run_strata(algo: str, env_id: str, seed: int, budget: int, target: float | None,
               progress: Progress, overrides: dict[str, Any]) -> dict[str, Any]:
    from cloud.runs._presets import find_preset

    preset = find_preset(algo, env_id)
    assert preset is not None, f"no {algo} preset for {env_id}"
    from cloud.learners._sac import SACTrainer
    from cloud.runs._train import train

    started, cpu_started = time.perf_counter(), time.process_time()
    if algo == "ppo":
        with tempfile.TemporaryDirectory() as run_dir:
            # In-process envs, like SB3's DummyVecEnv. No confirmation: the criterion is the one SB3's callback
            # applies, the mean of the last 20 training episodes.
            out = train(env_id=env_id, total_steps=budget, run_dir=Path(run_dir), seed=seed,
                        config=preset.make_config(**{**overrides, "env_mode": "sync"}), target_return=target,
                        confirm_episodes=0, progress=False, log=progress.line)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        solved = out.solved_at_step is not None
        if solved:  # to the solved moment, as SB3's callback measures: not the final checkpoint, nor the teardown
            assert out.solved_at_s is not None and out.solved_at_cpu_s is not None
            wall -= out.wall_s - out.solved_at_s
            cpu -= out.cpu_s - out.solved_at_cpu_s
        return {"solved": solved, "steps": out.solved_at_step if solved else out.global_step,
                "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "return": round(out.mean_return, 1)}
    # In-process envs and replay, like SB3's.
    trainer = SACTrainer(preset.make_config(**{**overrides, "env_mode": "sync", "replay": "local"}), env_id=env_id,
                         seed=seed, total_steps=budget)
    window = Window(target)
    try:
        seen = 0
        while trainer.global_step < budget and window.solved is None:
            trainer.run(min(budget, trainer.global_step + 100))  # the window is checked every 100 env steps
            for r in trainer.train_returns[seen:]:
                window.add(r, trainer.global_step, started)
            seen = len(trainer.train_returns)
            progress.update(trainer.global_step, window)
        return result(window, trainer.global_step, started, cpu_started, last=WINDOW if target is not None else 10)
    finally:
        trainer.close()


def _schedule(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda remaining: remaining * start
    return value


def run_sb3(algo: str, env_id: str, seed: int, budget: int, target: float | None,
            progress: Progress, overrides: dict[str, Any]) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    assert not overrides, "--set changes strata's preset only"
    kwargs = dict(ZOO[f"{algo}/{env_id}"])
    normalize = kwargs.pop("normalize", False)
    n_envs = kwargs.pop("n_envs", 1)
    kwargs = {k: _schedule(v) for k, v in kwargs.items()}
    policy_kwargs = dict(kwargs.pop("policy_kwargs", {}))
    if "activation_fn" in policy_kwargs:
        policy_kwargs["activation_fn"] = getattr(torch.nn, policy_kwargs["activation_fn"])
    started, cpu_started = time.perf_counter(), time.process_time()
    window = Window(target)

    class Watch(BaseCallback):
        """Feed the window from Monitor's episode returns; stop once it is solved."""

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    window.add(float(info["episode"]["r"]), self.num_timesteps, started)
            progress.update(self.num_timesteps, window)
            return window.solved is None

    envs = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    if normalize:
        envs = VecNormalize(envs, gamma=kwargs.get("gamma", 0.99))
    cls = PPO if algo == "ppo" else SAC
    model = cls("MlpPolicy", envs, seed=seed, device="cpu", verbose=0, policy_kwargs=policy_kwargs or None, **kwargs)
    model.learn(total_timesteps=budget, callback=Watch())
    envs.close()
    return result(window, model.num_timesteps, started, cpu_started, last=WINDOW if target is not None else 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"classic control, 1 seed, runs capped at {QUICK_CAP:,} env steps (a smoke pass)")
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES),
                        help="env families to run (repeatable; default: classic and box2d)")
    parser.add_argument("--only", action="append", metavar="ALGO/ENV", help="run only these cases (repeatable)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per learner and case (default: %(default)s)")
    parser.add_argument("--first-seed", type=int, default=0, metavar="N",
                        help="seeds N, N+1, ... (to complete a table run in parts; default: %(default)s)")
    parser.add_argument("--learners", default="strata,sb3", help="comma-separated (default: %(default)s)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                        help="change one field of strata's preset config (repeatable; a sweep, e.g. "
                             "--set 'hidden_sizes=[256, 256]' --learners strata)")
    args = parser.parse_args()
    overrides: dict[str, Any] = {}
    for item in args.set:
        field, _, value = item.partition("=")
        try:
            overrides[field.strip()] = json.loads(value)
        except json.JSONDecodeError:
            parser.error(f"--set {item}: write FIELD=JSON, e.g. --set 'hidden_sizes=[256, 256]' (a string in double "
                         "quotes)")
    if overrides and "sb3" in args.learners.split(","):
        parser.error(f"--set {args.set[0]}: changes strata's preset only; pass --learners strata with it")

    import torch
    import torch._dynamo

    from cloud.runs._presets import find_preset

    # torch's first optimizer imports torch._dynamo (~1.6 s of CPU here), imported above so that neither learner's
    # clock holds it: strata runs first and would otherwise pay it alone, on its first seed.
    torch.set_num_threads(1)
    families = ["classic"] if args.quick else (args.family or ["classic", "box2d"])
    cases = args.only or [case for family in families for case in FAMILIES[family]]
    unknown = [c for c in cases if c not in ZOO]
    if unknown:
        parser.error(f"--only {unknown[0]}: not a case; choose from {', '.join(ZOO)}")
    for case in cases if overrides else []:  # a misspelt field fails now, not after hours of other runs
        algo, env_id = case.split("/")
        preset = find_preset(algo, env_id)
        assert preset is not None, case
        try:
            preset.make_config(**overrides)
        except (TypeError, ValueError) as exc:
            parser.error(f"--set {' '.join(args.set)}: {exc} (for {case})")
        for field, value in overrides.items():  # the config takes any value; a wrong kind fails only mid-run
            default = getattr(preset.make_config(), field)
            if not _same_kind(value, default):
                parser.error(f"--set {field}={json.dumps(value)}: {case}'s {field} is {default!r}; give a value "
                             "of that kind")
    if args.seeds < 1 or args.first_seed < 0:
        parser.error(f"--seeds {args.seeds} --first-seed {args.first_seed}: need at least one seed, from 0 up")
    seeds = list(range(args.first_seed, args.first_seed + (1 if args.quick else args.seeds)))
    learners: dict[str, Callable[..., dict[str, Any]]] = {"strata": run_strata, "sb3": run_sb3}
    chosen = [name for name in args.learners.split(",") if name]
    unknown_learners = [name for name in chosen if name not in learners]
    if unknown_learners:
        parser.error(f"--learners {unknown_learners[0]}: not a learner; choose from {', '.join(learners)}")
    runs: list[dict[str, Any]] = []
    print(f"{'case':<30} {'learner':<7} {'seed':>4} {'solved':>6} {'env steps':>10} {'wall s':>8} {'cpu s':>8} "
          f"{'return':>8}",
          flush=True)
    for case in cases:
        algo, env_id = case.split("/")
        preset = find_preset(algo, env_id)
        assert preset is not None, case
        mujoco = case in FAMILIES["mujoco"]
        budget = MUJOCO_STEPS if mujoco else preset.budget
        if args.quick:
            budget = min(budget, QUICK_CAP)
        target = None if mujoco else preset.solved
        for seed in seeds:  # interleaved, so load changes on the shared machine hit both learners alike
            for name in chosen:
                row = {"case": case, "learner": name, "seed": seed, "budget": budget, "target": target,
                       **learners[name](algo, env_id, seed, budget, target,
                                        Progress(f"{case} {name} seed {seed}", budget, time.perf_counter()),
                                        overrides)}
                runs.append(row)
                print(f"{case:<30} {name:<7} {seed:>4} {'yes' if row['solved'] else 'no':>6} {row['steps']:>10,} "
                      f"{row['wall_s']:>8.1f} {row['cpu_s']:>8.1f} {row['return']:>8.1f}", flush=True)
    summary: dict[str, Any] = {}
    for case in cases:
        summary[case] = {}
        for name in chosen:
            mine = [r for r in runs if r["case"] == case and r["learner"] == name]
            summary[case][name] = {"solved": f"{sum(r['solved'] for r in mine)}/{len(mine)}",
                                   "median_steps": statistics.median(r["steps"] for r in mine),
                                   "median_wall_s": round(statistics.median(r["wall_s"] for r in mine), 2),
                                   "median_cpu_s": round(statistics.median(r["cpu_s"] for r in mine), 2),
                                   "median_return": round(statistics.median(r["return"] for r in mine), 1)}
        if {"strata", "sb3"} <= set(chosen):
            ours, theirs = summary[case]["strata"], summary[case]["sb3"]
            summary[case]["wall_ratio_strata_over_sb3"] = round(ours["median_wall_s"] / theirs["median_wall_s"], 3)
            summary[case]["cpu_ratio_strata_over_sb3"] = round(ours["median_cpu_s"] / theirs["median_cpu_s"], 3)
            summary[case]["steps_ratio_strata_over_sb3"] = round(ours["median_steps"] / theirs["median_steps"], 3)
    print("medians per case:")
    for case, per in summary.items():
        print(f"  {case}: " + "; ".join(f"{k} {v}" for k, v in per.items()))
    # A run that ended no episode has a NaN return: null in the JSON line, which strict parsers accept.
    print(json.dumps(_nan_to_none({"benchmark": "presets", "quick": args.quick, "seeds": seeds, "set": overrides,
                                   "summary": summary, "runs": runs}), allow_nan=False))


def _same_kind(value: Any, like: Any) -> bool:
    """Whether a JSON `value` can stand for the config value `like` (an int for a float, a list for a tuple)."""
    if isinstance(like, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(like, bool)
    if isinstance(like, float):
        return isinstance(value, int | float)
    if isinstance(like, tuple):
        return isinstance(value, list) and len(value) > 0 and all(_same_kind(v, like[0]) for v in value)
    return isinstance(value, type(like))


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return value


if __name__ == "__main__":
    main()

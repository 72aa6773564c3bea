"""The rollout sources a training job can switch between, and the `RolloutSource` protocol they implement.

    VectorEnvSource   the learner's own policy steps a vector env: in-process (``sync``), the
                      shared-memory pool (``colocated``) or batched gRPC env services
                      (``decoupled``); every step crosses into the learner process
    FragmentFeed      env hosts act themselves with the current policy exported as a signed bundle
                      and return whole fragments: gRPC env services (``fragments``) or serverless
                      functions (``functions``); no per-step round trip remains

Both hand the learner the same thing: the parts of one update, ``[num_steps, num_envs]``
transitions in total, each part a `device.RolloutBatch` whose transitions carry
``(source, worker, seq)``. A feed issues exactly the fragments one update needs, so nothing is in
flight at an update boundary: that is what makes a switch lossless. Log-probs and values are
computed by the learner for every part, with the weights that acted (the version did not change
while the update's fragments were produced).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

from cloud._errors import CloudError
from device import RolloutBatch


class RolloutSource(Protocol):
    """What the switcher swaps: anything that fills one learner update with transitions."""

    mode: str
    """The mode this source implements."""

    def collect(self, *, policy_version: int, global_step: int) -> tuple[list[RolloutBatch], list[Any]]:
        """Return one update's transitions (acted by `policy_version`) and the episodes that ended in them.

        The transitions come as parts of equal length ``T`` whose env counts add up to the learner's.
        """
        ...

    def prepare(self) -> None:
        """Start what the source runs on (processes, services, a runtime) without producing anything."""
        ...

    def restart(self, *, incarnation: int) -> None:
        """Begin fresh episodes and fresh transition streams named ``{mode}:{incarnation}``."""
        ...

    def produced(self) -> int:
        """Transitions this source has handed out, over all incarnations."""
        ...

    def workers(self) -> int:
        """Active env workers, services or function instances."""
        ...

    def probe(self) -> float:
        """Measure this mode's env steps/s with a short run whose transitions reach no learner."""
        ...

    def close(self) -> None:
        """Stop everything the source started."""
        ...



class SourceError(CloudError):
    """A rollout source handed back data that does not fit the update (shape, version)."""


class FragmentProducer(Protocol):
    """What `FragmentFeed` drives: `cloud.FragmentSource` (gRPC) and the serverless rollout source."""

    def set_policy(self, bundle: bytes) -> int:
        """Act with this bundle from now on; return its version."""
        ...

    def fragments(self, count: int | None = None) -> Iterator[RolloutBatch]:
        """Yield `count` fragments."""
        ...

    def close(self) -> None:
        """Stop."""
        ...


class VectorEnvSource:
    """A vector env stepped by the learner's policy (see `cloud.rollout._collector.RolloutCollector`).

    Args:
        mode: Mode name; transition streams are named ``{mode}:{incarnation}``.
        make_envs: Builds the vector env (same-step autoreset), once.
        agent: The learner's agent (updated in place by the learner).
        normalizer: The learner's observation normaliser (updated in place).
        num_steps: Steps per env per update.
    """

    def __init__(self, mode: str, make_envs: Callable[[], Any], *, agent: Any, normalizer: Any, num_steps: int,
                 ) -> None:
        self.mode = mode
        self._make_envs = make_envs
        self._agent = agent
        self._normalizer = normalizer
        self._num_steps = num_steps
        self._envs: Any = None
        self._collector: Any = None
        self._produced = 0

    def prepare(self) -> None:
        """Build the vector env (start its workers or services)."""
        if self._envs is None:
            self._envs = self._make_envs()

    def restart(self, *, incarnation: int) -> None:
        """Reset every env: fresh episodes and fresh streams."""
        from cloud.rollout._collector import RolloutCollector

        self.prepare()
        self._collector = RolloutCollector(self._envs, num_steps=self._num_steps,
                                           source=f"{self.mode}:{incarnation}")

    def collect(self, *, policy_version: int, global_step: int) -> tuple[list[RolloutBatch], list[Any]]:
        """Step the envs for one update."""
        if self._collector is None:
            raise SourceError(f"{self.mode}: collect() before restart(); the switcher starts sources")
        batch, episodes = self._collector.collect(self._agent, self._normalizer, policy_version=policy_version,
                                                  global_step=global_step)
        self._produced += batch.size
        return [batch], episodes

    def produced(self) -> int:
        """Transitions stepped so far."""
        return self._produced

    def probe(self) -> float:
        """Env steps/s of random actions for one update's worth of steps (the next restart resets the envs)."""
        self.prepare()
        envs = self._envs
        envs.reset()
        started = time.perf_counter()
        for _ in range(self._num_steps):
            envs.step(envs.action_space.sample())
        return float(self._num_steps * envs.num_envs / max(time.perf_counter() - started, 1e-9))

    def workers(self) -> int:
        """Env workers (processes or services) behind the vector env, else its env count."""
        envs = self._envs
        if envs is None:
            return 0
        for name in ("num_workers", "num_services"):
            if hasattr(envs, name):
                return int(getattr(envs, name))
        return int(envs.num_envs)

    def close(self) -> None:
        """Close the vector env."""
        if self._envs is not None:
            self._envs.close()
            self._envs = None


class FragmentFeed:
    """Fragments from env hosts acting with the exported current policy.

    Args:
        mode: Mode name.
        make_producer: Builds the fragment producer, once.
        bundle_for: ``bundle_for(policy_version) -> signed bundle bytes`` of the learner's current policy.
        agent: The learner's agent, to compute log-probs and values of the fragments.
        normalizer: The learner's observation normaliser.
        num_envs: Env streams per update (the learner's ``num_envs``).
        num_steps: Steps per stream per update (the learner's ``num_steps``).
        envs_per_fragment: Env streams in one fragment.
        fragment_steps: Steps in one fragment, a multiple ``m`` of `num_steps`: a longer fragment is
            cut into ``m`` consecutive pieces, each bootstrapped from the first observation of the
            next, so hosts can run long stretches of few streams. ``num_envs`` must be a multiple of
            ``m * envs_per_fragment``.
        workers: How many hosts or function instances feed it (for status).
    """

    def __init__(self, mode: str, make_producer: Callable[[], FragmentProducer], *,
                 bundle_for: Callable[[int], bytes], agent: Any, normalizer: Any, num_envs: int, num_steps: int,
                 envs_per_fragment: int, fragment_steps: int | None = None,
                 workers: Callable[[], int] | None = None) -> None:
        fragment_steps = fragment_steps or num_steps
        if fragment_steps % num_steps:
            raise SourceError(f"{mode}: fragments of {fragment_steps} steps cannot be cut into updates of "
                              f"num_steps={num_steps}; make the fragment length a multiple of num_steps")
        columns = envs_per_fragment * (fragment_steps // num_steps)
        if num_envs % columns:
            raise SourceError(f"{mode}: num_envs={num_envs} is not a multiple of the {columns} env columns one "
                              f"fragment of [{fragment_steps}, {envs_per_fragment}] gives; adjust num_envs or the "
                              "fragment shape")
        self.mode = mode
        self._make_producer = make_producer
        self._bundle_for = bundle_for
        self._agent = agent
        self._normalizer = normalizer
        self._num_envs = num_envs
        self._num_steps = num_steps
        self._per_fragment = envs_per_fragment
        self._fragment_steps = fragment_steps
        self._wanted = num_envs // columns
        self._workers = workers
        self._producer: FragmentProducer | None = None
        self._policy_version: int | None = None
        self._bundle_version = 0
        self._produced = 0
        self._returns: dict[tuple[str, int], float] = defaultdict(float)
        self._lengths: dict[tuple[str, int], int] = defaultdict(int)

    def prepare(self) -> None:
        """Start the producer (env services, or the function runtime)."""
        if self._producer is None:
            self._producer = self._make_producer()

    def restart(self, *, incarnation: int) -> None:
        """Start the producer if needed and forget open episodes (the hosts keep their own streams)."""
        self.prepare()
        self._policy_version = None
        self._returns.clear()
        self._lengths.clear()
        # The serverless source carries episodes across invocations; the returns of those are forgotten
        # here, so it starts fresh ones too.
        self._forget_carried()

    def _forget_carried(self) -> None:
        forget = getattr(self._producer, "forget_episodes", None)
        if forget is not None:
            forget()

    def collect(self, *, policy_version: int, global_step: int) -> tuple[list[RolloutBatch], list[Any]]:
        """Publish the current policy if it changed, then gather exactly one update's fragments."""
        from cloud.rollout._collector import Episode

        if self._producer is None:
            raise SourceError(f"{self.mode}: collect() before restart(); the switcher starts sources")
        if self._policy_version != policy_version:
            self._bundle_version = self._producer.set_policy(self._bundle_for(policy_version))
            self._policy_version = policy_version
        parts: list[RolloutBatch] = []
        episodes: list[Any] = []
        step = global_step
        for whole in self._producer.fragments(self._wanted):
            if whole.num_steps != self._fragment_steps or whole.num_envs != self._per_fragment:
                raise SourceError(f"{self.mode}: a fragment of shape [T={whole.num_steps}, N={whole.num_envs}] "
                                  f"is not the configured [T={self._fragment_steps}, N={self._per_fragment}]")
            acted = np.unique(whole.policy_version)
            if acted.tolist() != [self._bundle_version]:
                raise SourceError(f"{self.mode}: a fragment was acted by versions {acted.tolist()}, not the current "
                                  f"bundle version {self._bundle_version}; the feed issues no work ahead of an update")
            episodes += self._episodes(whole, step, Episode)
            step += whole.size
            for fragment in _cut(whole, self._num_steps):
                parts.append(self._evaluated(fragment, policy_version))
        self._produced += sum(p.size for p in parts)
        return parts, episodes

    def _evaluated(self, fragment: RolloutBatch, policy_version: int) -> RolloutBatch:
        """`fragment` with the learner's log-probs and values, stamped with the learner's version.

        Arrays decoded from the wire are read-only views of the message; the learner gets its own copies.
        """
        import torch

        from cloud.rollout._collector import evaluate

        obs, actions = np.array(fragment.obs), np.array(fragment.actions)
        t, n = fragment.num_steps, fragment.num_envs
        with torch.inference_mode():
            b_obs = torch.from_numpy(self._normalizer(obs.reshape(t * n, *obs.shape[2:])))
            b_act = torch.from_numpy(actions.reshape(t * n, *actions.shape[2:]))
            logprobs, _, values = evaluate(self._agent, b_obs, b_act)
        return RolloutBatch(
            source=fragment.source, obs=obs, actions=actions, rewards=np.array(fragment.rewards),
            terminations=np.array(fragment.terminations), truncations=np.array(fragment.truncations),
            final_obs=np.array(fragment.final_obs), next_obs=np.array(fragment.next_obs),
            policy_version=np.full((t, n), policy_version, dtype=np.int64), worker=np.array(fragment.worker),
            seq=np.array(fragment.seq), logprobs=logprobs.numpy().reshape(t, n), values=values.numpy().reshape(t, n))

    def _episodes(self, fragment: RolloutBatch, step: int, episode: Any) -> list[Any]:
        ended = []
        done = np.logical_or(fragment.terminations, fragment.truncations)
        for j, w in enumerate(fragment.worker.tolist()):
            key = (fragment.source, int(w))
            for t in range(fragment.num_steps):
                self._returns[key] += float(fragment.rewards[t, j])
                self._lengths[key] += 1
                if done[t, j]:
                    ended.append(episode(step + (t + 1) * fragment.num_envs, self._returns[key], self._lengths[key]))
                    self._returns[key], self._lengths[key] = 0.0, 0
        return ended

    def produced(self) -> int:
        """Transitions received so far."""
        return self._produced

    def probe(self) -> float:
        """Env steps/s of one update's fragments, acted by the current policy and then discarded."""
        self.prepare()
        assert self._producer is not None
        if self._policy_version is None:
            return 0.0  # nothing to act with yet: the learner has not published a policy to these hosts
        started = time.perf_counter()
        steps = sum(f.size for f in self._producer.fragments(self._wanted))
        rate = steps / max(time.perf_counter() - started, 1e-9)
        # The probe's transitions are discarded: episodes carried through them must not continue into
        # training (the learner would see a stream jump ahead); the next fragments start fresh ones.
        self._forget_carried()
        return rate

    def workers(self) -> int:
        """Hosts or function instances feeding this source."""
        return self._workers() if self._workers is not None else 0

    def close(self) -> None:
        """Stop the producer."""
        if self._producer is not None:
            self._producer.close()
            self._producer = None


def _cut(batch: RolloutBatch, steps: int) -> list[RolloutBatch]:
    """Split `batch` along time into pieces of `steps`; each piece bootstraps from the next one's first obs."""
    if batch.num_steps == steps:
        return [batch]
    pieces = []
    for start in range(0, batch.num_steps, steps):
        end = start + steps
        window = slice(start, end)
        next_obs = batch.obs[end] if end < batch.num_steps else batch.next_obs
        pieces.append(RolloutBatch(
            source=batch.source, obs=batch.obs[window], actions=batch.actions[window], rewards=batch.rewards[window],
            terminations=batch.terminations[window], truncations=batch.truncations[window],
            final_obs=batch.final_obs[window], next_obs=next_obs, policy_version=batch.policy_version[window],
            worker=batch.worker, seq=batch.seq[window]))
    return pieces
